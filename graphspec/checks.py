"""Graph invariants, each a small named function. The pipeline runs the checks of the phase a pass
ends in when GRAPHSPEC_CHECK=1 (always in tests). See graphspec/INVARIANTS.md."""

from __future__ import annotations

import torch
import torch.fx as fx

from graphspec import trace


def graph_lints(gm: fx.GraphModule) -> None:
    gm.graph.lint()


def outputs_are_named(gm: fx.GraphModule) -> None:
    output = gm.graph.find_nodes(op="output")[0]
    names = output.meta.get("gs_outputs")
    assert names is not None and len(names) == len(output.args[0]), "output node lost its gs_outputs names"


def outputs_are_verified(gm: fx.GraphModule) -> None:
    assert tuple(trace.output_nodes(gm)) == trace.VERIFIED_OUTPUTS, "step outputs are not the verified outputs"


def no_functional_cache_updates(gm: fx.GraphModule) -> None:
    from graphspec.passes.defunctionalize_kv import count_cache_copies

    copies = count_cache_copies(gm)
    assert copies == 0, f"{copies} whole-cache copies (functional kv_update) remain after defunctionalize_kv"


def caches_are_inputs(gm: fx.GraphModule) -> None:
    """After defunctionalization the returned caches are the input buffers themselves."""
    outputs, inputs = trace.output_nodes(gm), trace.placeholders_by_input(gm)
    for name in ("target_cache", "draft_cache"):
        assert outputs[name] is inputs[name], f"{name} output is not the mutated input buffer"


def no_host_sync_ops(gm: fx.GraphModule) -> None:
    """Ops that force a device->host sync (or data-dependent shapes) must not appear in a step."""
    forbidden = {torch.ops.aten._local_scalar_dense.default, torch.ops.aten.nonzero.default}
    bad = [n.name for n in gm.graph.nodes if n.op == "call_function" and n.target in forbidden]
    assert not bad, f"host-sync ops in the step graph: {bad}"


# Checks that hold after each phase of pipeline.PIPELINE, keyed by the pass that ends the phase.
PHASE_CHECKS = {
    "insert_verify": (graph_lints, outputs_are_named, outputs_are_verified, no_host_sync_ops),
    "mask_padding": (graph_lints, outputs_are_named, outputs_are_verified, no_host_sync_ops),
    "defunctionalize_kv": (graph_lints, outputs_are_verified, no_functional_cache_updates, caches_are_inputs),
    "lower_kernels": (graph_lints, outputs_are_verified, no_functional_cache_updates, caches_are_inputs),
    "split_attention": (graph_lints,),
}
