"""graphspec/op_nodes.py's aliasing questions (is_view, is_in_place, is_alias, op_returns) on a hand-built graph."""

from __future__ import annotations

import operator

import torch
from torch.fx.experimental.proxy_tensor import make_fx

from graphspec.op_nodes import VIEW_OPS, is_alias, is_in_place, is_view, op_returns


def program(x: torch.Tensor, a: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, ...]:
    view, transposed = x.view(-1), w.t()
    first, _ = torch.split(x, 2, dim=1)
    fresh = x + 1
    written = fresh.addmm_(a, transposed)  # writes fresh, returns it
    return view, first, written, torch.matmul(a.unsqueeze(0), transposed)  # mm, then _unsafe_view to [1, 3, 4]


def test_aliasing_of_each_node_follows_the_op_schema() -> None:
    gm = make_fx(program)(torch.randn(3, 4), torch.randn(3, 5), torch.randn(4, 5))
    kinds = {}
    for node in gm.graph.nodes:
        if node.op == "call_function":
            kinds.setdefault(node.target, set()).add((is_view(node), is_in_place(node), is_alias(node)))
    aten = torch.ops.aten
    assert kinds[aten.view.default] == kinds[aten.t.default] == {(True, False, True)}
    assert kinds[aten.split.Tensor] == {(True, False, True)}  # a list of views of x
    assert kinds[operator.getitem] == {(True, False, True)}  # an item of that list
    assert kinds[aten.addmm_.default] == {(False, True, True)}
    assert kinds[aten.add.Tensor] == kinds[aten.mm.default] == {(False, False, False)}
    # make_fx reshapes matmul's fresh mm result with _unsafe_view, whose schema declares no alias
    assert kinds[aten._unsafe_view.default] == {(True, False, True)}
    assert all(target in VIEW_OPS for target in (aten.view.default, aten.t.default, aten._unsafe_view.default))
    placeholder = next(iter(gm.graph.nodes))
    assert not is_view(placeholder) and not is_alias(placeholder) and op_returns(placeholder) is None
