"""fuse_qk_norm: per-head q/k rms_norms before a rotary_kv_attention become its q_norm/k_norm arguments."""

import pytest
import torch
import torch.fx as fx

from graphspec.config import PassContext
from graphspec.passes import fuse_qk_norm
from tests import graphs

CTX = PassContext(k=2, batch=2, mode="greedy", sm=None)
RMS_NORM = torch.ops.graphspec.rms_norm.default
TRANSPOSE = torch.ops.aten.transpose.int
NAMES = ("q", "k", "v", "cos", "sin", "cache", "slot_ids", "start_pos", "q_weight", "k_weight")


def chain(folded: bool = False, k_eps: float = 1e-6, causal: bool = True) -> fx.GraphModule:
    """q, k, v [B, T, H, D] as the decoder has them before its transposes; per-head norms of q and k,
    the transposes, one rotary_kv_attention (causal=False: a DFlash block's, as fuse_kv_attention makes
    it). folded=True: what fuse_qk_norm must make of it."""
    graph = fx.Graph()
    q, k, v, cos, sin, cache, slots, start, q_weight, k_weight = (graph.placeholder(name) for name in NAMES)
    if not folded:
        q = graph.call_function(RMS_NORM, (q, q_weight, 1e-6))
        k = graph.call_function(RMS_NORM, (k, k_weight, k_eps))
    q_t, k_t, v_t = (graph.call_function(TRANSPOSE, (x, 1, 2)) for x in (q, k, v))
    norms = (q_weight, k_weight, 1e-6) if folded else (None, None, 1e-6) if not causal else ()
    window = () if causal else (False,)
    out = graph.call_function(
        graphs.ROTARY_KV_ATTENTION, (q_t, k_t, v_t, cos, sin, cache, 1, slots, start, 0.3, *norms, *window)
    )
    graph.output((out, cache))
    return fx.GraphModule(torch.nn.Module(), graph)


def chain_inputs(dtype: torch.dtype) -> list[torch.Tensor]:
    q, k, v, cos, sin, cache, slots, start = graphs.rotary_kv_chain_inputs(dtype)
    g = torch.Generator().manual_seed(4)
    weights = [(torch.rand(q.shape[-1], generator=g) + 0.5).to(dtype) for _ in range(2)]
    # rotary_kv_chain_inputs gives [B, H, T, D] views; the chain takes [B, T, H, D] and transposes.
    return [q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), cos, sin, cache, slots, start, *weights]


@pytest.mark.parametrize("causal", [True, False])
def test_norms_become_arguments_of_the_fused_op(causal: bool):
    result = fuse_qk_norm.run(chain(causal=causal), CTX)
    assert result.changed and result.stats == {"folded": 1, "kept": 0}
    graphs.assert_graph_equal(result.gm, chain(folded=True, causal=causal))  # a block keeps causal=False


def test_norm_with_another_user_is_left_alone():
    gm = chain()
    norm = next(iter(gm.graph.find_nodes(op="call_function", target=RMS_NORM)))
    output = gm.graph.find_nodes(op="output")[0]
    output.args = ((*output.args[0], norm),)  # the normalized q also leaves the graph
    gm.recompile()
    result = fuse_qk_norm.run(gm, CTX)
    assert not result.changed and result.stats == {"folded": 0, "kept": 1}
    assert len(result.gm.graph.find_nodes(op="call_function", target=RMS_NORM)) == 2


def test_different_eps_is_kept():
    """The op has one norm_eps for both."""
    result = fuse_qk_norm.run(chain(k_eps=1e-5), CTX)
    assert not result.changed and result.stats == {"folded": 0, "kept": 1}


def test_nothing_to_do_without_norms():
    result = fuse_qk_norm.run(chain(folded=True), CTX)
    assert not result.changed and result.stats == {"folded": 0, "kept": 0} and result.note


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_folded_graph_computes_the_same_bits(dtype: torch.dtype, causal: bool):
    inputs = chain_inputs(dtype)
    expected_inputs, got_inputs = [x.clone() for x in inputs], [x.clone() for x in inputs]
    expected = chain(causal=causal)(*expected_inputs)
    got = fuse_qk_norm.run(chain(causal=causal), CTX).gm(*got_inputs)
    assert torch.equal(got[0], expected[0])
    assert torch.equal(got_inputs[5], expected_inputs[5]) and not torch.equal(got_inputs[5], inputs[5])


@pytest.mark.parametrize("mode", ["greedy", "sample"])
def test_real_step_folds_every_draft_layer_and_matches_eager(step_case, mode):
    """The step's draft is a Qwen3 (per-head norms): K=2 forwards x 2 layers fold; the Llama target has none."""
    before = step_case.through(mode, "fuse_kv_attention")
    gm = step_case.through(mode, "fuse_qk_norm")
    fused = list(gm.graph.find_nodes(op="call_function", target=graphs.ROTARY_KV_ATTENTION))
    assert sum(len(node.args) > 10 and node.args[10] is not None for node in fused) == 4 and len(fused) == 6
    norms = [len(g.graph.find_nodes(op="call_function", target=RMS_NORM)) for g in (before, gm)]
    assert norms == [norms[1] + 8, 3]  # what is left: each forward's first input norm
    step_case.assert_matches_eager(gm, mode)  # bit for bit against the traced program


def context_write(folded: bool = False) -> fx.GraphModule:
    """A DFlash drafter's context rows: k [B, T, H, D] normed, transposed, and handed to rotary_kv_write as
    both its q and its k (only the cache write matters). folded=True: what fuse_qk_norm must make of it."""
    graph = fx.Graph()
    _, k, v, cos, sin, cache, slots, start, _, k_weight = (graph.placeholder(name) for name in NAMES)
    if not folded:
        k = graph.call_function(RMS_NORM, (k, k_weight, 1e-5))
    k_t, v_t = (graph.call_function(TRANSPOSE, (x, 1, 2)) for x in (k, v))
    norms = (k_weight, k_weight, 1e-5) if folded else ()
    graph.call_function(graphs.ROTARY_KV_WRITE, (k_t, k_t, v_t, cos, sin, cache, 1, slots, start, *norms))
    graph.output((cache,))
    return fx.GraphModule(torch.nn.Module(), graph)


def test_context_write_folds_its_k_norm_once():
    result = fuse_qk_norm.run(context_write(), CTX)
    assert result.changed and result.stats == {"folded": 1, "kept": 0}
    graphs.assert_graph_equal(result.gm, context_write(folded=True))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_folded_context_write_computes_the_same_bits(dtype: torch.dtype):
    inputs = chain_inputs(dtype)
    expected_inputs, got_inputs = [x.clone() for x in inputs], [x.clone() for x in inputs]
    context_write()(*expected_inputs)
    fuse_qk_norm.run(context_write(), CTX).gm(*got_inputs)
    assert torch.equal(got_inputs[5], expected_inputs[5]) and not torch.equal(got_inputs[5], inputs[5])
