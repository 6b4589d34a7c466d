"""graphspec::scaled_silu_mul_linear as one Triton kernel: a one-row gate/up GEMV with the folded norm's scaled
SwiGLU as its epilogue (kernels/gemv.py's loop, two weight rows a row of output).

With folded norms (models/fold_norms.py) a one-row MLP was two launches: the gate/up GEMV writing [2I] and
graphspec::scaled_silu_mul reading it back with the residual row x to take x's RMSNorm row scale. The GEMV already
streams x over K = H, so here each program takes BLOCK_N gate rows n and the matching up rows I + n of the weight,
accumulates fp32 products elementwise as gemv does plus x's squares from the chunks it loads anyway, rounds gate and
up to the dtype (what the GEMV wrote), scales both by r = rsqrt(mean(x^2) + eps) and writes silu(r g) (r u),
rounded once, as scaled_silu_mul does. One launch and the [2I] round trip fewer per one-row MLP. Not row-invariant
(folded norms are refused under numerics="invariant").
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from graphspec.kernels.common import (
    cdiv,
    check_config_table,
    check_device,
    interpreting,
    let_later_kernels_launch,
    pdl_launch,
    round_to,
    wait_for_earlier_kernels,
)
from graphspec.kernels.gemv import load_tile, load_vector
from torch import Tensor
from triton.language.extra import libdevice

from graphspec import library

__all__ = ["CONFIGS", "fits", "scaled_silu_mul_linear", "scaled_silu_mul_linear_triton"]

# block_n output columns (gate rows, and as many up rows) per program; block_k columns of x a step; num_warps;
# num_stages of the K loop. sm_90 from docs/results/2026-11-29-gemv-swiglu-probe (H200, 2026-11-29): 4 x 512 was
# within 0.4 us of the best of seven configs at both the 8B (56.6 us; best 56.2) and the 1B (18.4; best 18.3)
# gate/up, against 59.2 and 19.9 us for the GEMV + scaled_silu_mul. sm_80 and "default": the same row, untuned.
CONFIGS: dict[int | str, dict[str, int]] = {
    80: {"block_n": 4, "block_k": 512, "num_warps": 4, "num_stages": 3},
    90: {"block_n": 4, "block_k": 512, "num_warps": 4, "num_stages": 3},
    "default": {"block_n": 4, "block_k": 512, "num_warps": 4, "num_stages": 3},
}
CONFIG_FIELDS = check_config_table(CONFIGS)


@triton.jit
def swiglu_gemv_kernel(
    x_ptr,
    w_ptr,
    out_ptr,
    inter,  # I: gate is weight rows [0, I), up rows [I, 2I)
    K,
    stride_xk,
    stride_wn,
    eps,
    EVEN: tl.constexpr,  # I % BLOCK_N == 0 and K % BLOCK_K == 0: no masks
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    STAGES: tl.constexpr,
    LIBDEVICE_EXP: tl.constexpr,
    USE_PDL: tl.constexpr = False,  # launched with programmatic dependent launch (common.pdl_launch)
):
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < inter
    gate_rows = w_ptr + rows.to(tl.int64)[:, None] * stride_wn
    up_rows = gate_rows + inter.to(tl.int64) * stride_wn
    first = tl.arange(0, BLOCK_K)
    gate = load_tile(gate_rows, first, row_ok, K, EVEN)  # no kernel writes the weight: asked for before the wait
    up = load_tile(up_rows, first, row_ok, K, EVEN)
    wait_for_earlier_kernels(USE_PDL)
    x = load_vector(x_ptr, first, stride_xk, K, EVEN).to(tl.float32)
    acc_gate = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    acc_up = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    squares = tl.zeros((BLOCK_K,), dtype=tl.float32)
    acc_gate += gate.to(tl.float32) * x[None, :]
    acc_up += up.to(tl.float32) * x[None, :]
    squares += x * x
    for k0 in tl.range(BLOCK_K, K, BLOCK_K, num_stages=STAGES):
        cols = k0 + tl.arange(0, BLOCK_K)
        x = load_vector(x_ptr, cols, stride_xk, K, EVEN).to(tl.float32)
        gate = load_tile(gate_rows, cols, row_ok, K, EVEN)
        up = load_tile(up_rows, cols, row_ok, K, EVEN)
        acc_gate += gate.to(tl.float32) * x[None, :]
        acc_up += up.to(tl.float32) * x[None, :]
        squares += x * x
    let_later_kernels_launch(USE_PDL)
    dtype = out_ptr.dtype.element_ty
    scale = tl.rsqrt(tl.sum(squares, 0) / K + eps)  # scaled_silu_mul's row scale (its rsqrt)
    gate = round_to(tl.sum(acc_gate, 1), dtype) * scale  # the GEMV's rounded output, scaled in fp32
    up = round_to(tl.sum(acc_up, 1), dtype) * scale
    if LIBDEVICE_EXP:  # __nv_expf, as scaled_silu_mul (and torch's CUDA silu)
        e = libdevice.exp(-gate)
    else:  # the interpreter has no libdevice
        e = tl.exp(-gate)
    out = tl.div_rn(gate, 1.0 + e) * up
    tl.store(out_ptr + rows, round_to(out, dtype).to(dtype), mask=row_ok)


def fits(x: Tensor, weight_t: Tensor) -> bool:
    """One row x [1, H] and a gate/up weight's transposed view weight_t [H, 2I] with contiguous columns (nn.Linear's
    weight.t()), one float dtype. Fake tensors do: the registry asks this of a node's values."""
    if x.dim() != 2 or weight_t.dim() != 2 or x.shape[0] != 1 or x.shape[1] != weight_t.shape[0]:
        return False
    if (
        weight_t.shape[1] % 2
        or x.dtype != weight_t.dtype
        or x.dtype not in (torch.float16, torch.bfloat16, torch.float32)
    ):
        return False
    return (weight_t.shape[0] <= 1 or weight_t.stride(0) == 1) and x.shape[1] * max(1, abs(x.stride(1))) < 2**31


