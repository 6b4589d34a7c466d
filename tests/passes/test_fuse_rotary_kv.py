"""fuse_rotary_kv: rotary + the in-place kv_write of its rotated k become one graphspec::rotary_kv_write."""

import operator

import pytest
import torch
import torch.fx as fx

from graphspec import checks, ops
from graphspec.config import PassContext
from graphspec.passes import fuse_rotary_kv
from tests import graphs

CTX = PassContext(k=2, batch=2, mode="greedy", sm=None)


def nodes_of(gm: fx.GraphModule, target) -> list[fx.Node]:
    return list(gm.graph.find_nodes(op="call_function", target=target))


def test_rotary_and_its_kv_write_become_one_op():
    result = fuse_rotary_kv.run(graphs.rotary_kv_chain(), CTX)
    assert result.changed and result.stats == {"fused": 2, "kept": 0}
    graphs.assert_graph_equal(result.gm, graphs.rotary_kv_chain(fused=True))


def test_fused_op_takes_the_region_of_the_write_it_replaces():
    gm = fuse_rotary_kv.run(graphs.rotary_kv_chain(regions=("draft", "verify")), CTX).gm
    fused = nodes_of(gm, graphs.ROTARY_KV_WRITE)
    assert [node.meta["gs_region"] for node in fused] == ["draft", "verify"]
    assert {node.meta["gs_pass"] for node in fused} == {fuse_rotary_kv.NAME}
    runs = [node.meta["gs_region"] for node in checks.step_ops(gm)]
    assert runs == ["draft", "draft", "verify", "verify"]  # each region still one contiguous run


def test_rotated_k_with_another_user_is_kept():
    gm = graphs.rotary_kv_chain()
    k_rot = next(n for n in gm.graph.nodes if n.target is operator.getitem and n.args[1] == 1)
    output = gm.graph.find_nodes(op="output")[0]
    output.args = ((*output.args[0], k_rot),)  # the rotated k also leaves the graph
    gm.recompile()
    result = fuse_rotary_kv.run(gm, CTX)
    assert result.stats == {"fused": 1, "kept": 1}
    assert len(nodes_of(result.gm, graphs.ROTARY)) == 1 and len(nodes_of(result.gm, graphs.KV_WRITE)) == 1
    assert nodes_of(result.gm, graphs.KV_WRITE)[0].args[4] is k_rot


def test_rotated_q_read_before_the_write_is_kept():
    """The fused op stands where the write stood; a reader of q_rot before it would precede its input."""
    gm = graphs.rotary_kv_chain(regions=("draft",))
    write = nodes_of(gm, graphs.KV_WRITE)[0]
    q_rot = next(n for n in gm.graph.nodes if n.target is operator.getitem and n.args[1] == 0)
    with gm.graph.inserting_before(write):
        early = gm.graph.call_function(torch.ops.aten.mul.Tensor, (q_rot, 2.0))
    output = gm.graph.find_nodes(op="output")[0]
    output.args = ((*output.args[0], early),)
    gm.recompile()
    before = gm.code
    result = fuse_rotary_kv.run(gm, CTX)
    assert not result.changed and result.stats == {"fused": 0, "kept": 1}
    assert result.gm.code == before


def test_write_to_the_inputs_between_rotary_and_kv_write_is_kept():
    """Fusing moves the rotation down to the write; an in-place op in between could change what it reads."""
    gm = graphs.rotary_kv_chain(regions=("draft",))
    write = nodes_of(gm, graphs.KV_WRITE)[0]
    k = next(n for n in gm.graph.nodes if n.name == "k")
    with gm.graph.inserting_before(write):
        gm.graph.call_function(torch.ops.aten.add_.Tensor, (k, 1.0))
    gm.recompile()
    result = fuse_rotary_kv.run(gm, CTX)
    assert not result.changed and result.stats == {"fused": 0, "kept": 1}


def test_nothing_to_do_without_rotary():
    result = fuse_rotary_kv.run(graphs.kv_chain(functional=False), CTX)
    assert not result.changed and result.stats == {"fused": 0, "kept": 0} and result.note


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_graph_computes_the_same_bits(dtype: torch.dtype):
    """Outputs and the cache the graph writes are bit-identical before and after the pass (GQA, q/k/v
    strided views of one projection)."""
    inputs = graphs.rotary_kv_chain_inputs(dtype)
    expected_inputs = [x.clone() for x in inputs]
    expected = graphs.rotary_kv_chain()(*expected_inputs)
    gm = fuse_rotary_kv.run(graphs.rotary_kv_chain(), CTX).gm
    got_inputs = [x.clone() for x in inputs]
    got = gm(*got_inputs)
    for g, e in zip(got, expected, strict=True):
        assert torch.equal(g, e)
    cache = 5  # index of the cache among the inputs
    assert got[-1] is got_inputs[cache]  # still written in place
    assert not torch.equal(got_inputs[cache], inputs[cache])  # the write happened
    assert torch.equal(got_inputs[cache], expected_inputs[cache])


def test_reference_op_is_rotary_then_kv_write():
    q, k, v, cos, sin, cache, slots, start = graphs.rotary_kv_chain_inputs(torch.bfloat16)
    pair_cache, fused_cache = cache.clone(), cache.clone()
    q_rot, k_rot = ops.rotary(q, k, cos, sin)
    ops.kv_write(pair_cache, 1, slots, start, k_rot, v)
    fused_q = ops.rotary_kv_write(q, k, v, cos, sin, fused_cache, 1, slots, start)
    assert fused_q.is_contiguous() and torch.equal(fused_q, q_rot)
    assert torch.equal(fused_cache, pair_cache)


@pytest.mark.parametrize("mode", ["greedy", "sample"])
def test_real_step_fuses_every_layer_and_matches_eager(step_case, mode):
    gm = step_case.through(mode, "fuse_rotary_kv")
    # target: 1 forward x 2 layers; draft: K=2 forwards x 2 layers
    assert len(nodes_of(gm, graphs.ROTARY_KV_WRITE)) == 6
    assert not nodes_of(gm, graphs.ROTARY) and not nodes_of(gm, graphs.KV_WRITE)
    step_case.assert_matches_eager(gm, mode)  # bit for bit against the traced program
