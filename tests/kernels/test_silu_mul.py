"""silu_mul kernel vs graphspec.ops.silu_mul_reference: the same two roundings (silu, then the product),
so 16-bit outputs equal torch's on the GPU bit for bit.

Under the interpreter the kernel's exp is numpy's, which differs from torch's CPU exp by an fp32 ulp
now and then, so on the CPU the rounding steps are checked exactly against a mirror of the reference
that uses numpy's exp, and the torch reference itself to one 16-bit ulp in rare elements."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from graphspec.kernels import silu_mul as kernel
from torch.library import opcheck

from tests.kernels.helpers import DEVICE, TOLERANCE, generator, poison_allocator, rel_error

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
# The interpreter's numpy exp and divide warn on the overflow and the NaN the inputs are chosen to hit.
pytestmark = pytest.mark.filterwarnings(
    "ignore:overflow encountered in exp:RuntimeWarning", "ignore:invalid value encountered:RuntimeWarning"
)


def make_input(shape: tuple[int, ...], dtype: torch.dtype, seed: int) -> torch.Tensor:
    """gate/up values around the bend of silu and out to where exp(-x) overflows or vanishes."""
    g = generator(seed)
    x = torch.randn(shape, generator=g) * 4
    x.view(-1)[:4] = torch.tensor([-100.0, 100.0, 0.0, -0.0])[: x.numel()]
    return x.to(DEVICE, dtype)


def mirror_reference(gate_up: torch.Tensor) -> torch.Tensor:
    """The reference's steps with numpy's fp32 exp (the interpreter's): silu in fp32 rounded to the
    dtype, then the fp32 product rounded again."""
    gate, up = gate_up.float().chunk(2, dim=-1)
    with np.errstate(over="ignore"):  # exp(100) is inf, as in the kernel
        e = torch.from_numpy(np.exp(-gate.cpu().numpy())).to(gate.device)
    silu = (gate / (1 + e)).to(gate_up.dtype)
    return (silu.float() * up).to(gate_up.dtype)


def assert_matches_reference(out: torch.Tensor, gate_up: torch.Tensor) -> None:
    reference = kernel.silu_mul_reference(gate_up)
    assert out.shape == reference.shape and out.dtype == reference.dtype and out.is_contiguous()
    if out.dtype == torch.float32:
        torch.testing.assert_close(out, reference, rtol=2e-6, atol=1e-6)
        return
    if out.device.type == "cuda":  # libdevice expf + IEEE divide: torch's exact arithmetic
        torch.testing.assert_close(out, reference, rtol=0, atol=0, equal_nan=True)
        return
    torch.testing.assert_close(out, mirror_reference(gate_up), rtol=0, atol=0, equal_nan=True)
    ulp = torch.finfo(out.dtype).eps * reference.float().abs().clamp_min(torch.finfo(out.dtype).tiny)
    diff = (out.float() - reference.float()).abs()
    assert (diff <= 2.01 * ulp).all() and (diff > 0).float().mean().item() < 1e-2


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(2, 3, 128), (5, 96), (3, 4, 2, 200), (7, 2)])
def test_silu_mul_matches_reference(dtype: torch.dtype, shape: tuple[int, ...]) -> None:
    gate_up = make_input(shape, dtype, seed=len(shape))
    poison_allocator()
    out = kernel.silu_mul(gate_up, tile_elems=64)  # several column blocks per row, partial last ones
    assert_matches_reference(out, gate_up)
    gate, up = gate_up.double().chunk(2, dim=-1)
    assert rel_error(out, gate * torch.sigmoid(gate) * up) < TOLERANCE[dtype]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_silu_mul_strided_inputs(dtype: torch.dtype) -> None:
    """Rows strided wider than 2I (a column slice of a wider projection), leading dims that do not
    collapse (the launcher's reshape copies), and a last dim that is not contiguous."""
    wide = make_input((3, 4, 160), dtype, seed=1)
    for gate_up in (wide[..., 16:144], wide[..., :128].transpose(0, 1), wide.transpose(1, 2)[:, :64:2]):
        assert_matches_reference(kernel.silu_mul(gate_up, tile_elems=32), gate_up)


def test_silu_mul_nan_and_inf_like_the_reference() -> None:
    """NaN anywhere stays NaN (a NaN with every payload bit set once rounded to 0.0), infinities
    follow IEEE like torch's: silu(+inf) = inf, silu(-inf) = -inf / inf = NaN."""
    gate_up = make_input((4, 16), torch.bfloat16, seed=2)
    raw = gate_up.view(torch.int16)
    raw[0, 0] = torch.tensor(0xFFFF, dtype=torch.int32).to(torch.int16)  # NaN gate, all payload bits
    raw[1, 9] = 0x7FC1  # NaN up
    gate_up[2, 1], gate_up[2, 2], gate_up[3, 3] = float("inf"), float("-inf"), float("inf")
    out = kernel.silu_mul(gate_up)
    reference = kernel.silu_mul_reference(gate_up)
    assert out.isnan().equal(reference.isnan()) and out.isnan().sum() >= 3
    torch.testing.assert_close(out, reference, rtol=0, atol=0, equal_nan=True)


def test_silu_mul_op_takes_config() -> None:
    gate_up = make_input((3, 64), torch.bfloat16, seed=3)
    out = torch.ops.graphspec.silu_mul_triton(gate_up, *kernel.CONFIGS[90].values())
    assert_matches_reference(out, gate_up)
    opcheck(torch.ops.graphspec.silu_mul_triton, (gate_up, 64, 4))


def test_silu_mul_empty_and_odd() -> None:
    assert kernel.silu_mul(make_input((0, 32), torch.float32, seed=4)).shape == (0, 16)
    with pytest.raises(ValueError, match="odd"):
        kernel.silu_mul(make_input((2, 31), torch.float32, seed=4))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("rows", [1, 5, 576])
def test_silu_mul_real_shapes_gpu(dtype: torch.dtype, rows: int) -> None:
    """8B (I 14336) and 1B (I 8192) MLPs at B * (K+1) rows: bit-identical to torch."""
    for inter in (14336, 8192):
        gate_up = make_input((rows, 2 * inter), dtype, seed=rows)
        out = kernel.silu_mul(gate_up, **kernel.CONFIGS[90])
        torch.testing.assert_close(out, kernel.silu_mul_reference(gate_up), rtol=0, atol=0)
