"""graphspec::causal_conv1d_snapshots as a Triton kernel: the verify forward's depthwise causal conv1d +
SiLU over K+1 positions per row, continuing the conv state of slot slot_ids[b] at `layer`, storing the
state (the last W-1 inputs) after every position for the "snapshot" rollback rule (graphspec/state.py).

One program per (row, block of channels). Position t's window is the W inputs ending at t: inputs
before the step come from the slot's conv state (W-1 columns), the rest from x. The slot's state itself
is never written. Accumulates in fp32 and applies SiLU in fp32 before one rounding (the reference
convolves in the weight dtype): fp32 results agree to ~1e-6 relative.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from graphspec.kernels.common import cdiv, check_config_table, check_device, next_power_of_2
from torch import Tensor

from graphspec import library
from graphspec.ops import causal_conv1d_snapshots_reference

__all__ = ["CONFIGS", "causal_conv1d_snapshots", "causal_conv1d_snapshots_reference"]

# block_c: channels per program. Untuned (no GPU timing yet).
CONFIGS: dict[int | str, dict[str, int]] = {
    80: {"block_c": 256, "num_warps": 4},
    90: {"block_c": 256, "num_warps": 4},
    "default": {"block_c": 256, "num_warps": 4},
}
CONFIG_FIELDS = check_config_table(CONFIGS)


@triton.jit
def _window(x_ptr, history_ptr, position, offs_c, mask_c, sx_t, sx_c, s_w, WIDTH: tl.constexpr):
    """Input at `position` (relative to the step's first, may be negative) for channels offs_c: from the
    conv state's column WIDTH + position when negative (its columns hold positions -WIDTH .. -1), else
    from x."""
    from_history = tl.load(history_ptr + (WIDTH + position) * s_w, mask=mask_c & (position < 0), other=0.0).to(
        tl.float32
    )
    from_x = tl.load(x_ptr + position * sx_t + offs_c * sx_c, mask=mask_c & (position >= 0), other=0.0)
    return tl.where(position < 0, from_history, from_x.to(tl.float32))


@triton.jit
def causal_conv1d_snapshots_kernel(
    x_ptr, state_ptr, slot_ptr, weight_ptr, out_ptr, snap_ptr,
    T, C,
    sx_b, sx_t, sx_c,
    ss_s, ss_c, ss_w,
    sw_c, sw_w,
    WIDTH: tl.constexpr,  # W - 1: columns of conv state
    BLOCK_C: tl.constexpr,
):  # fmt: skip
    b = tl.program_id(0).to(tl.int64)
    offs_c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    mask_c = offs_c < C
    slot = tl.load(slot_ptr + b).to(tl.int64)
    # state_ptr: the layer's [SLOTS, C, W-1]; [BLOCK_C] pointers to the slot's column 0
    history = state_ptr + slot * ss_s + offs_c * ss_c
    x_row = x_ptr + b * sx_b
    for t in range(T):
        acc = tl.zeros((BLOCK_C,), dtype=tl.float32)
        for j in tl.static_range(WIDTH + 1):  # kernel tap j reads position t + j - WIDTH
            weight = tl.load(weight_ptr + offs_c * sw_c + j * sw_w, mask=mask_c, other=0.0).to(tl.float32)
            acc += weight * _window(x_row, history, t + j - WIDTH, offs_c, mask_c, sx_t, sx_c, ss_w, WIDTH)
        out = acc / (1.0 + tl.exp(-acc))  # SiLU
        row = b * T + t
        tl.store(out_ptr + row * C + offs_c, out.to(out_ptr.dtype.element_ty), mask=mask_c)
        for i in tl.static_range(WIDTH):  # the state after t: positions t + 1 - WIDTH .. t
            value = _window(x_row, history, t + 1 + i - WIDTH, offs_c, mask_c, sx_t, sx_c, ss_w, WIDTH)
            tl.store(snap_ptr + (row * C + offs_c) * WIDTH + i, value.to(snap_ptr.dtype.element_ty), mask=mask_c)


def causal_conv1d_snapshots(
    x: Tensor,
    conv_state: Tensor,
    layer: int,
    slot_ids: Tensor,
    weight: Tensor,
    block_c: int = CONFIGS["default"]["block_c"],
    num_warps: int = CONFIGS["default"]["num_warps"],
) -> tuple[Tensor, Tensor]:
    """(out [B, T, C] in x's dtype, snapshots [B, T, C, W-1] in the state's dtype); shapes as
    graphspec.ops.causal_conv1d_snapshots, inputs of any strides."""
    check_device(x, conv_state, slot_ids, weight)
    batch, t, channels = x.shape
    width = conv_state.shape[-1]
    if weight.shape != (channels, width + 1):
        raise ValueError(
            f"causal_conv1d_snapshots kernel: weight {tuple(weight.shape)} for C={channels}, W={width + 1}"
        )
    out = torch.empty((batch, t, channels), dtype=x.dtype, device=x.device)
    snapshots = torch.empty((batch, t, channels, width), dtype=conv_state.dtype, device=x.device)
    if batch == 0 or t == 0:  # an empty batch launches nothing
        return out, snapshots
    block_c = min(next_power_of_2(block_c), next_power_of_2(channels))
    layer_state = conv_state[layer]  # a view: its offset is computed here in 64 bits, not in the kernel
    causal_conv1d_snapshots_kernel[(batch, cdiv(channels, block_c))](
        x, layer_state, slot_ids, weight, out, snapshots,
        t, channels,
        *x.stride(), *layer_state.stride(), *weight.stride(),
        WIDTH=width, BLOCK_C=block_c, num_warps=num_warps,
    )  # fmt: skip
    return out, snapshots


@library.op("graphspec::causal_conv1d_snapshots_triton", mutates_args=())
def causal_conv1d_snapshots_triton(
    x: Tensor, conv_state: Tensor, layer: int, slot_ids: Tensor, weight: Tensor, block_c: int, num_warps: int
) -> tuple[Tensor, Tensor]:
    """graphspec::causal_conv1d_snapshots lowered to causal_conv1d_snapshots_kernel; the trailing ints
    are CONFIG_FIELDS."""
    return causal_conv1d_snapshots(x, conv_state, layer, slot_ids, weight, block_c, num_warps)


@torch.library.register_fake("graphspec::causal_conv1d_snapshots_triton")
def _(x, conv_state, layer, slot_ids, weight, block_c, num_warps):
    batch, t, _ = x.shape
    return x.new_empty(x.shape), conv_state.new_empty((batch, t, *conv_state.shape[2:]))
