"""rotary_kv_attention (attention_kernel with ROTARY) vs the two launches it replaces, rotary_kv_write then
attention: the same output and cache bit for bit; and vs graphspec.ops.rotary_kv_attention_reference."""

from __future__ import annotations

import pytest
import torch
from graphspec.kernels import attention, block_attention, rms_norm, rotary_kv_write
from graphspec.kernels import rotary_kv_attention as kernel
from torch.library import opcheck

from graphspec import ops
from tests.kernels.helpers import (
    DEVICE,
    TOLERANCE,
    assert_rounding_equal,
    bits,
    generator,
    poison_allocator,
    projection_inputs,
    rel_error,
)

LAYERS = 2


def make_case(batch: int, q_heads: int, kv_heads: int, t: int, seq: int, head_dim: int, dtype: torch.dtype, seed: int):
    """q, k, v as the decoder passes them (transposed [B, T, H, D] slices of one qkv projection), cos/sin
    [B, T, D], a random cache (stale values at this step's positions), distinct slots, and start
    positions from 0 to the last that fits."""
    g = generator(seed)
    inputs = projection_inputs(batch, q_heads, kv_heads, t, head_dim, dtype, g)
    slots = batch + 2
    cache = torch.randn(LAYERS, 2, slots, kv_heads, seq, head_dim, generator=g).to(DEVICE, dtype)
    slot_ids = torch.randperm(slots, generator=g)[:batch].to(DEVICE)
    start_pos = torch.randint(0, seq - t + 1, (batch,), generator=g).to(DEVICE)
    start_pos[0] = 0
    start_pos[-1] = seq - t
    return tuple(inputs), cache, slot_ids, start_pos


def unfused(inputs, cache, layer, slot_ids, start_pos, scale, config, causal=True):
    """rotary_kv_write's kernel, then attention's (block_attention's when not causal): what the fused
    launch must reproduce."""
    q, k, v, cos, sin = inputs
    write_config = rotary_kv_write.CONFIGS["default"]
    q_rot = rotary_kv_write.rotary_kv_write(q, k, v, cos, sin, cache, layer, slot_ids, start_pos, **write_config)
    if not causal:
        return block_attention.block_attention(q_rot, cache, layer, slot_ids, start_pos, scale, **config)
    return attention.attention(q_rot, cache, layer, slot_ids, start_pos, scale, **config)


def assert_same_as_unfused(
    inputs, cache, layer, slot_ids, start_pos, scale, causal: bool = True, **config: int
) -> torch.Tensor:
    config = {**kernel.CONFIGS["default"], **config}
    expected_cache = cache.clone()
    expected = unfused(inputs, expected_cache, layer, slot_ids, start_pos, scale, config, causal)
    poison_allocator()
    out = kernel.rotary_kv_attention(*inputs, cache, layer, slot_ids, start_pos, scale, causal=causal, **config)
    assert out.shape == expected.shape and out.is_contiguous()
    assert torch.equal(bits(out), bits(expected))
    assert torch.equal(bits(cache), bits(expected_cache))
    return out


CASES = [  # dtype, GQA group, head dim
    (torch.float32, 1, 64),
    (torch.float32, 4, 128),
    (torch.bfloat16, 2, 64),
    (torch.bfloat16, 4, 128),
]


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize(("dtype", "group", "head_dim"), CASES)
def test_fused_launch_equals_rotary_kv_write_then_attention(
    dtype: torch.dtype, group: int, head_dim: int, causal: bool
) -> None:
    """Three rows: the step's keys at the very start of the cache, at its very end, and in between.
    causal=False: the pair is rotary_kv_write then block_attention (DFlash's block)."""
    inputs, cache, slot_ids, start_pos = make_case(3, 2 * group, 2, 3, 40, head_dim, dtype, seed=group)
    out = assert_same_as_unfused(inputs, cache, 1, slot_ids, start_pos, head_dim**-0.5, causal)
    if not causal:  # the block's window: its first query sees the block's later keys
        causal_out = assert_same_as_unfused(inputs, cache.clone(), 1, slot_ids, start_pos, head_dim**-0.5)
        assert not torch.equal(out, causal_out)


