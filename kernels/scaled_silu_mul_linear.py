"""graphspec::scaled_silu_mul_linear as one Triton kernel: a one-row gate/up GEMV with the folded norm's scaled
SwiGLU as its epilogue (kernels/gemv.py's loop, two weight rows a row of output).

With folded norms (models/fold_norms.py) a one-row MLP was two launches: the gate/up GEMV writing [2I] and
graphspec::scaled_silu_mul reading it back with the residual row x to take x's RMSNorm row scale. The GEMV already
streams x over K = H, so here each program takes BLOCK_N gate rows n and the matching up rows I + n of the weight,
accumulates fp32 products elementwise as gemv does plus x's squares from the chunks it loads anyway, rounds gate and
up to the dtype (what the GEMV wrote), scales both by r = rsqrt(mean(x^2) + eps) and writes silu(r g) (r u),
rounded once, as scaled_silu_mul does. One launch and the [2I] round trip fewer per one-row MLP. Not row-invariant
(folded norms are refused under numerics="invariant").

swiglu_rows_kernel does the same for 2 to MAX_ROWS rows (a K = 4 verify's 5 rows at batch 1, a draft model's
two-row catch-up forward, small batches) with the tensor cores: the dot-free GEMVs are issue-bound from about five
rows (every weight element feeds a multiply-add per row), while a dot of the program's weight tile with x's rows
padded to 16 costs nothing next to the weight's stream. Where cuBLAS's gate/up GEMM and scaled_silu_mul's kernel
took two launches, this takes one, and it waits for the kernel before it only after asking for its first weight
tile (docs/results/2026-11-29-few-row-dot-probe: a weight-stationary dot streams the 8B gate/up at 5 rows within
2% of cuBLAS).
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

__all__ = ["CONFIGS", "MAX_ROWS", "fits", "scaled_silu_mul_linear", "scaled_silu_mul_linear_triton", "shape_class"]

MAX_ROWS = 16  # rows x may have: swiglu_rows_kernel pads x's rows to one 16-row dot operand
DOT_ROWS = 16  # tl.dot's smallest operand side

# block_n output columns (gate rows, and as many up rows) per program; block_k columns of x a step; num_warps;
# num_stages of the K loop. sm_90 from docs/results/2026-11-29-gemv-swiglu-probe (H200, 2026-11-29): 4 x 512 was
# within 0.4 us of the best of seven configs at both the 8B (56.6 us; best 56.2) and the 1B (18.4; best 18.3)
# gate/up, against 59.2 and 19.9 us for the GEMV + scaled_silu_mul. sm_80 and "default": the same row, untuned.
# (sm, "few_rows"): swiglu_rows_kernel's rows for 2 to MAX_ROWS rows (shape_class); block_n >= 16 (a dot side).
# sm_90: the probe's best weight-stationary dot at the 8B and 1B gate/up, 64 weight rows a program (here 32 gate
# and 32 up rows) x 128 columns, 4 stages (57.4 us at 5 rows against cuBLAS's 56.4 + scaled_silu_mul's ~2.6; 1B
# 17.6 against 18.0 at 2 rows). sm_80 and "default": the same, untuned.
CONFIGS: dict[int | str | tuple[int | str, str], dict[str, int]] = {
    80: {"block_n": 4, "block_k": 512, "num_warps": 4, "num_stages": 3},
    90: {"block_n": 4, "block_k": 512, "num_warps": 4, "num_stages": 3},
    "default": {"block_n": 4, "block_k": 512, "num_warps": 4, "num_stages": 3},
    **{
        (key, "few_rows"): {"block_n": 32, "block_k": 128, "num_warps": 4, "num_stages": 4}
        for key in (80, 90, "default")
    },
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


@triton.jit
def swiglu_rows_kernel(
    x_ptr,
    w_ptr,
    out_ptr,
    M,  # rows of x, 2 to BLOCK_M
    inter,
    K,
    stride_xm,
    stride_xk,
    stride_wn,
    eps,
    EVEN: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_M: tl.constexpr,  # x's rows padded (masked loads read 0) to a dot operand
    STAGES: tl.constexpr,
    LIBDEVICE_EXP: tl.constexpr,
    UPCAST: tl.constexpr,  # interpreter only: 16-bit operands go through the dot as (exact) fp32
    USE_PDL: tl.constexpr = False,
):
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < inter
    gate_rows = w_ptr + rows.to(tl.int64)[:, None] * stride_wn
    up_rows = gate_rows + inter.to(tl.int64) * stride_wn
    ms = tl.arange(0, BLOCK_M)
    m_ok = ms < M
    x_rows = x_ptr + ms.to(tl.int64)[:, None] * stride_xm
    first = tl.arange(0, BLOCK_K)
    gate = load_tile(gate_rows, first, row_ok, K, EVEN)  # no kernel writes the weight: asked for before the wait
    up = load_tile(up_rows, first, row_ok, K, EVEN)
    wait_for_earlier_kernels(USE_PDL)
    # acc [BLOCK_N, BLOCK_M]: the weight tile is the dot's left operand (its rows fill the tensor cores' wide side)
    acc_gate = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    acc_up = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    squares = tl.zeros((BLOCK_M, BLOCK_K), dtype=tl.float32)
    x = load_tile(x_rows, first, m_ok, K, False)  # never unmasked: the padding rows lie past x
    acc_gate, acc_up, squares = swiglu_rows_step(gate, up, x, acc_gate, acc_up, squares, UPCAST)
    for k0 in tl.range(BLOCK_K, K, BLOCK_K, num_stages=STAGES):
        cols = k0 + tl.arange(0, BLOCK_K)
        x = load_tile(x_rows, cols, m_ok, K, False)
        gate = load_tile(gate_rows, cols, row_ok, K, EVEN)
        up = load_tile(up_rows, cols, row_ok, K, EVEN)
        acc_gate, acc_up, squares = swiglu_rows_step(gate, up, x, acc_gate, acc_up, squares, UPCAST)
    let_later_kernels_launch(USE_PDL)
    dtype = out_ptr.dtype.element_ty
    scale = tl.rsqrt(tl.sum(squares, 1) / K + eps)[None, :]  # each row's scale, as the one-row kernel's
    gate = round_to(acc_gate, dtype) * scale  # the product rounded as the GEMM writes it, scaled in fp32
    up = round_to(acc_up, dtype) * scale
    if LIBDEVICE_EXP:
        e = libdevice.exp(-gate)
    else:
        e = tl.exp(-gate)
    out = tl.div_rn(gate, 1.0 + e) * up
    offsets = ms.to(tl.int64)[None, :] * inter + rows[:, None]  # out [M, I] contiguous, written transposed
    tl.store(out_ptr + offsets, round_to(out, dtype).to(dtype), mask=row_ok[:, None] & m_ok[None, :])


@triton.jit
def swiglu_rows_step(gate, up, x, acc_gate, acc_up, squares, UPCAST: tl.constexpr):
    """One K step of swiglu_rows_kernel: gate/up tiles [BLOCK_N, BLOCK_K] times x's rows [BLOCK_M, BLOCK_K]."""
    if UPCAST:
        gate, up, x = gate.to(tl.float32), up.to(tl.float32), x.to(tl.float32)
    x_t = tl.trans(x)
    acc_gate = tl.dot(gate, x_t, acc_gate, input_precision="ieee")
    acc_up = tl.dot(up, x_t, acc_up, input_precision="ieee")
    x32 = x.to(tl.float32)
    return acc_gate, acc_up, squares + x32 * x32


