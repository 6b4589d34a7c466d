"""Graph invariants, each a small named function. The pipeline runs the checks of the phase a pass
ends in when GRAPHSPEC_CHECK=1 (always in tests). See graphspec/INVARIANTS.md."""

from __future__ import annotations

import operator

import torch
import torch.fx as fx

from graphspec import trace
from graphspec.library import IN_PLACE  # functional state update -> in-place write (graphspec.ops)


def graph_lints(gm: fx.GraphModule) -> None:
    gm.graph.lint()


def outputs_are_named(gm: fx.GraphModule) -> None:
    output = gm.graph.find_nodes(op="output")[0]
    names = output.meta.get("gs_outputs")
    assert names is not None and len(names) == len(output.args[0]), "output node lost its gs_outputs names"


def outputs_are_verified(gm: fx.GraphModule) -> None:
    names = tuple(trace.output_nodes(gm))
    assert names == trace.verified_outputs(gm), f"step outputs {names} are not the verified outputs"


def no_functional_cache_updates(gm: fx.GraphModule) -> None:
    from graphspec.passes.defunctionalize_kv import count_cache_copies

    copies = count_cache_copies(gm)
    assert copies == 0, f"{copies} whole-cache copies (functional kv_update) remain after defunctionalize_kv"


def caches_are_inputs(gm: fx.GraphModule) -> None:
    """After defunctionalization every returned state (KV caches, drafter states) is its input buffer."""
    outputs = trace.output_nodes(gm)
    for name, node in trace.state_inputs(gm).items():
        assert outputs[name] is node, f"{name} output is not the mutated input buffer"


def no_host_sync_ops(gm: fx.GraphModule) -> None:
    """Ops that force a device->host sync (or data-dependent shapes) must not appear in a step."""
    forbidden = {torch.ops.aten._local_scalar_dense.default, torch.ops.aten.nonzero.default}
    bad = [n.name for n in gm.graph.nodes if n.op == "call_function" and n.target in forbidden]
    assert not bad, f"host-sync ops in the step graph: {bad}"


SELECT_OPS = (torch.ops.graphspec.select_update.default, torch.ops.graphspec.select_write.default)


def _writes(user: fx.Node, state: fx.Node) -> bool:
    """Whether op node `user` writes `state`: an in-place op mutating it, or a functional update of it."""
    if user.op != "call_function" or not isinstance(user.target, torch._ops.OpOverload):
        return False
    if user.target in IN_PLACE:  # a functional update: its state is argument 0
        return user.args[0] is state
    arguments = user.target._schema.arguments
    return any(
        argument.alias_info is not None and argument.alias_info.is_write and value is state
        for argument, value in zip(arguments, user.args, strict=False)
    )


def snapshot_states_selected_at_accept(gm: fx.GraphModule) -> None:
    """Each "snapshot" state (graphspec.state.ROLLBACKS) is written once per step, in the accept region,
    by the selection of each row's snapshot at the accepted count that commit advances the row by: no
    forward advances it, so a rejected draft leaves no trace in it."""
    commits = gm.graph.find_nodes(op="call_function", target=torch.ops.graphspec.commit.default)
    for name, node in trace.state_inputs(gm).items():
        if node.meta["gs_state"] != "snapshot":
            continue
        writers = [user for user in node.users if _writes(user, node)]
        assert len(writers) == 1 and writers[0].target in SELECT_OPS, (
            f"snapshot state {name} must be written only by one select_update/select_write, got {writers}"
        )
        select = writers[0]
        assert select.meta.get("gs_region") == "accept", f"{name}'s selection is not in the accept region"
        assert len(commits) == 1 and select.args[3] is commits[0].args[3], (
            f"{name} is not selected at the accepted count that commit uses"
        )


def step_ops(gm: fx.GraphModule) -> list[fx.Node]:
    """The step's op nodes in the order they run; a split graph's pieces are entered in call order
    (its top-level getitems only unpack piece outputs, they do no work)."""
    ops = []
    for node in gm.graph.nodes:
        if node.op == "call_module" and isinstance(piece := gm.get_submodule(node.target), fx.GraphModule):
            ops += step_ops(piece)
        elif node.op == "call_function":
            unpacks_piece = node.target is operator.getitem and node.args[0].op == "call_module"
            if not unpacks_piece:
                ops.append(node)
    return ops


def regions_run_in_order(gm: fx.GraphModule) -> None:
    """Every op carries meta["gs_region"], and the regions run as one contiguous run each, in
    trace.REGIONS order: region timing (runtime/region_timing.py) marks only their boundaries."""
    untagged = [node.name for node in step_ops(gm) if node.meta.get("gs_region") not in trace.REGIONS]
    assert not untagged, f"{len(untagged)} ops without a region (meta['gs_region']): {untagged[:8]}"
    runs: list[str] = []
    for node in step_ops(gm):
        if not runs or runs[-1] != node.meta["gs_region"]:
            runs.append(node.meta["gs_region"])
    assert tuple(runs) == trace.REGIONS, f"regions run as {runs}, expected one run each of {list(trace.REGIONS)}"


# What holds from defunctionalize_kv until split_attention cuts the graph into pieces.
_IN_PLACE = (
    graph_lints,
    outputs_are_verified,
    no_functional_cache_updates,
    caches_are_inputs,
    regions_run_in_order,
    snapshot_states_selected_at_accept,
)
_VERIFIED = (
    graph_lints,
    outputs_are_named,
    outputs_are_verified,
    no_host_sync_ops,
    regions_run_in_order,
    snapshot_states_selected_at_accept,
)

# Checks that hold after each phase of pipeline.PIPELINE, keyed by the pass that ends the phase.
PHASE_CHECKS = {
    "insert_verify": _VERIFIED,
    "mask_padding": _VERIFIED,
    "defunctionalize_kv": _IN_PLACE,
    "addmm_in_place": _IN_PLACE,
    "fuse_rotary_kv": _IN_PLACE,
    "fuse_kv_attention": _IN_PLACE,
    "fuse_qk_norm": _IN_PLACE,
    "fuse_row_scale": _IN_PLACE,
    "lower_kernels": _IN_PLACE,
    "split_attention": (graph_lints, regions_run_in_order),
}

# The prefill chunk program (pipeline.PREFILL_PIPELINE): no verify outputs, no regions.
_PREFILL_IN_PLACE = (graph_lints, outputs_are_named, no_functional_cache_updates, caches_are_inputs, no_host_sync_ops)
PREFILL_PHASE_CHECKS = {
    "defunctionalize_kv": _PREFILL_IN_PLACE,
    "addmm_in_place": _PREFILL_IN_PLACE,
    "fuse_prefill_attention": _PREFILL_IN_PLACE,
    "lower_kernels": _PREFILL_IN_PLACE,
}
