"""addmm_in_place: an addmm whose added input dies there writes it in place; one whose input is read later, is a
graph input, or views memory it does not own keeps its copy. Hand-built graphs, then the real folded step."""

from __future__ import annotations

import operator

import pytest
import torch
import torch.fx as fx
from torch.fx.passes.fake_tensor_prop import FakeTensorProp

from graphspec import ops
from graphspec.config import PassContext
from graphspec.passes import addmm_in_place
from tests.step_case import StepCase

CTX = PassContext(k=2, batch=2, mode="greedy", sm=None)
ADDMM, ADDMM_ = addmm_in_place.ADDMM, addmm_in_place.ADDMM_
VIEW = torch.ops.aten.view.default


def residual_graph(read_after: bool = False, residual_is_input: bool = False, unsafe_view: bool = False):
    """x [2, 3, 8] -> residual = add_rms_norm(x, x, w)[1] (or the input x itself) -> addmm(view(residual), a, wt)
    -> view back; read_after: the old residual is an output too; unsafe_view: the addmm adds into an _unsafe_view
    of the residual (make_fx's reshape of a fresh result: a view its schema does not declare), which is read
    after."""
    graph = fx.Graph()
    x, a, w, wt = (graph.placeholder(name) for name in ("x", "a", "w", "wt"))
    if residual_is_input:
        residual = x
    else:
        pair = graph.call_function(ops.OPS["add_rms_norm"], (x, x, w, 1e-5))
        residual = graph.call_function(operator.getitem, (pair, 1))
    base = graph.call_function(torch.ops.aten._unsafe_view.default, (residual, [2, 3, 8])) if unsafe_view else residual
    flat = graph.call_function(VIEW, (base, [6, 8]))
    added = graph.call_function(ADDMM, (flat, a, wt))
    out = graph.call_function(VIEW, (added, [2, 3, 8]))
    graph.output((out, residual) if read_after or unsafe_view else (out,))
    gm = fx.GraphModule(torch.nn.Module(), graph)
    FakeTensorProp(gm).propagate(*inputs())
    return gm


def inputs() -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(0)
    return (
        torch.randn(2, 3, 8, generator=g),
        torch.randn(6, 5, generator=g),
        torch.ones(8),
        torch.randn(5, 8, generator=g),
    )


def targets(gm: fx.GraphModule) -> list:
    return [node.target for node in gm.graph.nodes if node.op == "call_function" and node.target in (ADDMM, ADDMM_)]


def test_an_addmm_whose_input_dies_writes_it_in_place_and_computes_the_same() -> None:
    expected = residual_graph()(*inputs())[0]
    result = addmm_in_place.run(residual_graph(), CTX)
    assert result.changed and result.stats == {"in_place": 1, "kept": 0} and targets(result.gm) == [ADDMM_]
    assert all(n.meta["gs_pass"] == addmm_in_place.NAME for n in result.gm.graph.nodes if n.target is ADDMM_)
    torch.testing.assert_close(result.gm(*inputs())[0], expected, rtol=0, atol=0)


