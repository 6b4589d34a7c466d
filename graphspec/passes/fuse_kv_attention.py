"""Fuse each layer's rotary_kv_write into the attention that reads its rotated q: one op, one launch.

Input:  an in-place graph (after fuse_rotary_kv) in which q_rot = graphspec::rotary_kv_write(q, k, v, cos,
        sin, cache, layer, slot_ids, start_pos) is read only by graphspec::attention(q_rot, cache, layer,
        slot_ids, start_pos, scale), or graphspec::block_attention (DFlash's block), of the same cache,
        layer, slots and start positions.
Output: each such pair is one graphspec::rotary_kv_attention(q, k, v, cos, sin, cache, layer, slot_ids,
        start_pos, scale) at the attention's position, in its region (with causal=False for a
        block_attention); other pairs stay as they were.
        Same results bit for bit (graphspec/INVARIANTS.md): the op's reference is the pair, and its
        kernel takes the same key blocks in the same order as the two launches it replaces.

    q_rot = rotary_kv_write(q, k, v, cos, sin, cache, 1, slots, start)   becomes   out = rotary_kv_attention(
    out = attention(q_rot, cache, 1, slots, start, 0.125)                            q, k, v, cos, sin, cache,
                                                                                     1, slots, start, 0.125)

Why: at decode sizes the rotary and KV write are a few kilobytes of work, but a launch of their own
(about 2 us plus the gap between kernels on an H200, once per layer and forward); the attention kernel
already loads the step's q and the blocks that hold the step's keys, so it does that work in registers.
"""

from __future__ import annotations

import torch.fx as fx

from graphspec import ops
from graphspec.config import PassContext, PassResult
from graphspec.op_nodes import positional_args
from graphspec.passes.cleanup import may_mutate, nodes_between, region_for, tag, tidy

NAME = "fuse_kv_attention"

ROTARY_KV_WRITE = ops.rotary_kv_write
ATTENTION = ops.attention
BLOCK_ATTENTION = ops.block_attention
FUSED = ops.rotary_kv_attention


def fusable(write: fx.Node, attention: fx.Node) -> bool:
    """Whether the write can move down to the attention's position inside one fused op."""
    cache, layer, slot_ids, start_pos = positional_args(write)[5:9]
    q_rot, a_cache, a_layer, a_slots, a_start, _ = positional_args(attention)
    if q_rot is not write or (a_cache, a_layer, a_slots, a_start) != (cache, layer, slot_ids, start_pos):
        return False
    # Between the two, nothing may read the cache (it would miss the write, now later) or write
    # anything (the write's inputs, or the cache behind our back).
    return not any(may_mutate(node) or cache in node.all_input_nodes for node in nodes_between(write, attention))


def run(gm: fx.GraphModule, ctx: PassContext) -> PassResult:
    graph = gm.graph
    fused, kept = 0, 0
    for write in list(graph.find_nodes(op="call_function", target=ROTARY_KV_WRITE)):
        users = list(write.users)
        if len(users) != 1 or users[0].target not in (ATTENTION, BLOCK_ATTENTION):
            continue  # the rotated q goes elsewhere (or nowhere): not the pattern
        attention = users[0]
        if not fusable(write, attention):
            kept += 1
            continue
        *write_args, q_norm, k_norm, norm_eps = positional_args(write)
        args = (*write_args, positional_args(attention)[5])  # and the attention's scale
        norms = (q_norm, k_norm, norm_eps)  # the write's, if folded already: they move along
        if attention.target is BLOCK_ATTENTION:
            args += (*norms, False)  # causal=False
        elif q_norm is not None or k_norm is not None:
            args += norms
        with graph.inserting_before(attention):
            node = graph.call_function(FUSED, args)
        tag([node], NAME, region_for(attention))
        node.meta["val"] = attention.meta.get("val")
        attention.replace_all_uses_with(node)
        graph.erase_node(attention)
        graph.erase_node(write)
        fused += 1
    stats = {"fused": fused, "kept": kept}
    if not fused:
        return PassResult(gm, changed=False, stats=stats, note="no rotary_kv_write -> attention pair to fuse")
    # No dead-code elimination: in place from here on (passes/cleanup.py).
    tidy(gm, dead_code=False)
    return PassResult(gm, changed=True, stats=stats)
