"""A candidate Triton kernel for decode-sized linear layers, kept as a benchmark (benchmarks/bench_linear.py),
not lowered anywhere: on an H200 it does not beat cuBLAS at the benchmark pairs' shapes (docs/BENCHMARKS.md,
docs/results/bench_linear_candidate.log), so graphspec leaves every projection to cuBLAS.

y = x @ W^T (+ b) with few rows of x (M = B * T, 1 to 16): each program streams BLOCK_N whole rows of W
along K in one pass, software-pipelined (num_stages), with every row of x riding along (padded to a
power-of-2 BLOCK_M >= 16, the smallest tensor-core dot tile): one launch, no split-K, no workspace.
BLOCK_N is chosen per launch from N so the grid covers the GPU. Accumulation is fp32, rounded once.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from graphspec.kernels.common import cdiv, check_device, round_to, sm_count
from torch import Tensor

__all__ = ["DEFAULT_CONFIG", "MAX_ROWS", "block_n_for", "linear"]

MAX_ROWS = 64  # the most rows of x any config may take (BLOCK_M = rows padded to a power of 2 >= 16)
MIN_BLOCK_N = 16
SHARED_MEMORY_BYTES = 192 * 1024  # pipeline stages are capped to fit this (sm_80: 163 KB, sm_90: 227 KB per block)

# (max_block_n, block_k, programs_per_sm, num_warps, num_stages), the order linear() takes them:
# max_block_n: the widest slab of W one program streams; block_k: K per pipelined tile; programs_per_sm:
# the grid aims for at least this many programs per SM before it narrows BLOCK_N (down to MIN_BLOCK_N).
DEFAULT_CONFIG = (64, 256, 1, 4, 4)


@triton.jit
def linear_kernel(
    x_ptr,
    w_ptr,
    b_ptr,
    out_ptr,
    M,
    N,
    K,
    stride_xm,
    stride_xk,
    stride_wn,
    stride_wk,
    HAS_BIAS: tl.constexpr,
    EVEN_K: tl.constexpr,  # K % BLOCK_K == 0: no mask along K, so weight loads stay full-width vectors
    IEEE: tl.constexpr,  # fp32 inputs: full-precision dot (no tf32), as torch's default matmul
    UPCAST: tl.constexpr,  # interpreter only: 16-bit operands go through the dot as (exact) fp32
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    pid = tl.program_id(0)
    rows = tl.arange(0, BLOCK_M)  # rows of x (and of out); rows >= M are padding, masked
    cols = pid * BLOCK_N + tl.arange(0, BLOCK_N)  # output columns = rows of W this program streams
    ks = tl.arange(0, BLOCK_K)
    row_ok = rows < M
    col_ok = cols < N
    x_tile = x_ptr + rows[:, None] * stride_xm + ks[None, :] * stride_xk  # [BLOCK_M, BLOCK_K]
    w_tile = w_ptr + cols.to(tl.int64)[:, None] * stride_wn + ks[None, :] * stride_wk  # [BLOCK_N, BLOCK_K]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        if EVEN_K:
            x = tl.load(x_tile, mask=row_ok[:, None], other=0.0)
            w = tl.load(w_tile, mask=col_ok[:, None], other=0.0)
        else:
            k_ok = (k0 + ks) < K  # the last tile's columns past K
            x = tl.load(x_tile, mask=row_ok[:, None] & k_ok[None, :], other=0.0)
            w = tl.load(w_tile, mask=col_ok[:, None] & k_ok[None, :], other=0.0)
        if UPCAST:
            acc = tl.dot(x.to(tl.float32), tl.trans(w.to(tl.float32)), acc, input_precision="ieee")
        elif IEEE:
            acc = tl.dot(x, tl.trans(w), acc, input_precision="ieee")
        else:
            acc = tl.dot(x, tl.trans(w), acc)
        x_tile += BLOCK_K * stride_xk
        w_tile += BLOCK_K * stride_wk
    if HAS_BIAS:
        acc += tl.load(b_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    dtype = out_ptr.dtype.element_ty
    out_ptrs = out_ptr + rows.to(tl.int64)[:, None] * N + cols[None, :]  # out is contiguous [M, N]
    tl.store(out_ptrs, round_to(acc, dtype).to(dtype), mask=row_ok[:, None] & col_ok[None, :])


def block_n_for(n: int, max_block_n: int, programs: int) -> int:
    """The widest power-of-2 BLOCK_N <= max_block_n whose grid has at least `programs` programs
    (MIN_BLOCK_N when even that one does not)."""
    block_n = max(MIN_BLOCK_N, triton.next_power_of_2(max_block_n))
    while block_n > MIN_BLOCK_N and cdiv(n, block_n) < programs:
        block_n //= 2
    return block_n


def linear(
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None = None,
    max_block_n: int = DEFAULT_CONFIG[0],
    block_k: int = DEFAULT_CONFIG[1],
    programs_per_sm: int = DEFAULT_CONFIG[2],
    num_warps: int = DEFAULT_CONFIG[3],
    num_stages: int = DEFAULT_CONFIG[4],
) -> Tensor:
    """x [..., K] @ weight[N, K]^T (+ bias [N]) for at most MAX_ROWS rows of x; a new contiguous [..., N]."""
    check_device(x, weight)
    *lead, k = x.shape
    n = weight.shape[0]
    if weight.dim() != 2 or weight.shape[1] != k:
        raise ValueError(f"linear kernel: weight {tuple(weight.shape)} does not match x {tuple(x.shape)}")
    if bias is not None and tuple(bias.shape) != (n,):
        raise ValueError(f"linear kernel: bias {tuple(bias.shape)} is not [{n}]")
    x2 = x.reshape(-1, k)  # a view when the leading dims collapse, else a (tiny) copy
    m = x2.shape[0]
    if m > MAX_ROWS:
        raise ValueError(f"linear kernel: {m} rows of x, at most {MAX_ROWS}")
    out = torch.empty((*lead, n), dtype=x.dtype, device=x.device)
    if m == 0 or n == 0:
        return out
    if k == 0:
        return out.fill_(0).add_(bias) if bias is not None else out.fill_(0)
    block_n = block_n_for(n, max_block_n, programs_per_sm * sm_count(x.device))
    block_k = min(triton.next_power_of_2(block_k), max(16, triton.next_power_of_2(k)))
    block_m = max(16, triton.next_power_of_2(m))
    stage_bytes = (block_m + block_n) * block_k * x.element_size()  # one x tile + one W tile in flight
    num_stages = max(1, min(num_stages, SHARED_MEMORY_BYTES // stage_bytes))
    # HACK(triton<=3.9 interpreter): tl.dot on bf16/fp16 operands returns garbage under
    # TRITON_INTERPRET=1 (as in attention.py). Remove when the interpreter's dot handles 16-bit floats.
    upcast = x.device.type != "cuda" and x.dtype != torch.float32
    linear_kernel[(cdiv(n, block_n),)](
        x2, weight, bias if bias is not None else weight, out, m, n, k,
        x2.stride(0), x2.stride(1), weight.stride(0), weight.stride(1),
        HAS_BIAS=bias is not None, EVEN_K=k % block_k == 0, IEEE=x.dtype == torch.float32,
        UPCAST=upcast, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
        num_warps=num_warps, num_stages=num_stages,
    )  # fmt: skip
    return out
