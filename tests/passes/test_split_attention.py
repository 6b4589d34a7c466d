"""split_attention: cut at attention into eager-break pieces, only for capture="piecewise"."""

from __future__ import annotations

import pytest
import torch
import torch.fx as fx

from graphspec.config import PassContext
from graphspec.passes import split_attention
from graphspec.runtime.graphs import is_attention_piece
from tests.step_case import K

KV_WRITE = torch.ops.graphspec.kv_write.default
ATTENTION = torch.ops.graphspec.attention.default
SCALE = 0.5


def layered_forward(layers: int) -> fx.GraphModule:
    """One forward of an L-layer model reduced to its region structure: per layer, pre-attention
    work (q = x * w), an in-place KV write, attention over the cache, post-attention work (+ x)."""
    graph = fx.Graph()
    x, weight, cache, slots, start, k, v = (
        graph.placeholder(name) for name in ("x", "weight", "cache", "slot_ids", "start_pos", "k", "v")
    )
    for layer in range(layers):
        q = graph.call_function(torch.ops.aten.mul.Tensor, (x, weight))
        graph.call_function(KV_WRITE, (cache, layer, slots, start, k, v))
        attended = graph.call_function(ATTENTION, (q, cache, layer, slots, start, SCALE))  # [B, T, H, D]
        attended = graph.call_function(torch.ops.aten.transpose.int, (attended, 1, 2))
        x = graph.call_function(torch.ops.aten.add.Tensor, (attended, x))
    graph.output((x, cache))
    return fx.GraphModule(torch.nn.Module(), graph)


def layered_inputs(layers: int) -> list[torch.Tensor]:
    """x/q [B=2, H=2, T=3, D=4], a cache of 3 slots x 16 positions, rows in slots 0 and 2."""
    generator = torch.Generator().manual_seed(7)
    return [
        torch.randn(2, 2, 3, 4, generator=generator),
        torch.randn(2, 2, 3, 4, generator=generator),
        torch.randn(layers, 2, 3, 1, 16, 4, generator=generator),
        torch.tensor([0, 2]),
        torch.tensor([4, 9]),
        torch.randn(2, 1, 3, 4, generator=generator),
        torch.randn(2, 1, 3, 4, generator=generator),
    ]


def ctx(capture: str) -> PassContext:
    return PassContext(k=1, batch=2, mode="greedy", sm=None, capture=capture)


def called_pieces(gm: fx.GraphModule) -> list[fx.GraphModule]:
    return [gm.get_submodule(node.target) for node in gm.graph.nodes if node.op == "call_module"]


@pytest.mark.parametrize("layers", [1, 2, 5])
def test_one_forward_of_l_layers_becomes_2l_plus_1_pieces(layers: int) -> None:
    result = split_attention.run(layered_forward(layers), ctx("piecewise"))
    assert result.changed
    assert result.stats["pieces"] == 2 * layers + 1
    assert result.stats["attention_pieces"] == layers
    assert result.stats["captured_pieces"] == layers + 1
    assert len(called_pieces(result.gm)) == 2 * layers + 1


def test_attention_pieces_hold_one_attention_each_and_alternate_with_captured_pieces() -> None:
    gm = split_attention.run(layered_forward(3), ctx("piecewise")).gm
    kinds = [is_attention_piece(piece) for piece in called_pieces(gm)]
    assert kinds == [False, True, False, True, False, True, False]
    for piece in called_pieces(gm):
        ops = [n.target for n in piece.graph.nodes if n.op == "call_function"]
        if is_attention_piece(piece):
            assert ops == [ATTENTION]
        else:
            assert ATTENTION not in ops


def test_kv_write_runs_in_the_piece_before_its_attention() -> None:
    # The write and the read share no data edge (both use the cache input), so order is all that
    # keeps attention from reading the previous step's KV.
    gm = split_attention.run(layered_forward(2), ctx("piecewise")).gm
    pieces = called_pieces(gm)
    for index, piece in enumerate(pieces):
        if is_attention_piece(piece):
            layer = next(n.args[2] for n in piece.graph.nodes if n.target == ATTENTION)
            writes = [n.args[1] for n in pieces[index - 1].graph.nodes if n.target == KV_WRITE]
            assert writes == [layer]


@pytest.mark.parametrize("capture", ["auto", "full", "none"])
def test_nothing_to_do_unless_capture_is_piecewise(capture: str) -> None:
    gm = layered_forward(2)
    before = [(n.op, n.target) for n in gm.graph.nodes]
    result = split_attention.run(gm, ctx(capture))
    assert not result.changed
    assert result.gm is gm
    assert [(n.op, n.target) for n in result.gm.graph.nodes] == before
    assert capture in result.note


def test_nothing_to_do_without_attention() -> None:
    graph = fx.Graph()
    x = graph.placeholder("x")
    graph.output(graph.call_function(torch.ops.aten.mul.Tensor, (x, x)))
    result = split_attention.run(fx.GraphModule(torch.nn.Module(), graph), ctx("piecewise"))
    assert not result.changed
    assert result.note == "no attention nodes to split at"


def test_split_hand_built_forward_computes_the_same_outputs_and_cache() -> None:
    unsplit_inputs, split_inputs = layered_inputs(3), layered_inputs(3)
    expected = layered_forward(3)(*unsplit_inputs)
    got = split_attention.run(layered_forward(3), ctx("piecewise")).gm(*split_inputs)
    torch.testing.assert_close(got[0], expected[0], rtol=0, atol=0)
    torch.testing.assert_close(split_inputs[2], unsplit_inputs[2], rtol=0, atol=0)  # the cache, written in place


@pytest.fixture(scope="module")
def through_pipeline(step_case):
    """(mode, capture) -> the real traced step after the whole pipeline, built once per module."""
    cache: dict[tuple[str, str], fx.GraphModule] = {}

    def get(mode: str, capture: str) -> fx.GraphModule:
        if (mode, capture) not in cache:
            cache[(mode, capture)] = step_case.through(mode, "split_attention", capture=capture)
        return cache[(mode, capture)]

    return get


@pytest.mark.parametrize("mode", ["greedy", "sample"])
def test_real_step_splits_into_two_pieces_per_attention_plus_one(step_case, through_pipeline, mode: str) -> None:
    gm = through_pipeline(mode, "piecewise")
    attention_calls = K * step_case.draft.spec.num_layers + step_case.target.spec.num_layers
    assert len(called_pieces(gm)) == 2 * attention_calls + 1
    assert sum(is_attention_piece(p) for p in called_pieces(gm)) == attention_calls


@pytest.mark.parametrize("mode", ["greedy", "sample"])
def test_split_real_step_is_bit_identical_to_the_unsplit_step_in_fp32(step_case, through_pipeline, mode: str) -> None:
    split, unsplit = through_pipeline(mode, "piecewise"), through_pipeline(mode, "auto")
    assert any(node.op == "call_module" for node in split.graph.nodes)
    assert not any(node.op == "call_module" for node in unsplit.graph.nodes)
    split_outputs, split_state = step_case.run_graph(split)
    unsplit_outputs, unsplit_state = step_case.run_graph(unsplit)
    for name, value in unsplit_outputs.items():
        torch.testing.assert_close(split_outputs[name], value, rtol=0, atol=0, msg=name)
    for name in ("target_cache", "draft_cache"):
        torch.testing.assert_close(split_state[name], unsplit_state[name], rtol=0, atol=0, msg=name)
    step_case.assert_matches_eager(split, mode)
