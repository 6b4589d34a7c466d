"""Fuse each layer's rotary with the in-place KV write of its rotated k: one op, one kernel launch.

Input:  an in-place graph (after defunctionalize_kv) in which graphspec::rotary(q, k, cos, sin) ->
        (q_rot, k_rot) is followed by graphspec::kv_write(cache, layer, slot_ids, start_pos, k_rot, v).
Output: each such pair whose k_rot feeds nothing but that kv_write, and whose q_rot is read only after
        it, is one graphspec::rotary_kv_write(q, k, v, cos, sin, cache, layer, slot_ids, start_pos) -> q_rot
        at the kv_write's position, in its region. Same results bit for bit (graphspec/INVARIANTS.md).

    qk = rotary(q, k, cos, sin); q_rot, k_rot = qk[0], qk[1]
    kv_write(cache, 1, slots, start, k_rot, v)           becomes   q_rot = rotary_kv_write(q, k, v, cos, sin,
    attention(q_rot, cache, 1, slots, start, scale)                                        cache, 1, slots, start)
                                                                   attention(q_rot, cache, 1, slots, start, scale)
"""

from __future__ import annotations

import operator

import torch.fx as fx

from graphspec import ops
from graphspec.config import PassContext, PassResult
from graphspec.op_nodes import positional_args
from graphspec.passes.cleanup import may_mutate, nodes_between, region_for, tag, tidy

NAME = "fuse_rotary_kv"

ROTARY = ops.rotary
KV_WRITE = ops.kv_write
FUSED = ops.rotary_kv_write
K_ARG = 4  # kv_write(cache, layer, slot_ids, start_pos, k, v)


def rotary_outputs(rotary: fx.Node) -> dict[int, fx.Node] | None:
    """Output index -> getitem node of a rotary node; None when anything but one getitem per output
    reads its result tuple (then there is no single q_rot node to hand over to the fused op)."""
    outputs: dict[int, fx.Node] = {}
    for user in rotary.users:
        if user.target is not operator.getitem or user.args[1] in outputs:
            return None
        outputs[user.args[1]] = user
    return outputs


def fusable(rotary: fx.Node, write: fx.Node, write_args: tuple, order: dict[fx.Node, int]) -> bool:
    """Whether replacing rotary + write by one op at the write's position computes the same thing."""
    outputs = rotary_outputs(rotary)
    if outputs is None:
        return False
    k_rot, q_rot = outputs[1], outputs.get(0)
    # k_rot must die with the write: the fused op keeps the rotated k only in the cache.
    if list(k_rot.users) != [write] or sum(arg is k_rot for arg in write_args) != 1:
        return False
    # The fused op stands where the write stood, so it must still come before every reader of q_rot.
    if q_rot is not None and any(order[user] <= order[write] for user in q_rot.users):
        return False
    # The rotation moves from the rotary's position to the write's: nothing in between may change
    # what it reads (in a decoder only getitems and mask_padding's pure sanitizers sit there).
    return not any(may_mutate(node) for node in nodes_between(rotary, write))


def run(gm: fx.GraphModule, ctx: PassContext) -> PassResult:
    graph = gm.graph
    order = {node: index for index, node in enumerate(graph.nodes)}
    fused, kept = 0, 0
    for write in list(graph.find_nodes(op="call_function", target=KV_WRITE)):
        write_args = positional_args(write)
        k_rot = write_args[K_ARG]
        rotary = k_rot.args[0] if isinstance(k_rot, fx.Node) and k_rot.target is operator.getitem else None
        if not isinstance(rotary, fx.Node) or rotary.target is not ROTARY or k_rot.args[1] != 1:
            continue  # this write's k is not a rotary's rotated k: not the pattern
        if not fusable(rotary, write, write_args, order):
            kept += 1
            continue
        q, k, cos, sin = positional_args(rotary)
        cache, layer, slot_ids, start_pos, _, v = write_args
        with graph.inserting_before(write):
            node = graph.call_function(FUSED, (q, k, v, cos, sin, cache, layer, slot_ids, start_pos))
        tag([node], NAME, region_for(write))  # the region of the write it replaces
        order[node] = order[write]
        q_rot = rotary_outputs(rotary).get(0)
        if q_rot is not None:
            q_rot.replace_all_uses_with(node)
            graph.erase_node(q_rot)
        for dead in (write, k_rot, rotary):
            graph.erase_node(dead)
        fused += 1
    stats = {"fused": fused, "kept": kept}
    if not fused:
        return PassResult(gm, changed=False, stats=stats, note="no rotary -> kv_write pair to fuse")
    # No dead-code elimination: the fused ops and the remaining kv_writes only mutate the cache.
    tidy(gm, dead_code=False)
    return PassResult(gm, changed=True, stats=stats)
