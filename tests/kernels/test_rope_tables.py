"""rope_tables kernel vs graphspec.ops.rope_tables_reference: one fp32 multiply per angle, then cos and sin.

On the GPU the kernel's cos and sin are libdevice's (torch's CUDA calls), so the tables equal torch's bit for
bit, at the angles of long positions too. Under the interpreter they are numpy's, within an fp32 ulp or so of
torch's CPU ones; the angles themselves (the cast and the multiply) are checked exactly through a mirror."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from graphspec.kernels import rope_tables as kernel
from torch.library import opcheck

from tests.kernels.helpers import DEVICE, generator, poison_allocator


def inv_freq(half: int, base: float = 500000.0) -> torch.Tensor:
    return (1.0 / base ** (torch.arange(0, 2 * half, 2, dtype=torch.float32) / (2 * half))).to(DEVICE)


def positions(shape: tuple[int, ...], dtype: torch.dtype, seed: int, high: int = 131072) -> torch.Tensor:
    """Random positions up to 128k (angles up to ~1e5 rad at the fastest frequency), with 0 and the top."""
    x = torch.randint(0, high, shape, generator=generator(seed), dtype=torch.int64)
    x.view(-1)[:2] = torch.tensor([0, high - 1])[: x.numel()]
    return x.to(DEVICE, dtype)


def mirror(pos: torch.Tensor, freq: torch.Tensor, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The reference's steps with numpy's fp32 cos and sin (the interpreter's)."""
    angles = (pos.to(torch.float32)[..., None] * freq).cpu().numpy()
    angles = np.concatenate([angles, angles], axis=-1)
    cos, sin = (torch.from_numpy(f(angles)).to(pos.device) for f in (np.cos, np.sin))
    return (cos, sin) if scale == 1.0 else (cos * scale, sin * scale)


def check(pos: torch.Tensor, freq: torch.Tensor, scale: float, **config: int) -> None:
    poison_allocator()
    cos, sin = kernel.rope_tables(pos, freq, scale, **config)
    want = kernel.rope_tables_reference(pos, freq, scale)
    for got, expected in zip((cos, sin), want, strict=True):
        assert got.shape == expected.shape and got.dtype == torch.float32 and got.is_contiguous()
        if got.device.type == "cuda":  # libdevice cosf / sinf: torch's own
            torch.testing.assert_close(got, expected, rtol=0, atol=0)
        else:
            torch.testing.assert_close(got, expected, rtol=0, atol=2e-7)
    if pos.device.type == "cpu":  # the cast and the multiply exactly, through numpy's cos and sin
        for got, expected in zip((cos, sin), mirror(pos, freq, scale), strict=True):
            torch.testing.assert_close(got, expected, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
@pytest.mark.parametrize(("shape", "half"), [((1, 1), 64), ((16, 5), 64), ((3, 37), 32), ((7,), 8)])
def test_rope_tables_match_reference(dtype: torch.dtype, shape: tuple[int, ...], half: int) -> None:
    """A decode position, a verify block of 16 rows (several programs), a ragged prefill-like block, 1-D."""
    check(positions(shape, dtype, seed=half + len(shape)), inv_freq(half), 1.0, block_p=16)


def test_rope_tables_scale_is_one_more_multiply() -> None:
    """A rope type's attention factor (YaRN's, say): both tables times it, in fp32."""
    check(positions((4, 6), torch.int64, seed=3), inv_freq(48), 0.8125, block_p=8)


def test_rope_tables_refuses_what_it_does_not_compute() -> None:
    freq = inv_freq(16)
    with pytest.raises(ValueError, match="positions must be integers"):
        kernel.rope_tables(torch.zeros(2, 3, device=DEVICE), freq, 1.0)
    with pytest.raises(ValueError, match="inv_freq must be fp32"):
        kernel.rope_tables(positions((2, 3), torch.int64, seed=0), freq.double(), 1.0)


def test_rope_tables_op_takes_config() -> None:
    pos, freq = positions((2, 5), torch.int64, seed=4), inv_freq(32)
    cos, sin = torch.ops.graphspec.rope_tables_triton(pos, freq, 1.0, 4, 1)
    want = kernel.rope_tables_reference(pos, freq, 1.0)
    torch.testing.assert_close(cos, want[0], rtol=0, atol=2e-7)
    torch.testing.assert_close(sin, want[1], rtol=0, atol=2e-7)
    args = (pos, freq, 1.0, 4, 1)
    opcheck(torch.ops.graphspec.rope_tables_triton, args, test_utils=("test_schema", "test_faketensor"))


@pytest.mark.gpu
@pytest.mark.parametrize(("shape", "half"), [((1, 1), 64), ((16, 5), 64), ((1, 4096), 64), ((64, 5), 128)])
def test_rope_tables_real_shapes_gpu(shape: tuple[int, ...], half: int) -> None:
    """Decode, a B = 16 verify, a prefill chunk, B = 64 at head dim 256; bitwise torch's."""
    check(positions(shape, torch.int64, seed=half), inv_freq(half), 1.0, **kernel.CONFIGS["default"])
    check(positions(shape, torch.int64, seed=half + 1), inv_freq(half), 0.7, **kernel.CONFIGS["default"])
