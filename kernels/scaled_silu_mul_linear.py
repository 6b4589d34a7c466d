"""graphspec::scaled_silu_mul_linear as one Triton kernel: a one- or two-row gate/up GEMV with the folded norm's
scaled SwiGLU as its epilogue (kernels/gemv.py's loops, two weight rows a column of output).

With folded norms (models/fold_norms.py) a one-row MLP was two launches: the gate/up GEMV writing [2I] and
graphspec::scaled_silu_mul reading it back with the residual row x to take x's RMSNorm row scale. The GEMV already
streams x over K = H, so here each program takes BLOCK_N gate rows n and the matching up rows I + n of the weight,
accumulates fp32 products elementwise as gemv does plus x's squares from the chunks it loads anyway, rounds gate and
up to the dtype (what the GEMV wrote), scales both by r = rsqrt(mean(x^2) + eps) and writes silu(r g) (r u),
rounded once, as scaled_silu_mul does. One launch and the [2I] round trip fewer per one-row MLP. Not row-invariant
(folded norms are refused under numerics="invariant").

Two rows (a 1B draft model's catch-up forward at batch 1, a batch-2 decode) take swiglu_two_rows_kernel, the same
with a row axis as gemv.few_rows_kernel: the weight streams once for both rows, each row with its own scale.
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
from graphspec.kernels.gemv import load_rows, load_tile, load_vector
from torch import Tensor
from triton.language.extra import libdevice

from graphspec import library

__all__ = ["CONFIGS", "MAX_ROWS", "fits", "scaled_silu_mul_linear", "scaled_silu_mul_linear_triton"]

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
# The most rows x may have: a 1B draft model's two-row catch-up forward at batch 1, a batch-2 decode.
MAX_ROWS = 2


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


@triton.jit
def swiglu_two_rows_kernel(
    x_ptr,
    w_ptr,
    out_ptr,
    M,
    inter,  # I: gate is weight rows [0, I), up rows [I, 2I)
    K,
    stride_xm,
    stride_xk,
    stride_wn,
    eps,
    EVEN: tl.constexpr,  # I % BLOCK_N == 0 and K % BLOCK_K == 0: no masks on the weight
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    STAGES: tl.constexpr,
    LIBDEVICE_EXP: tl.constexpr,
    USE_PDL: tl.constexpr = False,
):
    # swiglu_gemv_kernel with a row axis (as gemv.few_rows_kernel is gemv_kernel's): each weight tile is loaded once
    # and multiplied into every row's accumulators; each row takes its own row scale. It waits first, as
    # few_rows_kernel does (an early tile costs registers there).
    wait_for_earlier_kernels(USE_PDL)
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < inter
    ms = tl.arange(0, BLOCK_M)
    m_ok = ms < M
    gate_rows = w_ptr + rows.to(tl.int64)[:, None] * stride_wn
    up_rows = gate_rows + inter.to(tl.int64) * stride_wn
    x_rows = x_ptr + ms[:, None] * stride_xm
    acc_gate = tl.zeros((BLOCK_M, BLOCK_N, BLOCK_K), dtype=tl.float32)
    acc_up = tl.zeros((BLOCK_M, BLOCK_N, BLOCK_K), dtype=tl.float32)
    squares = tl.zeros((BLOCK_M, BLOCK_K), dtype=tl.float32)
    for k0 in tl.range(0, K, BLOCK_K, num_stages=STAGES):
        cols = k0 + tl.arange(0, BLOCK_K)
        x = load_rows(x_rows, cols, m_ok, stride_xk, K, EVEN).to(tl.float32)
        gate = load_tile(gate_rows, cols, row_ok, K, EVEN)
        up = load_tile(up_rows, cols, row_ok, K, EVEN)
        acc_gate += gate.to(tl.float32)[None, :, :] * x[:, None, :]
        acc_up += up.to(tl.float32)[None, :, :] * x[:, None, :]
        squares += x * x
    let_later_kernels_launch(USE_PDL)
    dtype = out_ptr.dtype.element_ty
    scale = tl.rsqrt(tl.sum(squares, 1) / K + eps)[:, None]  # each row's scale (scaled_silu_mul's rsqrt)
    gate = round_to(tl.sum(acc_gate, 2), dtype) * scale  # the GEMV's rounded output, scaled in fp32
    up = round_to(tl.sum(acc_up, 2), dtype) * scale
    if LIBDEVICE_EXP:  # __nv_expf, as scaled_silu_mul (and torch's CUDA silu)
        e = libdevice.exp(-gate)
    else:  # the interpreter has no libdevice
        e = tl.exp(-gate)
    out = tl.div_rn(gate, 1.0 + e) * up
    mask = m_ok[:, None] & row_ok[None, :]
    tl.store(out_ptr + ms[:, None] * inter + rows[None, :], round_to(out, dtype).to(dtype), mask=mask)


def fits(x: Tensor, weight_t: Tensor) -> bool:
    """One to MAX_ROWS rows x [M, H] and a gate/up weight's transposed view weight_t [H, 2I] with contiguous columns
    (nn.Linear's weight.t()), one float dtype. Fake tensors do: the registry asks this of a node's values."""
    if x.dim() != 2 or weight_t.dim() != 2 or not 1 <= x.shape[0] <= MAX_ROWS or x.shape[1] != weight_t.shape[0]:
        return False
    if (
        weight_t.shape[1] % 2
        or x.dtype != weight_t.dtype
        or x.dtype not in (torch.float16, torch.bfloat16, torch.float32)
    ):
        return False
    last = (x.shape[0] - 1) * abs(x.stride(0)) + x.shape[1] * max(1, abs(x.stride(1)))
    return (
        (weight_t.shape[0] <= 1 or weight_t.stride(0) == 1) and last < 2**31 and x.shape[0] * weight_t.shape[1] < 2**31
    )


def scaled_silu_mul_linear(
    x: Tensor,
    weight_t: Tensor,
    eps: float,
    block_n: int = CONFIGS["default"]["block_n"],
    block_k: int = CONFIGS["default"]["block_k"],
    num_warps: int = CONFIGS["default"]["num_warps"],
    num_stages: int = CONFIGS["default"]["num_stages"],
) -> Tensor:
    """silu(r g) * (r u) of g, u = the halves of x [M, H] @ weight_t [H, 2I], r = rsqrt(mean(x^2) + eps) of each
    row: [M, I]. One row takes swiglu_gemv_kernel, two swiglu_two_rows_kernel."""
    check_device(x, weight_t)
    if not fits(x, weight_t):
        raise ValueError(
            f"scaled_silu_mul_linear kernel: x {tuple(x.shape)} {x.dtype} @ weight_t {tuple(weight_t.shape)} strides "
            f"{weight_t.stride()} {weight_t.dtype} is not 1 to {MAX_ROWS} rows times a transposed gate/up weight"
        )
    (m, k), inter = x.shape, weight_t.shape[1] // 2
    out = torch.empty((m, inter), dtype=x.dtype, device=x.device)
    if inter == 0:
        return out
    even = inter % block_n == 0 and k % block_k == 0 and k > 0
    if m == 1:
        swiglu_gemv_kernel[(cdiv(inter, block_n),)](
            x, weight_t, out, inter, k, x.stride(1), weight_t.stride(1), eps, EVEN=even, BLOCK_N=block_n,
            BLOCK_K=block_k, STAGES=num_stages, LIBDEVICE_EXP=not interpreting(), num_warps=num_warps,
            **pdl_launch(x.device),
        )  # fmt: skip
        return out
    swiglu_two_rows_kernel[(cdiv(inter, block_n),)](
        x, weight_t, out, m, inter, k, x.stride(0), x.stride(1), weight_t.stride(1), eps, EVEN=even, BLOCK_M=MAX_ROWS,
        BLOCK_N=block_n, BLOCK_K=block_k, STAGES=num_stages, LIBDEVICE_EXP=not interpreting(), num_warps=num_warps,
        **pdl_launch(x.device),
    )  # fmt: skip
    return out


@library.op("graphspec::scaled_silu_mul_linear_triton", mutates_args=())
def scaled_silu_mul_linear_triton(
    x: Tensor, weight_t: Tensor, eps: float, block_n: int, block_k: int, num_warps: int, num_stages: int
) -> Tensor:
    """graphspec::scaled_silu_mul_linear lowered to swiglu_gemv_kernel (two rows: swiglu_two_rows_kernel); the trailing
    ints are CONFIG_FIELDS."""
    return scaled_silu_mul_linear(x, weight_t, eps, block_n, block_k, num_warps, num_stages)


@torch.library.register_fake("graphspec::scaled_silu_mul_linear_triton")
def _(x, weight_t, eps, *config):
    return x.new_empty((x.shape[0], weight_t.shape[1] // 2))