@pytest.mark.parametrize("programs_per_sm", [0, 3, 64])
def test_new_keys_straddling_blocks_and_splits(programs_per_sm: int) -> None:
    """Blocks of 16 keys, 5 new keys per row starting at 14 (two blocks), 30 and 45: one split (direct
    write), a few, and one per block, so the step's keys fall in one split or across two."""
    inputs, cache, slot_ids, start_pos = make_case(3, 4, 2, 5, 70, 64, torch.bfloat16, seed=7)
    start_pos.copy_(torch.tensor([14, 30, 45]))
    assert_same_as_unfused(inputs, cache, 0, slot_ids, start_pos, 0.125, block_n=16, programs_per_sm=programs_per_sm)


def test_many_query_rows_take_several_tiles() -> None:
    """GROUP * T > 128: two programs per (split, row, kv head) see the new keys; one writes them."""
    inputs, cache, slot_ids, start_pos = make_case(1, 16, 1, 9, 24, 64, torch.float32, seed=5)
    assert_same_as_unfused(inputs, cache, 0, slot_ids, start_pos, 0.125)


def test_positions_past_the_cache_are_neither_written_nor_attended() -> None:
    """A window running past S: those keys are dropped, as rotary_kv_write drops the write and
    attention clamps to the capacity."""
    inputs, cache, slot_ids, start_pos = make_case(2, 4, 2, 4, 32, 64, torch.float32, seed=8)
    start_pos.copy_(torch.tensor([30, 3]))
    assert_same_as_unfused(inputs, cache, 1, slot_ids, start_pos, 0.125, block_n=16)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_matches_reference(dtype: torch.dtype) -> None:
    """Against the torch reference: the cache bit for bit (a copy of rotary's rounding), the output
    within attention's tolerance."""
    inputs, cache, slot_ids, start_pos = make_case(3, 8, 2, 4, 48, 64, dtype, seed=9)
    expected_cache = cache.clone()
    expected = kernel.rotary_kv_attention_reference(*inputs, expected_cache, 1, slot_ids, start_pos, 0.125)
    exact = kernel.rotary_kv_attention_reference(
        *(x.float() for x in inputs), expected_cache.float().clone(), 1, slot_ids, start_pos, 0.125
    )
    out = kernel.rotary_kv_attention(*inputs, cache, 1, slot_ids, start_pos, 0.125)
    assert torch.equal(bits(cache), bits(expected_cache))
    assert rel_error(out, exact) < TOLERANCE[dtype]
    assert rel_error(out, exact) <= 2 * rel_error(expected, exact) + 1e-6