def shape_class(x: Tensor, weight_t: Tensor, *_: object) -> str | None:
    """ "few_rows" (swiglu_rows_kernel's config rows) for 2 to MAX_ROWS rows of x, else None (one row: the GEMV)."""
    return "few_rows" if x.dim() == 2 and 2 <= x.shape[0] <= MAX_ROWS else None


def fits(x: Tensor, weight_t: Tensor) -> bool:
    """1 to MAX_ROWS rows x [M, H] and a gate/up weight's transposed view weight_t [H, 2I] with contiguous columns
    (nn.Linear's weight.t()), one float dtype. Fake tensors do: the registry asks this of a node's values."""
    if x.dim() != 2 or weight_t.dim() != 2 or not 1 <= x.shape[0] <= MAX_ROWS or x.shape[1] != weight_t.shape[0]:
        return False
    if (
        weight_t.shape[1] % 2
        or x.dtype != weight_t.dtype
        or x.dtype not in (torch.float16, torch.bfloat16, torch.float32)
    ):
        return False
    return (weight_t.shape[0] <= 1 or weight_t.stride(0) == 1) and x.shape[0] * x.shape[1] * max(
        1, abs(x.stride(1))
    ) < 2**31


def scaled_silu_mul_linear(
    x: Tensor,
    weight_t: Tensor,
    eps: float,
    block_n: int = CONFIGS["default"]["block_n"],
    block_k: int = CONFIGS["default"]["block_k"],
    num_warps: int = CONFIGS["default"]["num_warps"],
    num_stages: int = CONFIGS["default"]["num_stages"],
) -> Tensor:
    """silu(r g) * (r u) of g, u = the halves of x [M, H] @ weight_t [H, 2I], r = rsqrt(mean(x^2) + eps) per row:
    [M, I]. One row runs swiglu_gemv_kernel, 2 to MAX_ROWS swiglu_rows_kernel (block_n >= 16: its "few_rows" rows)."""
    check_device(x, weight_t)
    if not fits(x, weight_t):
        raise ValueError(
            f"scaled_silu_mul_linear kernel: x {tuple(x.shape)} {x.dtype} @ weight_t {tuple(weight_t.shape)} strides "
            f"{weight_t.stride()} {weight_t.dtype} is not 1 to {MAX_ROWS} rows times a transposed gate/up weight"
        )
    (m, k), inter = x.shape, weight_t.shape[1] // 2
    if m > 1 and block_n < DOT_ROWS:
        raise ValueError(f"scaled_silu_mul_linear kernel: {m} rows take block_n >= {DOT_ROWS} (a few_rows row)")
    out = torch.empty((m, inter), dtype=x.dtype, device=x.device)
    if inter == 0:
        return out
    even = inter % block_n == 0 and k % block_k == 0 and k > 0
    if m == 1:
        swiglu_gemv_kernel[(cdiv(inter, block_n),)](
            x, weight_t, out, inter, k, x.stride(1), weight_t.stride(1), eps,
            EVEN=even, BLOCK_N=block_n, BLOCK_K=block_k, STAGES=num_stages,
            LIBDEVICE_EXP=not interpreting(), num_warps=num_warps, **pdl_launch(x.device),
        )  # fmt: skip
        return out
    # HACK(triton<=3.9 interpreter): tl.dot on bf16/fp16 operands returns garbage under TRITON_INTERPRET=1; there
    # the kernel upcasts the (exactly representable) operands to fp32 (as kernels/mm.py does).
    swiglu_rows_kernel[(cdiv(inter, block_n),)](
        x, weight_t, out, m, inter, k, x.stride(0), x.stride(1), weight_t.stride(1), eps,
        EVEN=even, BLOCK_N=block_n, BLOCK_K=block_k, BLOCK_M=DOT_ROWS, STAGES=num_stages,
        LIBDEVICE_EXP=not interpreting(), UPCAST=interpreting() and x.dtype != torch.float32, num_warps=num_warps,
        **pdl_launch(x.device),
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
