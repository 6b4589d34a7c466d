"""kv_write kernel vs the graphspec::kv_write reference op: a copy, so the caches match bit for bit."""

from __future__ import annotations

import pytest
import torch
from graphspec.kernels import kv_write as kernel
from torch.library import opcheck

from tests.kernels.helpers import DEVICE, bits, generator

LAYERS, SLOTS, SEQ = 2, 5, 16


def make_inputs(
    batch: int, kv_heads: int, t: int, head_dim: int, cache_dtype: torch.dtype, kv_dtype: torch.dtype, seed: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A random cache, k as rotary returns it (contiguous [B, H, T, D]) and v as the decoder passes it:
    a [B, T, H, D] slice of the fused qkv projection, transposed (no two of its strides contiguous)."""
    g = generator(seed)
    cache = torch.randn(LAYERS, 2, SLOTS, kv_heads, SEQ, head_dim, generator=g).to(DEVICE, cache_dtype)
    k = torch.randn(batch, kv_heads, t, head_dim, generator=g).to(DEVICE, kv_dtype)
    qkv = torch.randn(batch, t, 3 * kv_heads * head_dim, generator=g).to(DEVICE, kv_dtype)
    v = qkv[..., 2 * kv_heads * head_dim :].view(batch, t, kv_heads, head_dim).transpose(1, 2)
    return cache, k, v


def index(*values: int) -> torch.Tensor:
    return torch.tensor(values, device=DEVICE)


@pytest.mark.parametrize(
    ("cache_dtype", "kv_dtype"),
    [
        (torch.float32, torch.float32),
        (torch.bfloat16, torch.bfloat16),
        (torch.bfloat16, torch.float32),  # cast like the reference's .to(cache.dtype): nearest even
        (torch.float16, torch.bfloat16),
    ],
)
@pytest.mark.parametrize(("kv_heads", "head_dim"), [(2, 64), (3, 40)])
def test_kv_write_matches_reference(
    cache_dtype: torch.dtype, kv_dtype: torch.dtype, kv_heads: int, head_dim: int
) -> None:
    """Three rows in scattered slots, one at position 0 and one ending exactly at S; small tiles so
    one program holds rows of several batch rows and heads."""
    cache, k, v = make_inputs(3, kv_heads, 4, head_dim, cache_dtype, kv_dtype, seed=kv_heads)
    slots, start = index(4, 0, 2), index(5, 0, SEQ - 4)
    expected = cache.clone()
    kernel.kv_write_reference(expected, 1, slots, start, k, v)
    kernel.kv_write(cache, 1, slots, start, k, v, tile_elems=256)
    assert torch.equal(bits(cache), bits(expected))


def test_kv_write_moves_bits_unchanged() -> None:
    """Same dtype: a raw copy, so NaN payloads, infinities and -0.0 land in the cache as they were."""
    cache, k, v = make_inputs(2, 2, 3, 64, torch.bfloat16, torch.bfloat16, seed=3)
    specials = torch.tensor([0x7FFF, 0xFFC1, 0x7F81, 0x8000, 0x7F80, 0xFF80], dtype=torch.int32).to(torch.int16)
    k.view(torch.int16).view(-1)[: specials.numel()] = specials.to(DEVICE)
    slots, start = index(1, 3), index(2, 9)
    expected = cache.clone()
    kernel.kv_write_reference(expected, 0, slots, start, k, v)
    torch.ops.graphspec.kv_write_triton(cache, 0, slots, start, k, v, *kernel.CONFIGS["default"].values())
    assert torch.equal(bits(cache), bits(expected))


def test_kv_write_single_token_int32_indices() -> None:
    """T = 1 (a decode step without drafts) and int32 slot/position tensors."""
    cache, k, v = make_inputs(4, 2, 1, 64, torch.float32, torch.float32, seed=4)
    slots = index(3, 1, 0, 4).to(torch.int32)
    start = index(0, 15, 7, 8).to(torch.int32)
    expected = cache.clone()
    kernel.kv_write_reference(expected, 1, slots, start, k, v)
    kernel.kv_write(cache, 1, slots, start, k, v)
    assert torch.equal(bits(cache), bits(expected))


def test_kv_write_drops_targets_outside_the_cache() -> None:
    """Where the reference would raise (position >= S, slot >= SLOTS) or wrap a negative index to the
    other end, the kernel writes nothing for that (row, token); every in-range token is written."""
    cache, k, v = make_inputs(4, 2, 4, 64, torch.bfloat16, torch.bfloat16, seed=5)
    slots = index(1, 3, SLOTS, 2)
    start = index(SEQ - 2, -2, 0, 4)  # row 0: t 2, 3 past S; row 1: t 0, 1 before 0; row 2: no such slot
    expected = cache.clone()
    expected[1, 0, 1, :, SEQ - 2 :] = k[0, :, :2]
    expected[1, 1, 1, :, SEQ - 2 :] = v[0, :, :2]
    expected[1, 0, 3, :, :2] = k[1, :, 2:]
    expected[1, 1, 3, :, :2] = v[1, :, 2:]
    expected[1, 0, 2, :, 4:8] = k[3]
    expected[1, 1, 2, :, 4:8] = v[3]
    kernel.kv_write(cache, 1, slots, start, k, v, tile_elems=128)
    assert torch.equal(bits(cache), bits(expected))


def test_kv_write_empty_batch_writes_nothing() -> None:
    cache, k, v = make_inputs(0, 2, 3, 64, torch.float32, torch.float32, seed=6)
    before = cache.clone()
    kernel.kv_write(cache, 0, index(), index(), k, v)
    assert torch.equal(cache, before)


def test_kv_write_shape_mismatch_raises() -> None:
    cache, k, v = make_inputs(2, 2, 3, 64, torch.float32, torch.float32, seed=7)
    with pytest.raises(ValueError, match="do not fit"):
        kernel.kv_write(cache, 0, index(0, 1), index(0, 0), k, v[..., :32])


def test_kv_write_triton_opcheck() -> None:
    """The op's schema says it mutates `cache` and only that, its fake matches, and it survives
    torch.compile-style dispatch (fake tensors, functionalization)."""
    cache, k, v = make_inputs(2, 2, 3, 64, torch.bfloat16, torch.bfloat16, seed=8)
    opcheck(torch.ops.graphspec.kv_write_triton, (cache, 1, index(4, 0), index(3, 0), k, v, 256, 4))


@pytest.mark.gpu
@pytest.mark.parametrize(("batch", "t"), [(1, 5), (64, 9)])
def test_kv_write_real_shapes_gpu(batch: int, t: int) -> None:
    """8B-class KV: 8 kv heads of 128, bf16, rows in a shuffled subset of 65 slots."""
    g = generator(batch)
    cache = torch.randn(2, 2, 65, 8, 256, 128, generator=g).to(DEVICE, torch.bfloat16)
    k = torch.randn(batch, 8, t, 128, generator=g).to(DEVICE, torch.bfloat16)
    v = torch.randn(batch, t, 8, 128, generator=g).to(DEVICE, torch.bfloat16).transpose(1, 2)
    slots = torch.randperm(65, generator=g)[:batch].to(DEVICE)
    start = torch.randint(0, 256 - t + 1, (batch,), generator=g).to(DEVICE)
    expected = cache.clone()
    kernel.kv_write_reference(expected, 1, slots, start, k, v)
    kernel.kv_write(cache, 1, slots, start, k, v, **kernel.CONFIGS[90])
    assert torch.equal(bits(cache), bits(expected))


@pytest.mark.gpu
@pytest.mark.slow
def test_kv_write_offsets_past_int32_gpu() -> None:
    """A 9 GB bf16 cache: layer 1, V, slot 32 starts past element 2**32, where int32 offsets would wrap
    into another slot (or out of the allocation)."""
    cache = torch.zeros(2, 2, 33, 8, 32768, 128, dtype=torch.bfloat16, device=DEVICE)
    assert (cache[1, 1, 32].data_ptr() - cache.data_ptr()) // cache.element_size() > 2**32
    k = torch.randn(2, 8, 5, 128, device=DEVICE).to(torch.bfloat16)
    v = torch.randn(2, 8, 5, 128, device=DEVICE).to(torch.bfloat16)
    slots, start = index(32, 31), index(32768 - 5, 100)
    kernel.kv_write(cache, 1, slots, start, k, v, **kernel.CONFIGS[90])
    assert torch.equal(cache[1, 0, 32, :, -5:], k[0]) and torch.equal(cache[1, 1, 32, :, -5:], v[0])
    assert torch.equal(cache[1, 0, 31, :, 100:105], k[1]) and torch.equal(cache[1, 1, 31, :, 100:105], v[1])
    written = cache.count_nonzero().item()
    assert written == k.count_nonzero().item() + v.count_nonzero().item()  # nothing landed anywhere else
