"""Move a folded input norm's row scale into the rotary_kv_attention that reads its q, k and v: one launch fewer
per layer and forward.

Input:  an in-place graph (after fuse_qk_norm) in which graphspec::row_scale(x, src, eps) (models/fold_norms.py:
        the q/k/v projection x of the un-normalized rows src) is read only through views (split, its items,
        view, transpose) that end in one graphspec::rotary_kv_attention as its q, k and v, which has no row_src
        yet, and nothing between the two may write memory.
Output: the views read x instead, the op takes row_src=src and row_eps=eps, and the row_scale node is gone.
        Other ops unchanged. Same results: the op's reference scales q, k and v by the same row scale first,
        elementwise with the same rounding, which a split, view or transpose does not move.

    s = row_scale(qkv, h, 1e-05); q, k, v = split(s, ...)        q, k, v = split(qkv, ...)
    rotary_kv_attention(t(q), t(k), t(v), ...)              ->   rotary_kv_attention(t(q), t(k), t(v), ..., h, 1e-05)

Why: with the input norm's weight folded into q/k/v (the residual projected as it is), the norm's launch before
the projection is gone, and the row scale has to be applied before the rotation, Qwen3's per-head norms and the
cache write, all of which the attention kernel does in registers as it loads q, k and v. Left alone (no such
attention reads the projection), row_scale stays as its reference op.
"""

from __future__ import annotations

import torch.fx as fx

from graphspec import ops
from graphspec.config import PassContext, PassResult
from graphspec.op_nodes import is_view, positional_args
from graphspec.passes.cleanup import may_mutate, nodes_between, tag, tidy

NAME = "fuse_row_scale"

ROW_SCALE = ops.row_scale
ATTENTION = ops.rotary_kv_attention
QKV = (0, 1, 2)  # the attention op's q, k and v arguments
ROW_SRC = 14  # the attention op's row_src argument (row_eps follows)


def reader(scale: fx.Node) -> fx.Node | None:
    """The one rotary_kv_attention that reads `scale` through views only, as q, k and v and nothing else; else
    None."""
    readers: set[fx.Node] = set()
    frontier = [scale]
    while frontier:
        node = frontier.pop()
        for user in node.users:
            if user.target is ATTENTION:
                readers.add(user)
            elif is_view(user) and user.args[0] is node:
                frontier.append(user)
            else:
                return None
    if len(readers) != 1:
        return None
    (op,) = readers
    args = positional_args(op)
    qkv_views = all(is_view_of(args[position], scale) for position in QKV)
    read_elsewhere = any(is_view_of(arg, scale) for position, arg in enumerate(args) if position not in QKV)
    return op if qkv_views and not read_elsewhere and args[ROW_SRC] is None else None


def is_view_of(arg: object, base: fx.Node) -> bool:
    """Whether arg is base or a chain of views of it."""
    while isinstance(arg, fx.Node):
        if arg is base:
            return True
        if not is_view(arg):
            return False
        arg = arg.args[0]
    return False


def run(gm: fx.GraphModule, ctx: PassContext) -> PassResult:
    graph = gm.graph
    fused, kept = 0, 0
    for scale in list(graph.find_nodes(op="call_function", target=ROW_SCALE)):
        op = reader(scale)
        # The op reads x and src later than row_scale did: nothing in between may write memory.
        if op is None or any(may_mutate(node) for node in nodes_between(scale, op)):
            kept += 1
            continue
        x, src, eps = positional_args(scale)
        scale.replace_all_uses_with(x)
        args = positional_args(op)
        op.args = (*args[:ROW_SRC], src, eps, *args[ROW_SRC + 2 :])
        op.kwargs = {}
        tag([op, *(user for user in x.users if is_view(user))], NAME)
        graph.erase_node(scale)
        fused += 1
    stats = {"fused": fused, "kept": kept}
    if not fused:
        return PassResult(gm, changed=False, stats=stats, note="no row_scale read by a rotary_kv_attention alone")
    tidy(gm, dead_code=False)  # in place from here on (passes/cleanup.py)
    return PassResult(gm, changed=True, stats=stats)
