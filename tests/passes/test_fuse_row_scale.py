"""fuse_row_scale: a folded input norm's row_scale, read through views by one rotary_kv_attention as q, k and v,
becomes that op's row_src / row_eps. Hand-built graphs, then the real folded step."""

from __future__ import annotations

import operator

import pytest
import torch
import torch.fx as fx
from torch.fx.passes.fake_tensor_prop import FakeTensorProp

from graphspec import ops
from graphspec.config import PassContext
from graphspec.op_nodes import positional_args
from graphspec.passes import fuse_row_scale
from tests import graphs
from tests.step_case import StepCase

CTX = PassContext(k=2, batch=2, mode="greedy", sm=None)
ROW_SCALE = ops.OPS["row_scale"]
BATCH, T, Q_HEADS, KV_HEADS, HEAD_DIM, HIDDEN = 2, 3, 4, 2, 8, 12
SIZES = [Q_HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM]
NAMES = ("qkv", "src", "cos", "sin", "cache", "slot_ids", "start_pos")


def chain(fused: bool = False, extra_reader: bool = False, write_between: bool = False) -> fx.GraphModule:
    """The decoder's folded attention input as make_fx traces it: qkv [B, T, W] (the projection of the
    un-normalized rows src [B, T, HIDDEN]), row_scale, split, views to heads, transposes, one rotary_kv_attention.
    fused: what the pass must make of it. extra_reader: the scaled qkv leaves the graph too. write_between: a KV
    write to another layer between the row_scale and the attention."""
    graph = fx.Graph()
    qkv, src, cos, sin, cache, slots, start = (graph.placeholder(name) for name in NAMES)
    scaled = qkv if fused else graph.call_function(ROW_SCALE, (qkv, src, 1e-5))
    parts = graph.call_function(torch.ops.aten.split_with_sizes.default, (scaled, SIZES, -1))
    heads = []
    for index, count in enumerate((Q_HEADS, KV_HEADS, KV_HEADS)):
        part = graph.call_function(operator.getitem, (parts, index))
        view = graph.call_function(torch.ops.aten.view.default, (part, [BATCH, T, count, HEAD_DIM]))
        heads.append(graph.call_function(torch.ops.aten.transpose.int, (view, 1, 2)))
    if write_between:
        graph.call_function(ops.OPS["kv_write"], (cache, 0, slots, start, heads[1], heads[2]))
    scale = (None, None, 1e-6, True, src, 1e-5) if fused else ()
    out = graph.call_function(graphs.ROTARY_KV_ATTENTION, (*heads, cos, sin, cache, 1, slots, start, 0.3, *scale))
    graph.output((out, cache, scaled) if extra_reader else (out, cache))
    gm = fx.GraphModule(torch.nn.Module(), graph)
    FakeTensorProp(gm).propagate(*chain_inputs(torch.float32))
    return gm


def chain_inputs(dtype: torch.dtype) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    qkv = torch.randn(BATCH, T, sum(SIZES), generator=g).to(dtype)
    src = (torch.randn(BATCH, T, HIDDEN, generator=g) * 3).to(dtype)
    _, _, _, cos, sin, _, slots, start = graphs.rotary_kv_chain_inputs(dtype)
    cache = torch.randn(2, 2, 3, KV_HEADS, 16, HEAD_DIM, generator=g).to(dtype)
    return [qkv, src, cos, sin, cache, slots, start]


def test_the_row_scale_becomes_the_attention_s_arguments() -> None:
    result = fuse_row_scale.run(chain(), CTX)
    assert result.changed and result.stats == {"fused": 1, "kept": 0}
    graphs.assert_graph_equal(result.gm, chain(fused=True))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_fused_graph_computes_the_same_bits(dtype: torch.dtype) -> None:
    expected_inputs, got_inputs = chain_inputs(dtype), chain_inputs(dtype)
    expected = chain()(*expected_inputs)
    got = fuse_row_scale.run(chain(), CTX).gm(*got_inputs)
    assert torch.equal(got[0], expected[0]) and torch.equal(got_inputs[4], expected_inputs[4])  # output, cache


@pytest.mark.parametrize("kind", ["extra_reader", "write_between"], ids=["read elsewhere", "a write between"])
def test_a_row_scale_read_elsewhere_or_across_a_write_is_kept(kind: str) -> None:
    result = fuse_row_scale.run(chain(**{kind: True}), CTX)
    assert not result.changed and result.stats == {"fused": 0, "kept": 1}
    assert len(result.gm.graph.find_nodes(op="call_function", target=ROW_SCALE)) == 1


def test_a_row_scale_read_by_two_attentions_is_kept() -> None:
    gm = chain()
    graph = gm.graph
    op = next(iter(graph.find_nodes(op="call_function", target=graphs.ROTARY_KV_ATTENTION)))
    with graph.inserting_after(op):
        second = graph.call_function(graphs.ROTARY_KV_ATTENTION, op.args)
    output = graph.find_nodes(op="output")[0]
    output.args = ((*output.args[0], second),)
    gm.recompile()
    assert fuse_row_scale.run(gm, CTX).stats == {"fused": 0, "kept": 1}


def test_nothing_to_do_without_a_row_scale() -> None:
    result = fuse_row_scale.run(chain(fused=True), CTX)
    assert not result.changed and result.stats == {"fused": 0, "kept": 0} and result.note


@pytest.mark.parametrize("mode", ["greedy", "sample"])
def test_the_folded_step_s_row_scales_all_move_into_its_attention(folded_step_case: StepCase, mode: str) -> None:
    """The input norms of every forward of the folded step ride in its attention: the draft's one-token and
    2-token forwards and the target's verify (2 layers each; Qwen3's per-head norms folded into the same op before;
    decoder.FOLDED_INPUT_MAX_TOKENS). Outputs are the traced program's exactly (fp32 no-change check)."""
    gm = folded_step_case.through(mode, fuse_row_scale.NAME)
    assert not gm.graph.find_nodes(op="call_function", target=ROW_SCALE)
    attentions = gm.graph.find_nodes(op="call_function", target=graphs.ROTARY_KV_ATTENTION)
    assert len(attentions) == 2 + 2 * 2 and all(positional_args(node)[14] is not None for node in attentions)
    folded_step_case.assert_matches_eager(gm, mode)
