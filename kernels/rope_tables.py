"""graphspec::rope_tables as a Triton kernel: the cos and sin tables of a forward's positions in one launch.

Rounding is the reference's (graphspec.ops.rope_tables_reference): the position converted to fp32 (round to
nearest), one fp32 multiply by inv_freq, then cos and sin. On the GPU they are libdevice's cosf and sinf,
the functions torch's CUDA cos and sin call (tl.cos and tl.sin are the approximate hardware instructions,
which lose all accuracy at the angles of long positions), so the tables are bit-identical to torch's;
the scale, when not 1, is one more fp32 multiply, as torch's. Under the interpreter cos and sin are
numpy's, an fp32 ulp away from torch's CPU ones now and then.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from graphspec.kernels.common import cdiv, check_config_table, check_device, interpreting, next_power_of_2
from torch import Tensor
from triton.language.extra import libdevice

from graphspec import library
from graphspec.ops import rope_tables_reference

__all__ = ["CONFIGS", "rope_tables", "rope_tables_reference", "rope_tables_triton"]

# block_p: positions per program (each writes its [block_p, D] rows of both tables). Untuned, one row for every
# SM: a decode or verify forward has 1-320 positions (one to 20 programs), a prefill chunk up to thousands.
CONFIGS: dict[int | str, dict[str, int]] = {sm: {"block_p": 16, "num_warps": 4} for sm in (80, 90, "default")}
CONFIG_FIELDS = check_config_table(CONFIGS)
MAX_HALF = 256  # inv_freq entries (D / 2) a program's row holds in registers; head dims up to 512


@triton.jit
def rope_tables_kernel(
    positions_ptr,
    inv_freq_ptr,
    cos_ptr,
    sin_ptr,
    count,  # positions
    half,  # D / 2
    scale,
    SCALED: tl.constexpr,
    BLOCK_P: tl.constexpr,
    BLOCK_H: tl.constexpr,
    LIBDEVICE: tl.constexpr,
):
    p = tl.program_id(0).to(tl.int64) * BLOCK_P + tl.arange(0, BLOCK_P)
    h = tl.arange(0, BLOCK_H)
    p_ok, h_ok = p < count, h < half
    position = tl.load(positions_ptr + p, mask=p_ok, other=0).to(tl.float32)
    freq = tl.load(inv_freq_ptr + h, mask=h_ok, other=0.0)
    angle = position[:, None] * freq[None, :]  # [BLOCK_P, BLOCK_H]
    if LIBDEVICE:  # __nv_cosf / __nv_sinf, what torch's CUDA cos and sin call
        cos = libdevice.cos(angle)
        sin = libdevice.sin(angle)
    else:  # the interpreter has no libdevice
        cos = tl.cos(angle)
        sin = tl.sin(angle)
    if SCALED:
        cos = cos * scale
        sin = sin * scale
    mask = p_ok[:, None] & h_ok[None, :]
    offsets = p[:, None] * (2 * half) + h[None, :]  # the first half of each row; the second repeats it
    tl.store(cos_ptr + offsets, cos, mask=mask)
    tl.store(cos_ptr + offsets + half, cos, mask=mask)
    tl.store(sin_ptr + offsets, sin, mask=mask)
    tl.store(sin_ptr + offsets + half, sin, mask=mask)


def rope_tables(
    positions: Tensor,
    inv_freq: Tensor,
    scale: float,
    block_p: int = CONFIGS["default"]["block_p"],
    num_warps: int = CONFIGS["default"]["num_warps"],
) -> tuple[Tensor, Tensor]:
    """cos and sin [..., D] (new, contiguous, fp32) of integer positions [...] and fp32 inv_freq [D/2]."""
    check_device(positions, inv_freq)
    if positions.dtype.is_floating_point or positions.dtype == torch.bool:
        raise ValueError(f"rope_tables kernel: positions must be integers, got {positions.dtype}")
    if inv_freq.dtype != torch.float32 or inv_freq.dim() != 1:
        got = f"{inv_freq.dtype} {list(inv_freq.shape)}"
        raise ValueError(f"rope_tables kernel: inv_freq must be fp32 [D/2], got {got}")
    half = inv_freq.shape[0]
    shape = (*positions.shape, 2 * half)
    cos = torch.empty(shape, dtype=torch.float32, device=positions.device)
    sin = torch.empty(shape, dtype=torch.float32, device=positions.device)
    count = positions.numel()
    if count == 0 or half == 0:
        return cos, sin
    block_p = next_power_of_2(block_p)
    rope_tables_kernel[(cdiv(count, block_p),)](
        positions.reshape(-1), inv_freq.contiguous(), cos, sin, count, half, float(scale),
        SCALED=scale != 1.0, BLOCK_P=block_p, BLOCK_H=next_power_of_2(half), LIBDEVICE=not interpreting(),
        num_warps=num_warps,
    )  # fmt: skip
    return cos, sin


@library.op("graphspec::rope_tables_triton", mutates_args=())
def rope_tables_triton(
    positions: Tensor, inv_freq: Tensor, scale: float, block_p: int, num_warps: int
) -> tuple[Tensor, Tensor]:
    """graphspec::rope_tables lowered to rope_tables_kernel; the trailing ints are CONFIG_FIELDS."""
    return rope_tables(positions, inv_freq, scale, block_p, num_warps)


@torch.library.register_fake("graphspec::rope_tables_triton")
def _(positions, inv_freq, scale, block_p, num_warps):
    shape = (*positions.shape, 2 * inv_freq.shape[-1])
    return inv_freq.new_empty(shape, dtype=torch.float32), inv_freq.new_empty(shape, dtype=torch.float32)