@pytest.mark.parametrize(
    "kind", ["read_after", "residual_is_input", "unsafe_view"], ids=["read later", "graph input", "undeclared view"]
)
def test_an_addmm_whose_input_lives_on_keeps_its_copy(kind: str) -> None:
    gm = residual_graph(**{kind: True})
    expected = gm(*inputs())
    result = addmm_in_place.run(gm, CTX)
    assert not result.changed and result.stats == {"kept": 1} and targets(result.gm) == [ADDMM]
    for got, want in zip(result.gm(*inputs()), expected, strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_a_late_reader_through_another_view_keeps_the_copy() -> None:
    """The old residual read after the addmm through a view of its own (not the addmm's) still counts."""
    gm = residual_graph()
    graph = gm.graph
    residual = next(n for n in graph.nodes if n.target is operator.getitem)
    output = graph.find_nodes(op="output")[0]
    with graph.inserting_before(output):
        other_view = graph.call_function(VIEW, (residual, [3, 2, 8]))
    output.args = ((*output.args[0], other_view),)
    gm.recompile()
    FakeTensorProp(gm).propagate(*inputs())
    assert targets(addmm_in_place.run(gm, CTX).gm) == [ADDMM]


def test_a_late_reader_through_an_item_of_a_split_keeps_the_copy() -> None:
    """split returns a list of views: an item of it, read after the addmm, reads the old residual too."""
    gm = residual_graph()
    graph = gm.graph
    residual = next(n for n in graph.nodes if n.target is operator.getitem)
    addmm = next(n for n in graph.nodes if n.target is ADDMM)
    with graph.inserting_before(addmm):
        parts = graph.call_function(torch.ops.aten.split.Tensor, (residual, 4, -1))
        first = graph.call_function(operator.getitem, (parts, 0))
    output = graph.find_nodes(op="output")[0]
    with graph.inserting_before(output):
        late = graph.call_function(torch.ops.aten.mul.Tensor, (first, 2.0))
    output.args = ((*output.args[0], late),)
    gm.recompile()
    FakeTensorProp(gm).propagate(*inputs())
    expected = gm(*inputs())
    result = addmm_in_place.run(gm, CTX)
    assert targets(result.gm) == [ADDMM]
    torch.testing.assert_close(result.gm(*inputs())[1], expected[1], rtol=0, atol=0)


@pytest.mark.parametrize("second_input_read_later", [False, True], ids=["dies", "read later"])
def test_an_addmm_into_an_earlier_in_place_result_writes_the_same_memory(second_input_read_later: bool) -> None:
    """The down projection adds into what the o projection wrote in place: that result is the residual's memory,
    so the second addmm writes it in place too, unless that memory is read after it (through any alias)."""
    gm = residual_graph()
    graph = gm.graph
    first_out = next(n for n in graph.nodes if n.target is VIEW and n.args[0].target is ADDMM)
    a, wt = (next(n for n in graph.nodes if n.name == name) for name in ("a", "wt"))
    output = graph.find_nodes(op="output")[0]
    with graph.inserting_before(output):
        flat = graph.call_function(VIEW, (first_out, [6, 8]))
        second = graph.call_function(ADDMM, (flat, a, wt))
        out = graph.call_function(VIEW, (second, [2, 3, 8]))
    output.args = ((out, first_out) if second_input_read_later else (out,),)
    gm.recompile()
    FakeTensorProp(gm).propagate(*inputs())
    expected = gm(*inputs())
    result = addmm_in_place.run(gm, CTX)
    assert targets(result.gm) == ([ADDMM_, ADDMM] if second_input_read_later else [ADDMM_, ADDMM_])
    for got, want in zip(result.gm(*inputs()), expected, strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_nothing_to_do_without_addmm() -> None:
    graph = fx.Graph()
    x = graph.placeholder("x")
    graph.output((graph.call_function(torch.ops.aten.mm.default, (x, x)),))
    result = addmm_in_place.run(fx.GraphModule(torch.nn.Module(), graph), CTX)
    assert not result.changed and result.note == "no addmm"


@pytest.mark.parametrize("mode", ["greedy", "sample"])
def test_the_folded_step_writes_its_residuals_in_place_and_matches_eager(folded_step_case: StepCase, mode: str):
    """Every residual add of the folded target's verify and the draft's 2-token and one-token forwards (2 layers
    each: two o projections and the first layer's down projection, which feeds a folded input norm) is written in
    place; the step's outputs are the traced program's exactly (fp32 no-change check)."""
    gm = folded_step_case.through(mode, addmm_in_place.NAME)
    assert targets(gm).count(ADDMM_) == 3 + 3 + 3 and ADDMM not in targets(gm)
    folded_step_case.assert_matches_eager(gm, mode)


def test_the_unfolded_step_has_no_addmm(step_case: StepCase) -> None:
    assert targets(step_case.through("greedy", addmm_in_place.NAME)) == []
