"""rotary_kv_write kernel vs graphspec.ops.rotary_kv_write_reference (rotary, then kv_write of the rotated k):
the rotary's rounding and a copy into the cache, so q and the cache match bit for bit in bf16."""

from __future__ import annotations

import pytest
import torch
from graphspec.kernels import rms_norm
from graphspec.kernels import rotary_kv_write as kernel
from torch.library import opcheck

from graphspec.ops import rotary_reference
from tests.kernels.helpers import (
    DEVICE,
    assert_rounding_equal,
    bits,
    generator,
    poison_allocator,
    projection_inputs,
    rel_error,
)

LAYERS, SLOTS, SEQ = 2, 5, 16


def make_inputs(
    batch: int,
    q_heads: int,
    kv_heads: int,
    t: int,
    head_dim: int,
    dtype: torch.dtype,
    seed: int,
    cache_dtype: torch.dtype | None = None,
) -> list[torch.Tensor]:
    """q, k, v, cos, sin (helpers.projection_inputs) and a random cache."""
    g = generator(seed)
    inputs = projection_inputs(batch, q_heads, kv_heads, t, head_dim, dtype, g)
    cache = torch.randn(LAYERS, 2, SLOTS, kv_heads, SEQ, head_dim, generator=g).to(DEVICE, cache_dtype or dtype)
    return [*inputs, cache]


def index(*values: int) -> torch.Tensor:
    return torch.tensor(values, device=DEVICE)


def run_both(inputs: list[torch.Tensor], layer: int, slots: torch.Tensor, start: torch.Tensor, **config: int):
    """(kernel q_out, kernel cache, reference q_out, reference cache), each side on its own cache copy."""
    q, k, v, cos, sin, cache = inputs
    expected_cache, cache = cache.clone(), cache.clone()
    expected = kernel.rotary_kv_write_reference(q, k, v, cos, sin, expected_cache, layer, slots, start)
    poison_allocator()
    q_out = kernel.rotary_kv_write(q, k, v, cos, sin, cache, layer, slots, start, **config)
    return q_out, cache, expected, expected_cache


def assert_rotary_equal(out: torch.Tensor, expected: torch.Tensor) -> None:
    # fp32 on the GPU may fuse a product into an FMA (as in test_rotary): an ulp there; else bit-exact.
    tolerance = 2e-6 if out.dtype == torch.float32 and out.device.type == "cuda" else 0.0
    torch.testing.assert_close(out, expected, rtol=tolerance, atol=tolerance)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("q_heads", "kv_heads", "head_dim"), [(4, 4, 64), (8, 2, 128), (6, 3, 96)])
def test_rotary_kv_write_matches_reference(dtype: torch.dtype, q_heads: int, kv_heads: int, head_dim: int) -> None:
    """GQA and a head dim that is not a power of 2; three rows in scattered slots, one at position 0 and
    one ending exactly at S; head blocks of 4 straddle the q/k boundary."""
    inputs = make_inputs(3, q_heads, kv_heads, 4, head_dim, dtype, seed=q_heads)
    q_out, cache, expected, expected_cache = run_both(inputs, 1, index(4, 0, 2), index(5, 0, SEQ - 4), block_h=4)
    assert q_out.is_contiguous() and q_out.shape == inputs[0].shape
    assert_rotary_equal(q_out, expected)
    assert_rotary_equal(cache, expected_cache)
    if dtype == torch.bfloat16 or DEVICE.type != "cuda":
        assert torch.equal(bits(cache), bits(expected_cache))


@pytest.mark.parametrize(("dtype", "cache_dtype"), [(torch.bfloat16, torch.float32), (torch.float32, torch.bfloat16)])
def test_rotated_k_is_cast_to_the_cache_dtype_like_kv_write(dtype: torch.dtype, cache_dtype: torch.dtype) -> None:
    """The rotated k is rounded to the model dtype first, then converted like .to(cache.dtype)."""
    inputs = make_inputs(2, 4, 2, 3, 64, dtype, seed=1, cache_dtype=cache_dtype)
    q_out, cache, expected, expected_cache = run_both(inputs, 0, index(1, 3), index(2, 9))
    assert_rotary_equal(q_out, expected)
    assert_rotary_equal(cache, expected_cache)


