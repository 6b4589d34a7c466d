"""The one-row product x [1, K] @ W.t() (W [N, K], an nn.Linear weight) without tensor cores: a decode's
projections at batch 1 (the target's one-token forward, a draft model's or EAGLE-3 head's draft forwards).

Why not cuBLAS: at M = 1 every projection streams its weight once, so the product is as fast as the weight
can be read. cuBLAS (no workspace, graphspec's setting) tiles N by 64 and reads q/k/v [6144 x 4096] at 75%
of the H200's copy rate, a 1B draft's o projection at 33%. This kernel gives each program BLOCK_N weight
rows (8: 768 programs for q/k/v on 132 SMs) across all of K, BLOCK_K columns a step, fp32 products
accumulated elementwise in a [BLOCK_N, BLOCK_K] tile and summed once at the end: on an H200 11-13% faster
than cuBLAS at the 8B's q/k/v and o, 6% at down, 0-3% at gate/up and lm_head, 17-25% at the 1B's q/k/v, o and
down (docs/BENCHMARKS.md, 2026-11-29; a batch-1 8B decode 4% faster). It is mm's,
addmm's and addmm_in_place's kernel for one-row products by default (their (sm, "one_row") config rows,
block_m = 1); under numerics="invariant" mm and addmm keep kernels/mm.py's tiles at every M instead.

An addend [N] (a bias, or a [1, N] residual: the folded norm's residual add) is added to the fp32 sum
before the one rounding, as cuBLAS does with beta = 1; the output may be the addend itself (each program
reads its rows of the addend before it writes them).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from graphspec.kernels.common import cdiv, check_device, round_to
from torch import Tensor

__all__ = ["CONFIGS", "fits", "gemv"]

# mm's CONFIG_FIELDS: block_m 1 marks this kernel; block_n weight rows per program; block_k columns a step;
# split_programs unused (0: K is never split); num_warps; num_stages of the K loop. 90: the best row of
# docs/results/2026-11-29-gemv-probe over the 8B and 1B projections at M = 1 (within 0.7 us of each
# projection's best config; a 1B down projection [2048 x 8192] would take 1 us less with 4 x 1024).
# 80 and "default" (any other SM): the same, untuned.
CONFIGS: dict[int | str, dict[str, int]] = {
    80: {"block_m": 1, "block_n": 8, "block_k": 512, "split_programs": 0, "num_warps": 4, "num_stages": 3},
    90: {"block_m": 1, "block_n": 8, "block_k": 512, "split_programs": 0, "num_warps": 4, "num_stages": 3},
    "default": {"block_m": 1, "block_n": 8, "block_k": 512, "split_programs": 0, "num_warps": 4, "num_stages": 3},
}


@triton.jit
def gemv_kernel(
    x_ptr,
    w_ptr,
    addend_ptr,
    out_ptr,
    N,
    K,
    stride_xk,
    stride_wn,
    HAS_ADDEND: tl.constexpr,
    EVEN: tl.constexpr,  # N % BLOCK_N == 0 and K % BLOCK_K == 0: no masks
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    STAGES: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < N
    w_rows = w_ptr + rows.to(tl.int64)[:, None] * stride_wn
    acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    for k0 in tl.range(0, K, BLOCK_K, num_stages=STAGES):
        cols = k0 + tl.arange(0, BLOCK_K)
        if EVEN:
            w = tl.load(w_rows + cols[None, :])
            x = tl.load(x_ptr + cols * stride_xk)
        else:
            col_ok = cols < K
            w = tl.load(w_rows + cols[None, :], mask=row_ok[:, None] & col_ok[None, :], other=0.0)
            x = tl.load(x_ptr + cols * stride_xk, mask=col_ok, other=0.0)
        acc += w.to(tl.float32) * x.to(tl.float32)[None, :]
    total = tl.sum(acc, 1)
    if HAS_ADDEND:
        total += tl.load(addend_ptr + rows, mask=row_ok, other=0.0).to(tl.float32)
    dtype = out_ptr.dtype.element_ty
    tl.store(out_ptr + rows, round_to(total, dtype).to(dtype), mask=row_ok)


def fits(x: Tensor, w_t: Tensor, addend: Tensor | None = None) -> bool:
    """Whether gemv takes these operands: one row x [1, K] and a weight's transposed view w_t [K, N] whose
    columns are contiguous (strides (1, K'), as nn.Linear's weight.t()), one float dtype, and an addend of N
    contiguous elements ([N] or [1, N]). Fake tensors do: the registry asks this of a node's values."""
    if x.dim() != 2 or w_t.dim() != 2 or x.shape[0] != 1 or x.shape[1] != w_t.shape[0]:
        return False
    n = w_t.shape[1]
    if x.dtype != w_t.dtype or x.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        return False
    if w_t.shape[0] > 1 and w_t.stride(0) != 1:
        return False
    if addend is not None and (addend.dim() not in (1, 2) or addend.numel() != n or addend.shape[-1] != n):
        return False  # a scalar or a [M, 1] addend would broadcast: not N elements in a row
    if addend is not None and ((n > 1 and addend.stride(-1) != 1) or addend.dtype != x.dtype):
        return False
    return x.shape[1] * max(1, abs(x.stride(1))) < 2**31  # x's offsets are int32 (the weight's rows are int64)


def gemv(
    x: Tensor,
    w_t: Tensor,
    addend: Tensor | None = None,
    out: Tensor | None = None,
    block_n: int = CONFIGS["default"]["block_n"],
    block_k: int = CONFIGS["default"]["block_k"],
    num_warps: int = CONFIGS["default"]["num_warps"],
    num_stages: int = CONFIGS["default"]["num_stages"],
) -> Tensor:
    """x [1, K] @ w_t [K, N] (+ addend) into `out` ([1, N] of x's dtype, may be the addend; a new tensor if
    None), returned. ValueError where `fits` says no."""
    check_device(x, w_t, *(() if addend is None else (addend,)))
    if not fits(x, w_t, addend):
        raise ValueError(
            f"gemv kernel: x {tuple(x.shape)} {x.dtype} @ w_t {tuple(w_t.shape)} strides {w_t.stride()} "
            f"{w_t.dtype}" + ("" if addend is None else f" + {tuple(addend.shape)} {addend.dtype}")
            + " is not one row times a transposed weight (+ N contiguous addend elements)"
        )  # fmt: skip
    (_, k), n = x.shape, w_t.shape[1]
    if out is None:
        out = torch.empty((1, n), dtype=x.dtype, device=x.device)
    elif out.shape != (1, n) or out.dtype != x.dtype or (n > 1 and out.stride(-1) != 1):
        raise ValueError(f"gemv kernel: out {tuple(out.shape)} {out.dtype} is not a contiguous [1, {n}] {x.dtype}")
    if n == 0:
        return out
    gemv_kernel[(cdiv(n, block_n),)](
        x, w_t, out if addend is None else addend, out, n, k, x.stride(1), w_t.stride(1),
        HAS_ADDEND=addend is not None, EVEN=n % block_n == 0 and k % block_k == 0,
        BLOCK_N=block_n, BLOCK_K=block_k, STAGES=num_stages, num_warps=num_warps,
    )  # fmt: skip
    return out
