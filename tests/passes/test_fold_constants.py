import pytest
import torch
import torch.fx as fx
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx

from graphspec import fake_meta
from graphspec.config import PassContext
from graphspec.passes import fold_constants

aten = torch.ops.aten


def ctx() -> PassContext:
    return PassContext(k=2, batch=4, mode="greedy", sm=None)


def positions(length, valid):
    """A drafter's position arithmetic in miniature: constants, shape-only values, a where with a number,
    a large constant and a returned one."""
    offsets = torch.arange(5) * 2 + 1  # depends on nothing: folded, the * and + with it
    zeros = torch.zeros_like(length)  # depends on length's shape only
    kept = torch.where(valid, length, 7)  # make_fx records the 7 as aten.scalar_tensor: folded too
    big = torch.arange(fold_constants.FOLD_BYTES)  # over the size limit: stays a launch
    return length[:, None] + offsets, zeros + kept, big.sum() + length, torch.arange(3)


def traced():
    length, valid = torch.tensor([3, 9, 4, 0]), torch.tensor([True, False, True, True])
    return make_fx(positions, tracing_mode="fake")(length, valid), (length, valid)


def targets(gm) -> list:
    return [node.target for node in gm.graph.nodes if node.op == "call_function"]


def test_values_of_no_input_data_become_constants_and_results_stay_bitwise():
    gm, args = traced()
    expected = gm(*args)
    result = fold_constants.run(gm, ctx())
    assert result.changed and result.stats == {"folded_values": 3, "where_numbers": 0}
    ops = targets(result.gm)
    assert aten.zeros_like.default not in ops and aten.mul.Tensor not in ops  # folded, with what fed them
    assert aten.scalar_tensor.default not in ops
    assert ops.count(aten.arange.default) == 2  # the large one and the returned one
    for got, want in zip(result.gm(*args), expected, strict=True):
        assert got.dtype == want.dtype and torch.equal(got, want)
    constants = [node for node in result.gm.graph.nodes if node.op == "get_attr"]
    assert len(constants) == 3 and all(node.meta["gs_pass"] == "fold_constants" for node in constants)
    assert all(getattr(result.gm, node.target).is_contiguous() for node in constants)
    assert all(isinstance(node.meta["val"], torch.Tensor) for node in constants)  # fake values propagated


def test_where_numbers_become_constants(step_case):
    """mask_padding writes where(row_valid, x, number) (aten.where.ScalarOther), which makes the number a
    device tensor at every call: after the pass each reads a 0-dim constant of its result's dtype."""
    gm = step_case.through("greedy", "mask_padding")
    numbers = [n for n in gm.graph.nodes if n.target == aten.where.ScalarOther]
    assert numbers
    result = fold_constants.run(gm, ctx())
    assert result.stats["where_numbers"] == len(numbers)
    assert aten.where.ScalarOther not in targets(result.gm)
    for node in result.gm.graph.find_nodes(op="call_function", target=aten.where.self):
        constant = node.args[2]
        if constant.op == "get_attr":
            value = getattr(result.gm, constant.target)
            assert value.dim() == 0 and value.dtype == node.meta["val"].dtype


def test_a_returned_value_and_its_views_stay_ops():
    def returns_a_view():
        table = torch.arange(4)
        return table, table[None]

    gm = make_fx(returns_a_view, tracing_mode="fake")()
    assert not fold_constants.run(gm, ctx()).changed


def test_random_and_in_place_ops_are_not_folded():
    def draws(x):
        noise = torch.rand(3)  # nondeterministic_seeded
        ones = torch.ones(3)
        ones.add_(1)  # mutable schema
        return x + noise + ones

    gm = make_fx(draws, tracing_mode="fake")(torch.zeros(3))
    fold_constants.run(gm, ctx())
    ops = targets(gm)
    assert aten.rand.default in ops and aten.add_.Tensor in ops


def where_with_a_number(number: float, x: torch.Tensor) -> fx.GraphModule:
    """where(valid, x, number) as mask_padding writes it (make_fx would record aten.scalar_tensor)."""
    graph = fx.Graph()
    valid, value = graph.placeholder("valid"), graph.placeholder("x")
    graph.output((graph.call_function(aten.where.ScalarOther, (valid, value, number)),))
    gm = fx.GraphModule(torch.nn.Module(), graph)
    mode = FakeTensorMode()
    valid.meta["val"], value.meta["val"] = mode.from_tensor(torch.tensor([True, False])), mode.from_tensor(x)
    fake_meta.propagate(gm)
    return gm


def test_a_where_number_becomes_a_constant_of_the_result_dtype_unless_it_promotes():
    valid = torch.tensor([True, False])
    gm = where_with_a_number(7, torch.tensor([1, 2]))
    assert fold_constants.run(gm, ctx()).stats == {"folded_values": 0, "where_numbers": 1}
    assert targets(gm) == [aten.where.self] and torch.equal(gm(valid, torch.tensor([1, 2]))[0], torch.tensor([1, 7]))
    promoting = where_with_a_number(0.5, torch.tensor([1, 2]))  # int64 x, float number: a float result
    assert not fold_constants.run(promoting, ctx()).changed


def test_running_twice_changes_nothing_more():
    gm, _ = traced()
    fold_constants.run(gm, ctx())
    assert not fold_constants.run(gm, ctx()).changed


@pytest.mark.parametrize("mode", ["greedy", "sample"])
def test_real_rows_match_eager_program(step_case, mode):
    step_case.assert_matches_eager(step_case.through(mode, "fold_constants"), mode)