def norm_weights(head_dim: int, dtype: torch.dtype, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = generator(seed)
    return tuple((torch.rand(head_dim, generator=g) + 0.5).to(DEVICE, dtype) for _ in range(2))


@pytest.mark.parametrize(("dtype", "head_dim"), [(torch.float32, 64), (torch.bfloat16, 128)])
def test_qk_norm_equals_rms_norm_kernel_then_fused_launch(dtype: torch.dtype, head_dim: int) -> None:
    """Qwen3's per-head norms folded in: the same as rms_norm's kernel on q and k first (its arithmetic,
    reused), to fp32 rounding on a GPU (the row sums reduce in another order) and exactly here. In fp32
    on a GPU the cache is compared by relative error, not ulps: an ulp of difference in a normed value
    becomes many ulps of a rotated one where the rotation's two products nearly cancel (13.6 ulps seen);
    in 16 bits the rounding of the normed values absorbs it."""
    inputs, cache, slot_ids, start_pos = make_case(3, 8, 2, 4, 48, head_dim, dtype, seed=12)
    q_weight, k_weight = norm_weights(head_dim, dtype, seed=12)
    q, k, v, cos, sin = inputs
    config = {"tile_elems": 4096, "num_warps": 4}
    q_normed = rms_norm.rms_norm(q, q_weight, 1e-6, **config).transpose(1, 2).contiguous().transpose(1, 2)
    k_normed = rms_norm.rms_norm(k, k_weight, 1e-6, **config)
    expected_cache = cache.clone()
    expected = kernel.rotary_kv_attention(q_normed, k_normed, v, cos, sin, expected_cache, 1, slot_ids, start_pos, 0.1)
    out = kernel.rotary_kv_attention(*inputs, cache, 1, slot_ids, start_pos, 0.1, q_weight, k_weight, 1e-6)
    if DEVICE.type == "cuda":
        if dtype == torch.float32:
            assert rel_error(cache, expected_cache) < TOLERANCE[dtype]
        else:
            assert_rounding_equal(cache, expected_cache)
        assert rel_error(out, expected) < TOLERANCE[dtype]
    else:
        assert torch.equal(bits(cache), bits(expected_cache)) and torch.equal(bits(out), bits(expected))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_qk_norm_matches_reference(dtype: torch.dtype) -> None:
    inputs, cache, slot_ids, start_pos = make_case(2, 4, 2, 5, 40, 64, dtype, seed=13)
    q_weight, k_weight = norm_weights(64, dtype, seed=13)
    expected_cache = cache.clone()
    args = (1, slot_ids, start_pos, 0.125, q_weight, k_weight, 1e-6)
    expected = kernel.rotary_kv_attention_reference(*inputs, expected_cache, *args)
    out = kernel.rotary_kv_attention(*inputs, cache, *args)
    if dtype == torch.float32:  # torch's mean and the kernel's sum / D differ in the last bit
        torch.testing.assert_close(cache, expected_cache, rtol=1e-5, atol=1e-6)
    else:
        assert_rounding_equal(cache, expected_cache)
    assert rel_error(out, expected) < TOLERANCE[dtype]


def test_qk_norm_needs_both_weights() -> None:
    inputs, cache, slot_ids, start_pos = make_case(2, 4, 2, 3, 32, 64, torch.float32, seed=14)
    q_weight, _ = norm_weights(64, torch.float32, seed=14)
    with pytest.raises(ValueError, match="come together"):
        kernel.rotary_kv_attention(*inputs, cache, 0, slot_ids, start_pos, 0.125, q_weight, None)


def row_scaled(inputs, hidden: int, dtype: torch.dtype, seed: int):
    """(the source rows src [B, T, hidden] of a folded input norm, inputs with q, k and v scaled by its row scale
    through graphspec::row_scale's reference on their projection: what the fused launch must compute from src)."""
    q, k, v, cos, sin = inputs
    batch, t = q.shape[0], q.shape[2]
    src = (torch.randn(batch, t, hidden, generator=generator(seed)) * 2).to(DEVICE, dtype)
    scaled = tuple(
        ops.row_scale_reference(x.transpose(1, 2).reshape(batch, t, -1), src, 1e-5).view(x.transpose(1, 2).shape)
        for x in (q, k, v)
    )  # row_scale is elementwise per row: the projection's parts scale alone alike
    return src, (*(x.transpose(1, 2) for x in scaled), cos, sin)


@pytest.mark.parametrize(("dtype", "t", "qk_norm"), [(torch.float32, 3, False), (torch.bfloat16, 5, False),
                                                     (torch.bfloat16, 1, True), (torch.float32, 4, True)])  # fmt: skip
def test_row_scale_equals_the_scaled_projection_then_fused_launch(dtype: torch.dtype, t: int, qk_norm: bool) -> None:
    """A folded input norm's row scale (row_src): the same as scaling q, k and v first (graphspec::row_scale's
    reference), with Qwen3's per-head norms after it when given; to the row sums' fp32 rounding (the kernel sums
    the source rows in its own order: in 16 bits the roundings absorb it)."""
    inputs, cache, slot_ids, start_pos = make_case(3, 8, 2, t, 48, 64, dtype, seed=15 + t)
    src, scaled = row_scaled(inputs, 96, dtype, seed=t)
    norms = (*norm_weights(64, dtype, seed=t), 1e-6) if qk_norm else (None, None, 1e-6)
    expected_cache = cache.clone()
    expected = kernel.rotary_kv_attention(*scaled, expected_cache, 1, slot_ids, start_pos, 0.1, *norms)
    out = kernel.rotary_kv_attention(*inputs, cache, 1, slot_ids, start_pos, 0.1, *norms, True, src, 1e-5)
    if dtype == torch.float32:
        torch.testing.assert_close(cache, expected_cache, rtol=1e-5, atol=1e-6)
    else:
        assert_rounding_equal(cache, expected_cache)
    assert rel_error(out, expected) < TOLERANCE[dtype]


def test_row_scale_matches_reference() -> None:
    inputs, cache, slot_ids, start_pos = make_case(2, 4, 2, 5, 40, 64, torch.bfloat16, seed=16)
    src, _ = row_scaled(inputs, 128, torch.bfloat16, seed=16)
    expected_cache = cache.clone()
    args = (1, slot_ids, start_pos, 0.125, None, None, 1e-6, True, src, 1e-5)
    expected = kernel.rotary_kv_attention_reference(*inputs, expected_cache, *args)
    out = kernel.rotary_kv_attention(*inputs, cache, *args)
    assert_rounding_equal(cache, expected_cache)
    assert rel_error(out, expected) < TOLERANCE[torch.bfloat16]


def test_row_scale_refuses_rows_of_another_shape() -> None:
    inputs, cache, slot_ids, start_pos = make_case(2, 4, 2, 3, 32, 64, torch.float32, seed=17)
    src, _ = row_scaled(inputs, 96, torch.float32, seed=17)
    with pytest.raises(ValueError, match="row_scale needs"):
        kernel.rotary_kv_attention(*inputs, cache, 0, slot_ids, start_pos, 0.125, None, None, 1e-6, True, src[:, :2])


def test_mismatched_kv_raises() -> None:
    inputs, cache, slot_ids, start_pos = make_case(2, 4, 2, 3, 32, 64, torch.float32, seed=10)
    q, k, v, cos, sin = inputs
    with pytest.raises(ValueError, match="k/v must be"):
        kernel.rotary_kv_attention(q, k, v[:, :1], cos, sin, cache, 0, slot_ids, start_pos, 0.125)
    with pytest.raises(ValueError, match="cos/sin must be"):
        kernel.rotary_kv_attention(q, k, v, cos[:, :1], sin, cache, 0, slot_ids, start_pos, 0.125)


def test_rotary_kv_attention_triton_opcheck() -> None:
    """The op's schema says it mutates `cache` and only that, and its fake matches."""
    inputs, cache, slot_ids, start_pos = make_case(2, 4, 2, 3, 32, 64, torch.bfloat16, seed=11)
    config = tuple(kernel.CONFIGS["default"].values())
    for causal in (True, False):
        args = (*inputs, cache, 1, slot_ids, start_pos, 0.125, None, None, 1e-6, causal, None, 0.0, *config)
        opcheck(torch.ops.graphspec.rotary_kv_attention_triton, args)
    src, _ = row_scaled(inputs, 96, torch.bfloat16, seed=11)
    args = (*inputs, cache, 1, slot_ids, start_pos, 0.125, None, None, 1e-6, True, src, 1e-5, *config)
    opcheck(torch.ops.graphspec.rotary_kv_attention_triton, args)


# ---------------------------------------------------------------------------------------------------
# GPU: the benchmark pair's heads (8B: 32/8 x 128; 1B: 32/8 x 64) at decode shapes, and CUDA-graph replay.
# ---------------------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize(("batch", "t", "seq", "head_dim"), [(1, 5, 1024, 128), (1, 2, 1024, 64), (8, 5, 4096, 128)])
def test_fused_launch_real_shapes_gpu(batch: int, t: int, seq: int, head_dim: int) -> None:
    inputs, cache, slot_ids, start_pos = make_case(batch, 32, 8, t, seq, head_dim, torch.bfloat16, seed=batch + t)
    start_pos[-1] = 511  # the benchmark's context
    assert_same_as_unfused(inputs, cache, 1, slot_ids, start_pos, head_dim**-0.5, **kernel.CONFIGS[90])


@pytest.mark.gpu
def test_fused_launch_replays_in_cuda_graph_gpu() -> None:
    inputs, cache, slot_ids, start_pos = make_case(2, 32, 8, 5, 2048, 128, torch.bfloat16, seed=1)
    config = tuple(kernel.CONFIGS[90].values())
    op = torch.ops.graphspec.rotary_kv_attention_triton
    config = (None, None, 1e-6, True, None, 0.0, *config)  # no q/k norms, causal, no row scale, then CONFIG_FIELDS
    op(*inputs, cache.clone(), 1, slot_ids, start_pos, 0.088, *config)  # compile outside capture
    graph = torch.cuda.CUDAGraph()
    captured_cache = cache.clone()
    with torch.cuda.graph(graph):
        out = op(*inputs, captured_cache, 1, slot_ids, start_pos, 0.088, *config)
    start_pos.copy_(torch.tensor([700, 64]))
    slot_ids.copy_(slot_ids.flip(0))
    captured_cache.copy_(cache)
    graph.replay()
    eager_cache = cache.clone()
    expected = op(*inputs, eager_cache, 1, slot_ids, start_pos, 0.088, *config)
    assert torch.equal(bits(out), bits(expected)) and torch.equal(bits(captured_cache), bits(eager_cache))


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("q_heads", "batch", "t", "causal"),
    [(32, 1, 5, True), (16, 1, 5, True), (32, 8, 5, True), (32, 1, 8, False), (32, 4, 8, False)],
)
def test_qk_norm_real_shapes_gpu(q_heads: int, batch: int, t: int, causal: bool) -> None:
    """Qwen3-8B (32/8 heads) and 0.6B (16/8) shapes, D 128: a verify of 5 and a DFlash block of 8 (causal=False),
    against rms_norm's kernel, then rotary_kv_write's and the attention's (block_attention's) launches, to
    rms_norm's fp32 rounding."""
    inputs, cache, slot_ids, start_pos = make_case(batch, q_heads, 8, t, 2048, 128, torch.bfloat16, seed=q_heads + t)
    start_pos[-1] = 511
    q_weight, k_weight = norm_weights(128, torch.bfloat16, seed=q_heads)
    q, k, v, cos, sin = inputs
    config = dict(kernel.CONFIGS[90])
    q_normed = rms_norm.rms_norm(q, q_weight, 1e-6).transpose(1, 2).contiguous().transpose(1, 2)
    k_normed = rms_norm.rms_norm(k, k_weight, 1e-6)
    expected_cache = cache.clone()
    normed = (q_normed, k_normed, v, cos, sin)
    expected = unfused(normed, expected_cache, 1, slot_ids, start_pos, 0.088, config, causal)
    out = kernel.rotary_kv_attention(
        *inputs, cache, 1, slot_ids, start_pos, 0.088, q_weight, k_weight, 1e-6, causal, **config
    )
    assert_rounding_equal(cache, expected_cache)
    assert rel_error(out, expected) < TOLERANCE[torch.bfloat16]