def test_single_token_int32_indices_default_config() -> None:
    """T = 1 (a decode step without drafts) and int32 slot/position tensors, through the op."""
    q, k, v, cos, sin, cache = make_inputs(4, 4, 2, 1, 64, torch.bfloat16, seed=2)
    slots, start = index(3, 1, 0, 4).to(torch.int32), index(0, 15, 7, 8).to(torch.int32)
    expected_cache = cache.clone()
    expected = kernel.rotary_kv_write_reference(q, k, v, cos, sin, expected_cache, 1, slots, start)
    config = kernel.CONFIGS["default"].values()
    q_out = torch.ops.graphspec.rotary_kv_write_triton(
        q, k, v, cos, sin, cache, 1, slots, start, None, None, 1e-6, *config
    )
    assert torch.equal(q_out, expected)
    assert torch.equal(bits(cache), bits(expected_cache))


def norm_weights(head_dim: int, dtype: torch.dtype, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = generator(seed)
    return tuple((torch.rand(head_dim, generator=g) + 0.5).to(DEVICE, dtype) for _ in range(2))


def assert_normed_equal(out: torch.Tensor, expected: torch.Tensor) -> None:
    """The folded norm sums a row's squares as its two halves' sums (the reference: one mean), so fp32
    results may differ in the last bit; bf16 ones round the same (helpers.assert_rounding_equal)."""
    if out.dtype == torch.float32:
        torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-6)
    else:
        assert_rounding_equal(out, expected)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("q_heads", "kv_heads", "head_dim"), [(4, 2, 64), (6, 3, 96)])
