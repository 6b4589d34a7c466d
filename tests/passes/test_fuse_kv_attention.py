"""fuse_kv_attention: rotary_kv_write + the attention of its rotated q become one graphspec::rotary_kv_attention."""

import pytest
import torch
import torch.fx as fx

from graphspec import checks, ops
from graphspec.config import PassContext
from graphspec.passes import fuse_kv_attention
from tests import graphs

CTX = PassContext(k=2, batch=2, mode="greedy", sm=None)


def nodes_of(gm: fx.GraphModule, target) -> list[fx.Node]:
    return list(gm.graph.find_nodes(op="call_function", target=target))


def fused_input(regions: tuple[str, ...] = ("draft", "verify")) -> fx.GraphModule:
    """What fuse_rotary_kv leaves: rotary_kv_write -> attention per layer."""
    return graphs.rotary_kv_chain(regions=regions, fused=True)


def test_write_and_its_attention_become_one_op():
    result = fuse_kv_attention.run(fused_input(), CTX)
    assert result.changed and result.stats == {"fused": 2, "kept": 0}
    graphs.assert_graph_equal(result.gm, graphs.rotary_kv_chain(fused_attention=True))


def test_write_and_its_block_attention_become_one_non_causal_op():
    """DFlash's block: rotary_kv_write + block_attention is rotary_kv_attention with causal=False."""
    result = fuse_kv_attention.run(graphs.rotary_kv_chain(fused=True, block=True), CTX)
    assert result.changed and result.stats == {"fused": 2, "kept": 0}
    graphs.assert_graph_equal(result.gm, graphs.rotary_kv_chain(fused_attention=True, block=True))


def test_norms_already_folded_into_the_write_move_to_the_fused_op():
    """The pipeline folds norms after this pass, but a write that has them keeps them."""
    gm = fused_input(regions=("verify",))
    write = nodes_of(gm, graphs.ROTARY_KV_WRITE)[0]
    with gm.graph.inserting_before(write):
        weights = [gm.graph.placeholder(name) for name in ("q_weight", "k_weight")]
    write.args = (*write.args, *weights, 1e-5)
    gm.recompile()
    result = fuse_kv_attention.run(gm, CTX)
    (fused,) = nodes_of(result.gm, graphs.ROTARY_KV_ATTENTION)
    assert fused.args[9:] == (0.5, *weights, 1e-5)


def test_fused_op_takes_the_region_of_the_attention():
    gm = fuse_kv_attention.run(fused_input(regions=("draft", "verify")), CTX).gm
    fused = nodes_of(gm, graphs.ROTARY_KV_ATTENTION)
    assert [node.meta["gs_region"] for node in fused] == ["draft", "verify"]
    assert {node.meta["gs_pass"] for node in fused} == {fuse_kv_attention.NAME}
    assert [node.meta["gs_region"] for node in checks.step_ops(gm)] == ["draft", "verify"]


def test_rotated_q_with_another_user_is_left_alone():
    gm = fused_input(regions=("draft",))
    write = nodes_of(gm, graphs.ROTARY_KV_WRITE)[0]
    output = gm.graph.find_nodes(op="output")[0]
    output.args = ((*output.args[0], write),)  # the rotated q also leaves the graph
    gm.recompile()
    result = fuse_kv_attention.run(gm, CTX)
    assert not result.changed and result.stats == {"fused": 0, "kept": 0}


def test_attention_of_another_layer_is_kept():
    """The write's layer and the attention's differ: the attention would read a layer nobody wrote."""
    gm = fused_input(regions=("draft",))
    attention = nodes_of(gm, graphs.ATTENTION)[0]
    attention.update_arg(2, 1)
    gm.recompile()
    result = fuse_kv_attention.run(gm, CTX)
    assert not result.changed and result.stats == {"fused": 0, "kept": 1}


@pytest.mark.parametrize("between", ["reads_cache", "mutates"])
def test_cache_read_or_write_in_between_is_kept(between: str):
    """The write moves down to the attention; a reader of the cache in between would miss it, and an
    in-place op in between could change what the write reads."""
    gm = fused_input(regions=("draft",))
    attention = nodes_of(gm, graphs.ATTENTION)[0]
    cache, k = (next(n for n in gm.graph.nodes if n.name == name) for name in ("cache", "k"))
    with gm.graph.inserting_before(attention):
        if between == "reads_cache":
            node = gm.graph.call_function(torch.ops.aten.sum.default, (cache,))
            output = gm.graph.find_nodes(op="output")[0]
            output.args = ((*output.args[0], node),)
        else:
            gm.graph.call_function(torch.ops.aten.add_.Tensor, (k, 1.0))
    gm.recompile()
    result = fuse_kv_attention.run(gm, CTX)
    assert not result.changed and result.stats == {"fused": 0, "kept": 1}


def test_nothing_to_do_without_rotary_kv_write():
    result = fuse_kv_attention.run(graphs.rotary_kv_chain(), CTX)  # rotary + kv_write, not fused yet
    assert not result.changed and result.stats == {"fused": 0, "kept": 0} and result.note


@pytest.mark.parametrize("block", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_graph_computes_the_same_bits(dtype: torch.dtype, block: bool):
    """Attention outputs and the cache the graph writes are bit-identical before and after the pass."""
    inputs = graphs.rotary_kv_chain_inputs(dtype)
    expected_inputs = [x.clone() for x in inputs]
    expected = graphs.rotary_kv_chain(fused=True, block=block)(*expected_inputs)
    gm = fuse_kv_attention.run(graphs.rotary_kv_chain(fused=True, block=block), CTX).gm
    got_inputs = [x.clone() for x in inputs]
    got = gm(*got_inputs)
    for g, e in zip(got, expected, strict=True):
        assert torch.equal(g, e)
    cache = 5  # index of the cache among the inputs
    assert got[-1] is got_inputs[cache]  # still written in place
    assert not torch.equal(got_inputs[cache], inputs[cache])  # the write happened
    assert torch.equal(got_inputs[cache], expected_inputs[cache])


@pytest.mark.parametrize("causal", [True, False])
def test_reference_op_is_rotary_kv_write_then_attention(causal: bool):
    q, k, v, cos, sin, cache, slots, start = graphs.rotary_kv_chain_inputs(torch.bfloat16)
    pair_cache, fused_cache = cache.clone(), cache.clone()
    q_rot = ops.rotary_kv_write(q, k, v, cos, sin, pair_cache, 1, slots, start)
    expected = (ops.attention if causal else ops.block_attention)(q_rot, pair_cache, 1, slots, start, 0.3)
    out = ops.rotary_kv_attention(q, k, v, cos, sin, fused_cache, 1, slots, start, 0.3, causal=causal)
    assert out.is_contiguous() and torch.equal(out, expected)
    assert torch.equal(fused_cache, pair_cache)
    if not causal:  # the block's queries see keys past their own position: not the causal result
        assert not torch.equal(out, ops.attention(q_rot, pair_cache.clone(), 1, slots, start, 0.3))


@pytest.mark.parametrize("mode", ["greedy", "sample"])
def test_real_step_fuses_every_layer_and_matches_eager(step_case, mode):
    gm = step_case.through(mode, "fuse_kv_attention")
    # target: 1 forward x 2 layers; draft: K=2 forwards x 2 layers
    assert len(nodes_of(gm, graphs.ROTARY_KV_ATTENTION)) == 6
    assert not nodes_of(gm, graphs.ROTARY_KV_WRITE) and not nodes_of(gm, graphs.ATTENTION)
    step_case.assert_matches_eager(gm, mode)  # bit for bit against the traced program
