"""fuse_pointwise: which integer glue becomes one launch, where a group must end, and that the step computes
the same bits (kernels run under the interpreter on the CPU)."""

from __future__ import annotations

import json
import operator

import pytest
import torch
import torch.fx as fx
from torch.fx.experimental.proxy_tensor import make_fx

from graphspec.config import PassContext
from graphspec.lowering import fuse_pointwise
from tests.kernels.helpers import DEVICE

aten = torch.ops.aten


def fused_op():  # registered when the pass first fuses (kernel modules load lazily: tests/kernels/interpret.py)
    return torch.ops.graphspec.fused_pointwise_triton.default


def ctx(**overrides) -> PassContext:
    return PassContext(k=2, batch=4, mode="greedy", sm=None, options={"force_sm": 90}, **overrides)


def glue(length, valid, logits):
    """Positions, a kernel-like float op reading them, more positions after it, a mask."""
    start = (length - 1).clamp(min=0)  # group 1 ...
    offsets = start[:, None] + torch.tensor([0, 1, 2], device=length.device)  # ... (a view of its own value joins)
    scores = logits * offsets.to(logits.dtype)  # float: ends group 1 (reads offsets)
    kv = (length + 3).clamp(max=40)  # group 2 ...
    mask = torch.where(valid, kv, length) > 2  # ...
    return scores, kv, mask, torch.stack((kv, length), 1)


def traced():
    args = (torch.tensor([3, 9, 0, 50]), torch.tensor([True, False, True, True]), torch.randn(4, 3))
    args = tuple(arg.to(DEVICE) for arg in args)  # the kernel runs on CUDA where there is one
    gm = make_fx(glue, tracing_mode="fake")(*args)
    for node in gm.graph.nodes:
        node.meta["gs_region"] = "draft"
    return gm, args


def fused_nodes(gm: fx.GraphModule) -> list[fx.Node]:
    return list(gm.graph.find_nodes(op="call_function", target=fused_op()))


def test_glue_between_kernels_becomes_one_launch_per_stretch_with_the_same_bits():
    gm, args = traced()
    expected = gm(*args)
    result = fuse_pointwise.run(gm, ctx())
    assert result.changed and result.stats["groups"] == 2
    left = {node.target for node in gm.graph.nodes if node.op == "call_function"} - {fused_op(), operator.getitem}
    assert left <= {aten.mul.Tensor, aten._to_copy.default, aten.lift_fresh_copy.default}  # the float ops stay
    for got, want in zip(gm(*args), expected, strict=True):
        assert got.dtype == want.dtype and torch.equal(got, want)
    assert all(
        node.meta["gs_region"] == "draft" and node.meta["gs_pass"] == "fuse_pointwise" for node in fused_nodes(gm)
    )


def test_a_group_ends_at_a_write_and_at_a_region_boundary():
    def writes(length, state):
        a = (length + 1).clamp(min=0)
        state.add_(1)  # an in-place write: nothing may be read across it
        b = (state + a) * 2
        return a, b

    args = (torch.tensor([1, 2]), torch.tensor([5, 6]))
    gm = make_fx(writes, tracing_mode="fake")(*args)
    for node in gm.graph.nodes:
        node.meta["gs_region"] = "draft"
    result = fuse_pointwise.run(gm, ctx())
    assert result.stats["groups"] == 2  # one before the write, one after
    write = next(n for n in gm.graph.nodes if n.target == aten.add_.Tensor)
    first, second = fused_nodes(gm)
    order = list(gm.graph.nodes)
    assert order.index(first) < order.index(write) < order.index(second)

    gm, args = traced()
    boundary = next(n for n in gm.graph.nodes if n.target == aten.add.Tensor)  # length + 3 starts "verify"
    for node in gm.graph.nodes:
        if list(gm.graph.nodes).index(node) >= list(gm.graph.nodes).index(boundary):
            node.meta["gs_region"] = "verify"
    fuse_pointwise.run(gm, ctx())
    assert {node.meta["gs_region"] for node in fused_nodes(gm)} == {"draft", "verify"}


def test_single_ops_floats_and_views_of_inputs_stay():
    def lonely(length, x):
        return length + 1, x * 2, length[:, None], (x + 1) * 3

    args = (torch.tensor([1, 2]), torch.tensor([0.5, 1.5]))
    gm = make_fx(lonely, tracing_mode="fake")(*args)
    assert not fuse_pointwise.run(gm, ctx()).changed


def test_a_transposed_value_joins_its_group():
    """EAGLE-3's draft positions [K-1, B] (rows contiguous for the kernels) read transposed ([B, K-1], aten.t) by a
    cat: one launch, the same bits."""

    def positions(length):
        drafted = length - 2 + torch.arange(1, 4, device=length.device)[:, None]
        return drafted.clamp(min=0), torch.cat((length[:, None], drafted.t()), 1)

    args = (torch.tensor([3, 9, 0, 50], device=DEVICE),)
    gm = make_fx(positions, tracing_mode="fake")(*args)
    for node in gm.graph.nodes:
        node.meta["gs_region"] = "draft"
    expected = gm(*args)
    result = fuse_pointwise.run(gm, ctx())
    assert result.stats["groups"] == 1 and not any(node.target == aten.cat.default for node in gm.graph.nodes)
    for got, want in zip(gm(*args), expected, strict=True):
        assert torch.equal(got, want)


def test_nothing_changes_on_the_cpu_or_with_reference_lowering():
    gm, _ = traced()
    assert not fuse_pointwise.run(gm, PassContext(k=2, batch=4, mode="greedy", sm=None)).changed
    assert not fuse_pointwise.run(gm, ctx(lowering="reference")).changed


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU step case: its kernels run under the interpreter")
@pytest.mark.parametrize("mode", ["greedy", "sample"])
def test_real_step_computes_the_same_bits(step_case, mode):
    before = step_case.through(mode, "lower_kernels", options={"force_sm": 90})
    after = step_case.through(mode, "fuse_pointwise", options={"force_sm": 90})
    assert fused_nodes(after)
    got, _ = step_case.run_graph(after)
    want, _ = step_case.run_graph(before)
    for name, value in want.items():
        assert torch.equal(got[name], value), name


def test_a_fused_graph_survives_the_artifacts_encoding():
    """An artifact stores graphs node by node: the fused op's program (a string) and input list come back,
    and the rebuilt graph computes the same values."""
    from graphspec.artifact import decode_graph_module, encode_graph_module

    gm, args = traced()
    fuse_pointwise.run(gm, ctx())
    modules, constants = encode_graph_module(gm, "glue")
    rebuilt = decode_graph_module(json.loads(json.dumps(modules)), constants, "glue")  # as stored: JSON
    assert rebuilt.code == gm.code
    for got, want in zip(rebuilt(*args), gm(*args), strict=True):
        assert torch.equal(got, want)
