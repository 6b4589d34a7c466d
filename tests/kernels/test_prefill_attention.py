"""prefill_attention kernel vs graphspec.ops.prefill_attention_reference (CPU: interpreter, small shapes)."""

from __future__ import annotations

import pytest
import torch
from graphspec.kernels import prefill_attention as kernel
from torch.library import opcheck

from tests.kernels.helpers import DEVICE, TOLERANCE, poison_allocator, rel_error


def make_case(
    batch: int, q_heads: int, kv_heads: int, t: int, seq: int, head_dim: int, dtype: torch.dtype, seed: int
) -> tuple[torch.Tensor, ...]:
    """q [B, Hq, T, D] and k, v [B, Hkv, T, D] as transposed views of token-major tensors (as the decoder
    passes them), a cache of random values (the prefix earlier chunks wrote, garbage elsewhere), distinct
    slots, and chunk starts: row 0 at 0 (no prefix), the last row's chunk ending at the cache's end."""
    g = torch.Generator(DEVICE).manual_seed(seed)
    slots = batch + 1
    cache = torch.randn(2, 2, slots, kv_heads, seq, head_dim, generator=g, device=DEVICE).to(dtype)
    q = torch.randn(batch, t, q_heads, head_dim, generator=g, device=DEVICE).to(dtype).transpose(1, 2)
    k = torch.randn(batch, t, kv_heads, head_dim, generator=g, device=DEVICE).to(dtype).transpose(1, 2)
    v = torch.randn(batch, t, kv_heads, head_dim, generator=g, device=DEVICE).to(dtype).transpose(1, 2)
    slot_ids = torch.randperm(slots, generator=g, device=DEVICE)[:batch]
    start_pos = torch.randint(0, seq - t + 1, (batch,), generator=g, device=DEVICE)
    start_pos[0] = 0
    start_pos[-1] = seq - t
    return q, k, v, cache, slot_ids, start_pos


def run_both(q, k, v, cache, slot_ids, start_pos, scale, **config) -> tuple[torch.Tensor, ...]:
    """(kernel output, kernel's cache, reference output, reference cache, exact fp32 output)."""
    exact_cache = cache.float()
    exact = kernel.prefill_attention_reference(
        q.float(), k.float(), v.float(), exact_cache, 1, slot_ids, start_pos, scale
    )
    reference_cache = cache.clone()
    reference = kernel.prefill_attention_reference(q, k, v, reference_cache, 1, slot_ids, start_pos, scale)
    poison_allocator()
    out = kernel.prefill_attention(q, k, v, cache, 1, slot_ids, start_pos, scale, **config)
    return out, cache, reference, reference_cache, exact


def check(out, cache, reference, reference_cache, exact, valid_tokens=None) -> None:
    assert out.shape == reference.shape and out.dtype == reference.dtype and out.is_contiguous()
    # The cache: the chunk's keys and values where the reference wrote them, every other entry untouched.
    assert torch.equal(cache, reference_cache)
    if valid_tokens is not None:  # padding queries of right-padded rows: their outputs are not compared
        keep = torch.arange(out.shape[1], device=out.device)[None, :] < valid_tokens[:, None]
        out, reference, exact = out[keep], reference[keep], exact[keep]
    assert torch.isfinite(out).all(), "an output element is NaN/inf (unwritten or bad masking)"
    error = rel_error(out, exact)
    assert error < TOLERANCE[out.dtype], error
    assert error <= 2 * rel_error(reference, exact) + 1e-6, (error, rel_error(reference, exact))


# Each dtype meets every GQA ratio and both head dims; T spans more than one query and key block.
CASES = [
    (torch.float32, 1, 64),
    (torch.float32, 4, 128),
    (torch.bfloat16, 2, 64),
    (torch.bfloat16, 4, 128),
    (torch.bfloat16, 4, 256),  # Qwen3.5 / Qwen3-Next full-attention heads
]


@pytest.mark.parametrize(("dtype", "group", "head_dim"), CASES)
@pytest.mark.parametrize(("block_m", "block_n"), [(16, 16), (32, 16)])
def test_prefill_attention_matches_reference(
    dtype: torch.dtype, group: int, head_dim: int, block_m: int, block_n: int
) -> None:
    """Random chunk starts (so the cached prefix ends inside a key block) and 40 tokens (so the last
    query block is partial); block_m 32 over block_n 16 puts two key blocks on each diagonal."""
    kv_heads = 2
    case = make_case(3, kv_heads * group, kv_heads, 40, 96, head_dim, dtype, seed=group)
    check(*run_both(*case, head_dim**-0.5, block_m=block_m, block_n=block_n))


