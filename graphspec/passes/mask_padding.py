"""Keep rows that exist only because of bucket padding (or that already stopped) out of the KV
cache and the outputs.

Input:  a graph with a `row_valid` input and outputs named trace.ROW_OUTPUTS (then the states).
Output: every per-row input is replaced by a safe value on invalid rows before anything reads it
        (so garbage ids, positions or lengths can never index out of bounds), invalid rows write
        only to the spare cache slot, and every per-row output keeps the row's previous state
        (or a neutral value) on invalid rows.

    slot_ids -> kv_update(slot_ids)          becomes   where(row_valid, slot_ids, SPARE) -> kv_update
    commit -> next_committed_len             becomes   where(row_valid, commit, committed_len)
"""

from __future__ import annotations

import torch
import torch.fx as fx

from graphspec import trace
from graphspec.config import PassContext, PassResult
from graphspec.passes.cleanup import region_for, tag, tidy

NAME = "mask_padding"

SPARE_SLOT = "spare_slot"
# Per-row input -> the value invalid rows see instead. committed_len 2 keeps every position the
# step computes (L-2 .. L-1+K) inside the cache.
SAFE_INPUTS = {
    "slot_ids": SPARE_SLOT,
    "committed_len": 2,
    "last_tokens": 0,
    "temperature": 0.0,
    "top_k": 0,
    "top_p": 1.0,
    "seed": 0,
    "step_counter": 0,
}
# Per-row output -> what invalid rows return: a constant, or the (unmasked) input of that name, so
# a stopped row's state is carried through unchanged.
MASKED_OUTPUTS = {
    "tokens": -1,
    "num_accepted": 0,
    "next_committed_len": "committed_len",
    "next_last_tokens": "last_tokens",
    "next_step_counter": "step_counter",
}


def _where_valid(graph: fx.Graph, valid: fx.Node, value: fx.Node, fallback: object, ndim: int) -> list[fx.Node]:
    """Nodes computing where(row_valid, value, fallback), row_valid broadcast over trailing dims."""
    batch = valid.meta["val"].shape[0]
    created = []
    condition = valid
    if ndim > 1:
        condition = graph.call_function(torch.ops.aten.view.default, (valid, [batch] + [1] * (ndim - 1)))
        created.append(condition)
    if isinstance(fallback, fx.Node):
        created.append(graph.call_function(torch.ops.aten.where.self, (condition, value, fallback)))
    else:
        created.append(graph.call_function(torch.ops.aten.where.ScalarOther, (condition, value, fallback)))
    return created


def run(gm: fx.GraphModule, ctx: PassContext) -> PassResult:
    inputs = trace.placeholders_by_input(gm)
    if "row_valid" not in inputs:
        return PassResult(gm, changed=False, note="graph has no row_valid input")
    outputs = trace.output_nodes(gm)
    if any(node.meta.get("gs_pass") == NAME for node in gm.graph.nodes):
        return PassResult(gm, changed=False, note="already masked")
    graph, valid = gm.graph, inputs["row_valid"]
    spare = ctx.scratch_slot if ctx.scratch_slot >= 0 else inputs["target_cache"].meta["val"].shape[2] - 1
    created: list[fx.Node] = []

    # Outputs first, so their fallbacks refer to the raw inputs, before those get replaced below.
    masked_outputs = dict(outputs)
    masked = 0
    output = graph.find_nodes(op="output")[0]
    last_region = region_for(output)  # the masks run after the last op: the "accept" region
    with graph.inserting_before(output):
        for name, fallback in MASKED_OUTPUTS.items():
            if name not in outputs:
                continue
            fallback = inputs[fallback] if isinstance(fallback, str) else fallback
            nodes = _where_valid(graph, valid, outputs[name], fallback, outputs[name].meta["val"].dim())
            created += nodes
            masked_outputs[name] = nodes[-1]
            masked += 1
    tag(created, NAME, last_region)
    trace.set_outputs(gm, masked_outputs)
    passthrough = set(created)

    first_user = next(node for node in graph.nodes if node.op != "placeholder")
    # Sanitizers run first, before the first draft forward, so they are timed as part of its region.
    region = region_for(first_user)
    sanitized = 0
    for name, safe in SAFE_INPUTS.items():
        if name not in inputs:
            continue
        raw = inputs[name]
        with graph.inserting_before(first_user):
            nodes = _where_valid(graph, valid, raw, spare if safe == SPARE_SLOT else safe, raw.meta["val"].dim())
        tag(nodes, NAME, region)
        # Everything reads the sanitized value except the masked outputs' fallbacks.
        raw.replace_all_uses_with(nodes[-1], delete_user_cb=lambda user, own=set(nodes): user not in own | passthrough)
        sanitized += 1
    tidy(gm)
    return PassResult(
        gm, changed=True, stats={"sanitized_inputs": sanitized, "masked_outputs": masked, "spare_slot": spare}
    )
