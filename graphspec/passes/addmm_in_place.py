"""Let an addmm write the tensor it adds into: aten.addmm(x, a, b) -> aten.addmm_(x, a, b) where x dies there.

Input:  an in-place graph (after defunctionalize_kv) with aten.addmm nodes, among them the residual adds of
        folded norms (models/decoder.add_linear: residual + o_proj(attention) as addmm(residual, a, W.t())).
Output: each addmm whose input x is an [M, N] tensor of the output's shape and dtype, made fresh by the graph
        (not a graph input, not a view of anything but itself; an earlier addmm_'s result is its input's memory),
        which nothing reads after the addmm (through x or any alias of the memory x views), becomes addmm_ on x;
        its users read x. Other addmms unchanged. Same results: addmm_ computes what addmm does, into x's memory.

    r2 = view(r, [M, N]); s = addmm(r2, a, t(w)); h = view(s, [B, T, N])
        ->  r2 = view(r, [M, N]); s = addmm_(r2, a, t(w)); h = view(s, [B, T, N])     (r read nowhere after)

Why: cuBLAS adds a product into its output with beta = 1 at no cost, but an out-of-place addmm first copies x
into its new output: a launch as long as graphspec::add_rms_norm's, which folding the norm removed. Written in
place, the o and down projections' residual adds are free (the down projection's adds into the o projection's
in-place result: one residual buffer per forward). An addmm whose input is read later (a residual a drafter
captures, a bias that is a weight) keeps its copy.
"""

from __future__ import annotations

import operator

import torch
import torch.fx as fx

from graphspec.config import PassContext, PassResult
from graphspec.op_nodes import is_alias, is_view, op_returns
from graphspec.passes.cleanup import tag, tidy

NAME = "addmm_in_place"

ADDMM = torch.ops.aten.addmm.default
ADDMM_ = torch.ops.aten.addmm_.default


def is_fresh(node: fx.Node) -> bool:
    """Whether the node's output is memory of its own: an op result that aliases none of the op's inputs."""
    if node.op != "call_function" or is_view(node):
        return False
    returns = op_returns(node)
    if not returns:
        return False
    index = node.args[1] if node.target is operator.getitem else 0
    return isinstance(index, int) and index < len(returns) and returns[index].alias_info is None


def aliases(base: fx.Node) -> list[fx.Node]:
    """base and every node whose output is its memory, through any chain of views and in-place writes."""
    found, frontier = [base], [base]
    while frontier:
        node = frontier.pop()
        for user in node.users:
            if is_alias(user) and user.args[0] is node and user not in found:
                found.append(user)
                frontier.append(user)
    return found


def can_write_in_place(addmm: fx.Node, order: dict[fx.Node, int]) -> bool:
    x = addmm.args[0]
    if not isinstance(x, fx.Node) or addmm.kwargs:
        return False
    x_val, out_val = x.meta.get("val"), addmm.meta.get("val")
    if not isinstance(x_val, torch.Tensor) or not isinstance(out_val, torch.Tensor):
        return False
    if x_val.shape != out_val.shape or x_val.dtype != out_val.dtype or not x_val.is_contiguous():
        return False
    base = x
    while is_alias(base):
        base = base.args[0]
    if not is_fresh(base):
        return False
    # Views only alias; every other user of the memory reads it (an in-place write reads what it adds into).
    readers = [user for node in aliases(base) for user in node.users if user is not addmm and not is_view(user)]
    return all(order[reader] < order[addmm] for reader in readers)


def run(gm: fx.GraphModule, ctx: PassContext) -> PassResult:
    graph = gm.graph
    addmms = list(graph.find_nodes(op="call_function", target=ADDMM))
    if not addmms:
        return PassResult(gm, changed=False, note="no addmm")
    order = {node: index for index, node in enumerate(graph.nodes)}
    written, kept = 0, 0
    for node in addmms:
        if not can_write_in_place(node, order):
            kept += 1
            continue
        with graph.inserting_before(node):
            in_place = graph.call_function(ADDMM_, node.args)
        in_place.meta = dict(node.meta)
        tag([in_place], NAME)
        order[in_place] = order[node]
        node.replace_all_uses_with(in_place)
        graph.erase_node(node)
        written += 1
    if not written:
        return PassResult(gm, changed=False, stats={"kept": kept}, note="every addmm's input is read later")
    tidy(gm, dead_code=False)
    return PassResult(gm, changed=True, stats={"in_place": written, "kept": kept})
