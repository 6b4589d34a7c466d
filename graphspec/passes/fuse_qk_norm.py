"""Fold per-head q/k norms (Qwen3) into the rotary_kv_attention or rotary_kv_write that reads them: one or
two launches fewer per layer.

Input:  an in-place graph (after fuse_kv_attention) in which a graphspec::rotary_kv_attention or
        rotary_kv_write without norms takes q = transpose(graphspec::rms_norm(xq, wq, eps), 1, 2) and
        k = transpose(rms_norm(xk, wk, eps), 1, 2), each rms_norm read only by its transpose and each
        transpose only by the op. q and k may be the same node (DFlash's context rows: only k matters,
        the op rotates it as q too, and the norm is folded once).
Output: the op takes transpose(xq, 1, 2) and transpose(xk, 1, 2) (the same transpose nodes, re-pointed)
        and q_norm=wq, k_norm=wk, norm_eps=eps; the rms_norm nodes are gone. Other ops unchanged.
        Same results: the op's reference applies rms_norm first, over the head dim, which the
        transpose (of dims 1 and 2) does not move.

    qn = rms_norm(q, wq, 1e-06); q_t = transpose(qn, 1, 2)       q_t = transpose(q, 1, 2)
    kn = rms_norm(k, wk, 1e-06); k_t = transpose(kn, 1, 2)  ->   k_t = transpose(k, 1, 2)
    rotary_kv_attention(q_t, k_t, v_t, ...)                      rotary_kv_attention(q_t, k_t, v_t, ..., wq, wk, 1e-06)

Why: Qwen3 normalizes each q and k head before the rotation: two launches per layer and forward that
each read a few kilobytes (597 of the 2019 launches of a Qwen3-8B/0.6B step were norms); the attention
kernel holds every q head row and the step's k rows in registers anyway. A DFlash drafter's context
rows (Qwen3-shaped layers) norm their k before a rotary_kv_write: one launch per drafter layer.
"""

from __future__ import annotations

import torch
import torch.fx as fx

from graphspec import ops
from graphspec.config import PassContext, PassResult
from graphspec.op_nodes import positional_args
from graphspec.passes.cleanup import may_mutate, nodes_between, tag, tidy

NAME = "fuse_qk_norm"

# Op -> the position of its q_norm argument (k_norm and norm_eps follow).
FOLDS = {ops.rotary_kv_attention: 10, ops.rotary_kv_write: 9}
RMS_NORM = ops.rms_norm
TRANSPOSE = torch.ops.aten.transpose.int


def normed_input(arg: object, op: fx.Node) -> tuple[fx.Node, fx.Node, fx.Node, float] | None:
    """(transpose, rms_norm, its input, eps) when arg = transpose(rms_norm(x, w, eps), 1, 2) and both
    nodes feed only the next one; else None."""
    if not isinstance(arg, fx.Node) or arg.target is not TRANSPOSE or list(arg.users) != [op]:
        return None
    norm, *dims = arg.args
    if sorted(dims) != [1, 2] or not isinstance(norm, fx.Node) or norm.target is not RMS_NORM:
        return None
    if list(norm.users) != [arg]:
        return None
    x, _, eps = positional_args(norm)
    return arg, norm, x, eps


def run(gm: fx.GraphModule, ctx: PassContext) -> PassResult:
    graph = gm.graph
    folded, kept = 0, 0
    for target, first in FOLDS.items():
        for op in list(graph.find_nodes(op="call_function", target=target)):
            args = positional_args(op)
            if args[first] is not None or args[first + 1] is not None:
                continue  # norms already folded
            q, k = normed_input(args[0], op), normed_input(args[1], op)
            if q is None and k is None:
                continue  # no per-head norms: not the pattern
            # The norms move down to the op: nothing in between may write what they read.
            moved = [node for match in (q, k) if match for node in nodes_between(match[1], op)]
            if q is None or k is None or q[3] != k[3] or any(may_mutate(node) for node in moved):
                kept += 1
                continue
            norms = {q[1]: q[2], k[1]: k[2]}  # one entry when q and k are the same normed node
            for transpose in dict.fromkeys((q[0], k[0])):  # once when q and k are one node
                transpose.replace_input_with(transpose.args[0], norms[transpose.args[0]])
                tag([transpose], NAME)
            # The node's own arguments past the norms (causal, when given) stay as they are.
            weights = (positional_args(q[1])[1], positional_args(k[1])[1], q[3])
            op.args = (*args[:first], *weights, *op.args[first + 3 :])
            op.kwargs = {}
            tag([op], NAME)
            for norm in norms:
                graph.erase_node(norm)
            folded += 1
    stats = {"folded": folded, "kept": kept}
    if not folded:
        return PassResult(gm, changed=False, stats=stats, note="no per-head q/k norm before a rotary op")
    tidy(gm, dead_code=False)  # in place from here on (passes/cleanup.py)
    return PassResult(gm, changed=True, stats=stats)