def test_prefill_attention_causal_mask_hides_later_chunk_keys() -> None:
    """Changing the chunk's last key and value moves only the last query's output."""
    q, k, v, cache, slot_ids, start_pos = make_case(2, 4, 2, 20, 64, 64, torch.float32, seed=3)
    first = kernel.prefill_attention(q, k, v, cache.clone(), 0, slot_ids, start_pos, 0.125, 16, 16, 4, 2)
    k2, v2 = k.clone(), v.clone()
    k2[:, :, -1], v2[:, :, -1] = 5.0, -3.0
    second = kernel.prefill_attention(q, k2, v2, cache.clone(), 0, slot_ids, start_pos, 0.125, 16, 16, 4, 2)
    assert torch.equal(first[:, :-1], second[:, :-1])
    assert not torch.equal(first[:, -1], second[:, -1])


def test_prefill_attention_consecutive_chunks_equal_one_chunk() -> None:
    """Two chunks (the second reading the first's keys from the cache) give the one-chunk result."""
    q, k, v, cache, _, _ = make_case(2, 4, 2, 48, 64, 64, torch.float32, seed=5)
    slot_ids = torch.tensor([2, 0], device=DEVICE)
    zero = torch.zeros(2, dtype=torch.int64, device=DEVICE)
    whole_cache = cache.clone()
    whole = kernel.prefill_attention(q, k, v, whole_cache, 1, slot_ids, zero, 0.125, 16, 16, 4, 2)
    split = 32
    parts = []
    for lo, hi in ((0, split), (split, 48)):
        start = zero + lo
        args = (q[:, :, lo:hi], k[:, :, lo:hi], v[:, :, lo:hi], cache, 1, slot_ids, start, 0.125, 16, 16, 4, 2)
        parts.append(kernel.prefill_attention(*args))
    torch.testing.assert_close(torch.cat(parts, dim=1), whole, rtol=1e-5, atol=1e-5)
    assert torch.equal(cache, whole_cache)


def test_prefill_attention_padding_rows() -> None:
    """Right-padded rows: a row whose prompt ends inside the chunk gets the reference's result on its
    real tokens (its padding tokens only write dead KV past its length), and a bucket-padding row
    pointed at the spare slot changes no other slot."""
    q, k, v, cache, _, _ = make_case(3, 8, 2, 24, 64, 64, torch.bfloat16, seed=9)
    slot_ids = torch.tensor([0, 1, 3], device=DEVICE)  # slot 3 is the spare one a padding row writes
    start_pos = torch.tensor([16, 0, 0], device=DEVICE)
    valid = torch.tensor([24, 7, 0], device=DEVICE)
    out, new_cache, reference, reference_cache, exact = run_both(
        q, k, v, cache.clone(), slot_ids, start_pos, 0.125, block_m=16, block_n=16
    )
    check(out, new_cache, reference, reference_cache, exact, valid_tokens=valid)
    assert torch.equal(new_cache[:, :, 2], cache[:, :, 2]), "a slot no row names was written"


def test_prefill_attention_mismatched_kv_raises() -> None:
    q, k, v, cache, slot_ids, start_pos = make_case(2, 4, 2, 8, 32, 64, torch.float32, seed=10)
    with pytest.raises(ValueError, match="k/v must be"):
        kernel.prefill_attention(q, k, v[:, :1], cache, 0, slot_ids, start_pos, 0.125)
    with pytest.raises(ValueError, match="does not match cache"):
        kernel.prefill_attention(q[..., :32], k, v, cache, 0, slot_ids, start_pos, 0.125)
    with pytest.raises(ValueError, match="multiple of block_n"):
        kernel.prefill_attention(q, k, v, cache, 0, slot_ids, start_pos, 0.125, 48, 32)


def test_prefill_attention_triton_opcheck() -> None:
    """The op's schema says it mutates `cache` and only that, and its fake matches."""
    q, k, v, cache, slot_ids, start_pos = make_case(2, 4, 2, 8, 32, 64, torch.bfloat16, seed=11)
    config = (16, 16, 4, 2)
    opcheck(torch.ops.graphspec.prefill_attention_triton, (q, k, v, cache, 1, slot_ids, start_pos, 0.125, *config))


@pytest.mark.gpu
@pytest.mark.parametrize("config_key", [90, "default"])
@pytest.mark.parametrize(("q_heads", "kv_heads", "head_dim"), [(32, 8, 128), (16, 4, 256)])
def test_prefill_attention_real_shapes(config_key, q_heads: int, kv_heads: int, head_dim: int) -> None:
    """Llama-3.1-8B heads (32/8 x 128) and Qwen3.5 full-attention heads (16/4 x 256, where the tiles are
    cut to the shared memory), a 512-token chunk after a 1536-token prefix, bf16."""
    q, k, v, cache, slot_ids, start_pos = make_case(2, q_heads, kv_heads, 512, 4096, head_dim, torch.bfloat16, seed=12)
    start_pos[:] = torch.tensor([0, 1536], device=DEVICE)
    config = kernel.CONFIGS[config_key]
    check(*run_both(q, k, v, cache, slot_ids, start_pos, head_dim**-0.5, **config))