def test_qk_norm_matches_reference(dtype: torch.dtype, q_heads: int, kv_heads: int, head_dim: int) -> None:
    """Per-head norms folded in (fuse_qk_norm): each q and k head row rms_norm'ed before the rotation,
    the normed, rotated k in the cache; head blocks of 4 straddle the q/k boundary."""
    q, k, v, cos, sin, cache = make_inputs(3, q_heads, kv_heads, 4, head_dim, dtype, seed=8)
    q_weight, k_weight = norm_weights(head_dim, dtype, seed=8)
    slots, start = index(4, 0, 2), index(5, 0, SEQ - 4)
    expected_cache = cache.clone()
    args = (slots, start, q_weight, k_weight, 1e-6)
    expected = kernel.rotary_kv_write_reference(q, k, v, cos, sin, expected_cache, 1, *args)
    q_out = kernel.rotary_kv_write(q, k, v, cos, sin, cache, 1, *args, block_h=4)
    assert_normed_equal(q_out, expected)
    assert_normed_equal(cache, expected_cache)
    # The norms did something: without them the rotated q differs.
    assert not torch.allclose(
        q_out, kernel.rotary_kv_write_reference(q, k, v, cos, sin, cache.clone(), 1, slots, start)
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_k_as_its_own_q_with_norm(dtype: torch.dtype) -> None:
    """DFlash's context rows: q is the same tensor as k (only the cache write matters) and both norm
    weights are k_norm's, as fuse_qk_norm folds them."""
    _, k, v, cos, sin, cache = make_inputs(2, 2, 2, 5, 64, dtype, seed=9)
    weight, _ = norm_weights(64, dtype, seed=9)
    slots, start = index(1, 3), index(0, 7)
    expected_cache = cache.clone()
    kernel.rotary_kv_write_reference(k, k, v, cos, sin, expected_cache, 0, slots, start, weight, weight, 1e-5)
    kernel.rotary_kv_write(k, k, v, cos, sin, cache, 0, slots, start, weight, weight, 1e-5)
    assert_normed_equal(cache, expected_cache)


def test_qk_norm_needs_both_weights() -> None:
    q, k, v, cos, sin, cache = make_inputs(2, 4, 2, 3, 64, torch.float32, seed=10)
    weight, _ = norm_weights(64, torch.float32, seed=10)
    with pytest.raises(ValueError, match="come together"):
        kernel.rotary_kv_write(q, k, v, cos, sin, cache, 0, index(0, 1), index(0, 0), weight, None)
    with pytest.raises(ValueError, match="contiguous"):
        kernel.rotary_kv_write(q, k, v, cos, sin, cache, 0, index(0, 1), index(0, 0), weight[:32], weight[:32])


def test_targets_outside_the_cache_are_dropped_and_q_still_rotated() -> None:
    """Where the reference would raise (position >= S, slot >= SLOTS) or wrap a negative index, the
    kernel writes no K/V for that (row, token), as kernels/kv_write.py does; q is rotated regardless."""
    q, k, v, cos, sin, cache = make_inputs(4, 4, 2, 4, 64, torch.bfloat16, seed=3)
    slots = index(1, 3, SLOTS, 2)
    start = index(SEQ - 2, -2, 0, 4)  # row 0: t 2, 3 past S; row 1: t 0, 1 before 0; row 2: no such slot
    q_rot, k_rot = rotary_reference(q, k, cos, sin)
    expected = cache.clone()
    landed = [  # (row, slot, cache positions, its tokens) of every in-range write
        (0, 1, slice(SEQ - 2, None), slice(0, 2)),
        (1, 3, slice(0, 2), slice(2, 4)),
        (3, 2, slice(4, 8), slice(0, 4)),
    ]
    for row, slot, positions, tokens in landed:
        expected[1, 0, slot, :, positions] = k_rot[row, :, tokens]
        expected[1, 1, slot, :, positions] = v[row, :, tokens]
    q_out = kernel.rotary_kv_write(q, k, v, cos, sin, cache, 1, slots, start, block_h=4)
    assert torch.equal(q_out, q_rot)
    assert torch.equal(bits(cache), bits(expected))


def test_empty_batch_writes_nothing() -> None:
    q, k, v, cos, sin, cache = make_inputs(0, 4, 2, 3, 64, torch.float32, seed=4)
    before = cache.clone()
    q_out = kernel.rotary_kv_write(q, k, v, cos, sin, cache, 0, index(), index())
    assert q_out.shape == q.shape and torch.equal(cache, before)


def test_shape_mismatch_raises() -> None:
    q, k, v, cos, sin, cache = make_inputs(2, 4, 2, 3, 64, torch.float32, seed=5)
    with pytest.raises(ValueError, match="do not fit"):
        kernel.rotary_kv_write(q, k, v[..., :32], cos, sin, cache, 0, index(0, 1), index(0, 0))
    with pytest.raises(ValueError, match="do not match"):
        kernel.rotary_kv_write(q, k.to(torch.bfloat16), v, cos, sin, cache, 0, index(0, 1), index(0, 0))


def test_rotary_kv_write_triton_opcheck() -> None:
    """The op's schema says it mutates `cache` and only that, and its fake matches."""
    q, k, v, cos, sin, cache = make_inputs(2, 4, 2, 3, 64, torch.bfloat16, seed=6)
    args = (q, k, v, cos, sin, cache, 1, index(4, 0), index(3, 0))
    opcheck(torch.ops.graphspec.rotary_kv_write_triton, (*args, None, None, 1e-6, 4, 4))
    q_weight, k_weight = norm_weights(64, torch.bfloat16, seed=6)
    opcheck(torch.ops.graphspec.rotary_kv_write_triton, (*args, q_weight, k_weight, 1e-6, 4, 4))


@pytest.mark.gpu
@pytest.mark.parametrize(("batch", "t"), [(1, 5), (64, 9)])
@pytest.mark.parametrize("normed", [False, True])
def test_rotary_kv_write_real_shapes_gpu(batch: int, t: int, normed: bool) -> None:
    """8B-class attention: 32 q heads, 8 kv heads of 128, bf16, rows in a shuffled subset of 65 slots;
    normed: with per-head norms folded in (a Qwen3-shaped DFlash drafter's context rows)."""
    q, k, v, cos, sin, _ = make_inputs(batch, 32, 8, t, 128, torch.bfloat16, seed=batch)
    g = generator(batch)
    cache = torch.randn(2, 2, 65, 8, 256, 128, generator=g).to(DEVICE, torch.bfloat16)
    slots = torch.randperm(65, generator=g)[:batch].to(DEVICE)
    start = torch.randint(0, 256 - t + 1, (batch,), generator=g).to(DEVICE)
    if not normed:
        q_out, got, expected, expected_cache = run_both(
            [q, k, v, cos, sin, cache], 1, slots, start, **kernel.CONFIGS[90]
        )
        assert torch.equal(q_out, expected)
        assert torch.equal(bits(got), bits(expected_cache))
        return
    # Against the launches the fold replaces: rms_norm's kernel on q and k (the same arithmetic but the
    # row sum's order), then this kernel without norms; bits may differ where a normed value lands one
    # ulp apart (and the rotation's cancellations stretch that), so: rarely, and no further from the
    # exact fp32 result than those launches are.
    q_weight, k_weight = norm_weights(128, torch.bfloat16, seed=batch)
    q_normed = rms_norm.rms_norm(q, q_weight, 1e-6).transpose(1, 2).contiguous().transpose(1, 2)
    k_normed = rms_norm.rms_norm(k, k_weight, 1e-6)
    unfused_cache, exact_cache = cache.clone(), cache.float()
    config = kernel.CONFIGS[90]
    unfused = kernel.rotary_kv_write(q_normed, k_normed, v, cos, sin, unfused_cache, 1, slots, start, **config)
    exact = kernel.rotary_kv_write_reference(
        q.float(),
        k.float(),
        v.float(),
        cos,
        sin,
        exact_cache,
        1,
        slots,
        start,
        q_weight.float(),
        k_weight.float(),
        1e-6,
    )
    q_out = kernel.rotary_kv_write(q, k, v, cos, sin, cache, 1, slots, start, q_weight, k_weight, 1e-6, **config)
    for got, launches, truth in ((q_out, unfused, exact), (cache, unfused_cache, exact_cache)):
        assert (got != launches).float().mean() < 0.01
        assert rel_error(got, truth) <= 1.5 * rel_error(launches, truth) + 1e-6


@pytest.mark.gpu
@pytest.mark.slow
def test_rotary_kv_write_offsets_past_int32_gpu() -> None:
    """A 9 GB bf16 cache: layer 1, V, slot 32 starts past element 2**32, where int32 offsets would wrap."""
    cache = torch.zeros(2, 2, 33, 8, 32768, 128, dtype=torch.bfloat16, device=DEVICE)
    q, k, v, cos, sin, _ = make_inputs(2, 32, 8, 5, 128, torch.bfloat16, seed=7)
    slots, start = index(32, 31), index(32768 - 5, 100)
    q_out = kernel.rotary_kv_write(q, k, v, cos, sin, cache, 1, slots, start, **kernel.CONFIGS[90])
    q_rot, k_rot = rotary_reference(q, k, cos, sin)
    assert torch.equal(q_out, q_rot)
    assert torch.equal(cache[1, 0, 32, :, -5:], k_rot[0]) and torch.equal(cache[1, 1, 32, :, -5:], v[0])
    assert torch.equal(cache[1, 0, 31, :, 100:105], k_rot[1]) and torch.equal(cache[1, 1, 31, :, 100:105], v[1])
    written = cache.count_nonzero().item()
    assert written == k_rot.count_nonzero().item() + v.count_nonzero().item()  # nothing landed anywhere else