def scaled_silu_mul_linear(
    x: Tensor,
    weight_t: Tensor,
    eps: float,
    block_n: int = CONFIGS["default"]["block_n"],
    block_k: int = CONFIGS["default"]["block_k"],
    num_warps: int = CONFIGS["default"]["num_warps"],
    num_stages: int = CONFIGS["default"]["num_stages"],
) -> Tensor:
    """silu(r g) * (r u) of g, u = the halves of x [1, H] @ weight_t [H, 2I], r = rsqrt(mean(x^2) + eps): [1, I]."""
    check_device(x, weight_t)
    if not fits(x, weight_t):
        raise ValueError(
            f"scaled_silu_mul_linear kernel: x {tuple(x.shape)} {x.dtype} @ weight_t {tuple(weight_t.shape)} strides "
            f"{weight_t.stride()} {weight_t.dtype} is not one row times a transposed gate/up weight"
        )
    k, inter = x.shape[1], weight_t.shape[1] // 2
    out = torch.empty((1, inter), dtype=x.dtype, device=x.device)
    if inter == 0:
        return out
    swiglu_gemv_kernel[(cdiv(inter, block_n),)](
        x, weight_t, out, inter, k, x.stride(1), weight_t.stride(1), eps,
        EVEN=inter % block_n == 0 and k % block_k == 0 and k > 0, BLOCK_N=block_n, BLOCK_K=block_k, STAGES=num_stages,
        LIBDEVICE_EXP=not interpreting(), num_warps=num_warps, **pdl_launch(x.device),
    )  # fmt: skip
    return out


@library.op("graphspec::scaled_silu_mul_linear_triton", mutates_args=())
def scaled_silu_mul_linear_triton(
    x: Tensor, weight_t: Tensor, eps: float, block_n: int, block_k: int, num_warps: int, num_stages: int
) -> Tensor:
    """graphspec::scaled_silu_mul_linear lowered to swiglu_gemv_kernel; the trailing ints are CONFIG_FIELDS."""
    return scaled_silu_mul_linear(x, weight_t, eps, block_n, block_k, num_warps, num_stages)


@torch.library.register_fake("graphspec::scaled_silu_mul_linear_triton")
def _(x, weight_t, eps, *config):
    return x.new_empty((x.shape[0], weight_t.shape[1] // 2))
