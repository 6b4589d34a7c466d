"""fuse_prefill_attention: kv_write + the attention reading it become one prefill_attention, same bits."""

from __future__ import annotations

import torch
from torch.fx.experimental.proxy_tensor import make_fx

from graphspec import ops
from graphspec.config import PassContext
from graphspec.passes import fuse_prefill_attention

G = torch.Generator().manual_seed(0)


def inputs() -> list[torch.Tensor]:
    """q [2, 4, 5, 8], k/v [2, 2, 5, 8], cache [2, 2, 3, 2, 16, 8], slots, starts (row 1 has a prefix)."""
    return [
        torch.randn(2, 4, 5, 8, generator=G),
        torch.randn(2, 2, 5, 8, generator=G),
        torch.randn(2, 2, 5, 8, generator=G),
        torch.randn(2, 2, 3, 2, 16, 8, generator=G),
        torch.tensor([2, 0]),
        torch.tensor([0, 7]),
    ]


def write_then_attend(q, k, v, cache, slots, start):
    ops.kv_write(cache, 1, slots, start, k, v)
    return ops.attention(q, cache, 1, slots, start, 0.3)


def write_read_then_attend(q, k, v, cache, slots, start):
    ops.kv_write(cache, 1, slots, start, k, v)
    peek = cache[1, 0].sum()  # another reader of the written cache before the attention
    return ops.attention(q, cache, 1, slots, start, 0.3) + peek


def write_other_layer(q, k, v, cache, slots, start):
    ops.kv_write(cache, 0, slots, start, k, v)
    return ops.attention(q, cache, 1, slots, start, 0.3)


def ctx(**overrides) -> PassContext:
    return PassContext(k=1, batch=2, mode="prefill", sm=None, **overrides)


def targets(gm) -> list:
    return [node.target for node in gm.graph.nodes if node.op == "call_function"]


def test_pair_becomes_one_prefill_attention_with_the_same_bits():
    args = inputs()
    gm = make_fx(write_then_attend, tracing_mode="fake")(*[a.clone() for a in args])
    expected_cache = args[3].clone()
    expected = write_then_attend(*args[:3], expected_cache, *args[4:])
    result = fuse_prefill_attention.run(gm, ctx())
    assert result.changed and result.stats == {"fused": 1, "kept": 0}
    assert targets(result.gm).count(ops.OPS["prefill_attention"]) == 1
    assert ops.OPS["kv_write"] not in targets(result.gm) and ops.OPS["attention"] not in targets(result.gm)
    cache = args[3].clone()
    out = result.gm(*args[:3], cache, *args[4:])
    assert torch.equal(out, expected) and torch.equal(cache, expected_cache)


def test_invariant_numerics_keeps_the_pair_for_the_decode_kernel():
    """Under numerics="invariant" the write and the attention stay apart: lowered, the attention takes the
    decode kernel's invariant row, whose bits a decode forward of the same position reproduces."""
    gm = make_fx(write_then_attend, tracing_mode="fake")(*inputs())
    before = targets(gm)
    result = fuse_prefill_attention.run(gm, ctx(numerics="invariant"))
    assert not result.changed and targets(result.gm) == before
    assert ops.OPS["kv_write"] in before and ops.OPS["attention"] in before


def test_another_reader_between_keeps_the_pair():
    gm = make_fx(write_read_then_attend, tracing_mode="fake")(*inputs())
    result = fuse_prefill_attention.run(gm, ctx())
    assert not result.changed and result.stats == {"fused": 0, "kept": 1}
    assert ops.OPS["prefill_attention"] not in targets(result.gm)


def test_attention_of_another_layer_keeps_the_pair():
    result = fuse_prefill_attention.run(make_fx(write_other_layer, tracing_mode="fake")(*inputs()), ctx())
    assert not result.changed and result.stats == {"fused": 0, "kept": 1}


def test_nothing_to_do_without_kv_writes():
    gm = make_fx(lambda q, cache, slots, start: ops.attention(q, cache, 1, slots, start, 0.3), tracing_mode="fake")(
        *[inputs()[i] for i in (0, 3, 4, 5)]
    )
    result = fuse_prefill_attention.run(gm, ctx())
    assert not result.changed and result.note == "no kv_write -> attention pair to fuse"
