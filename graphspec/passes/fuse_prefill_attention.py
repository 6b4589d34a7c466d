"""Fuse a prefill chunk's in-place KV write with the attention that reads it: one graphspec::prefill_attention.

Input:  an in-place prefill program (after defunctionalize_kv) in which graphspec::kv_write(cache, layer,
        slot_ids, start_pos, k, v) is followed by graphspec::attention(q, cache, layer, slot_ids,
        start_pos, scale) of the same cache, layer, slots and start positions.
Output: each such pair with nothing in between that writes anything or reads the cache is one
        graphspec::prefill_attention(q, k, v, cache, layer, slot_ids, start_pos, scale) at the
        attention's position (the same result: the op's reference is exactly the pair). Its kernel
        takes the chunk's keys from k/v and only the prefix from the cache, and skips the key blocks
        the causal mask hides; the decode attention kernel would score every query against every key.

    kv_write(cache, 0, slots, start, k, v)               becomes
    out = attention(q, cache, 0, slots, start, scale)    out = prefill_attention(q, k, v, cache, 0, slots, start, s)

Only in pipeline.PREFILL_PIPELINE: the step keeps fuse_rotary_kv / fuse_kv_attention, whose kernel is
the one for K+1 queries per row. With ctx.numerics == "invariant" nothing is fused: the pair then lowers to
kv_write and the decode attention kernel's invariant row, so every prompt position gets the bits a decode
or verify forward gives it (a draft model's first catch-up forward recomputes the last prompt position,
which the target has from prefill); the prefill kernel's tiling would round differently.
"""

from __future__ import annotations

import torch.fx as fx

from graphspec import ops
from graphspec.config import PassContext, PassResult
from graphspec.op_nodes import positional_args
from graphspec.passes.cleanup import may_mutate, nodes_between, region_for, tag, tidy

NAME = "fuse_prefill_attention"

KV_WRITE = ops.kv_write
ATTENTION = ops.attention
FUSED = ops.prefill_attention


def attention_of(write: fx.Node) -> fx.Node | None:
    """The attention that reads what `write` wrote: the next reader of its cache after it, when that
    reader is an attention of the same layer, slots and start positions; else None."""
    cache, layer, slot_ids, start_pos, _, _ = positional_args(write)
    node = write.next
    while node.op != "output":
        if cache in node.all_input_nodes:
            if node.target is not ATTENTION:
                return None
            _, a_cache, a_layer, a_slots, a_start, _ = positional_args(node)
            same = a_cache is cache and a_layer == layer and a_slots is slot_ids and a_start is start_pos
            return node if same else None
        node = node.next
    return None


def run(gm: fx.GraphModule, ctx: PassContext) -> PassResult:
    if ctx.numerics == "invariant":
        return PassResult(gm, changed=False, note="numerics=invariant: kv_write + attention stay apart")
    graph = gm.graph
    fused, kept = 0, 0
    for write in list(graph.find_nodes(op="call_function", target=KV_WRITE)):
        attention = attention_of(write)
        # The write moves down to the attention: nothing in between may write anything (it might be
        # what the fused op reads, or write the cache itself).
        if attention is None or any(may_mutate(node) for node in nodes_between(write, attention)):
            kept += 1
            continue
        cache, layer, slot_ids, start_pos, k, v = positional_args(write)
        q, _, _, _, _, scale = positional_args(attention)
        with graph.inserting_before(attention):
            node = graph.call_function(FUSED, (q, k, v, cache, layer, slot_ids, start_pos, scale))
        tag([node], NAME, region_for(attention))
        attention.replace_all_uses_with(node)
        graph.erase_node(attention)
        graph.erase_node(write)
        fused += 1
    stats = {"fused": fused, "kept": kept}
    if not fused:
        return PassResult(gm, changed=False, stats=stats, note="no kv_write -> attention pair to fuse")
    tidy(gm, dead_code=False)  # in-place writes look dead to DCE
    return PassResult(gm, changed=True, stats=stats)