@pytest.mark.gpu
@pytest.mark.parametrize(("q_heads", "hidden", "batch", "t"), [(32, 4096, 1, 1), (32, 4096, 1, 5), (32, 4096, 16, 5),
                                                               (32, 2048, 1, 1)])  # fmt: skip
def test_row_scale_real_shapes_gpu(q_heads: int, hidden: int, batch: int, t: int) -> None:
    """A folded input norm at the benchmark pair's shapes (8B: hidden 4096, D 128; 1B: 2048, D 64): decode, a
    verify of 5 at B = 1 and 16; against the scaled projection then the fused launch, to the row sums' rounding."""
    head_dim = 128 if hidden == 4096 else 64
    inputs, cache, slot_ids, start_pos = make_case(batch, q_heads, 8, t, 1024, head_dim, torch.bfloat16, seed=t)
    start_pos[-1] = 511
    src, scaled = row_scaled(inputs, hidden, torch.bfloat16, seed=batch)
    config = dict(kernel.CONFIGS[90])
    expected_cache = cache.clone()
    expected = kernel.rotary_kv_attention(*scaled, expected_cache, 1, slot_ids, start_pos, 0.088, **config)
    out = kernel.rotary_kv_attention(
        *inputs, cache, 1, slot_ids, start_pos, 0.088, None, None, 1e-6, True, src, 1e-5, **config
    )
    assert_rounding_equal(cache, expected_cache)
    assert rel_error(out, expected) < TOLERANCE[torch.bfloat16]
