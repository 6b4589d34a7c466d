"""graphspec::mm_triton: a matmul whose every output row is computed the same way whatever shares its launch.

out [M, N] = a [M, K] @ b [K, N] in a's dtype (b is usually a weight's transposed view, strides (1, K)),
as aten.mm computes it; graphspec::addmm_triton (kernels/addmm.py) adds a bias [N] before the rounding.
It is lowered under numerics="invariant" (lowering/registry.py): cuBLAS is as fast or faster at the step's
shapes (docs/BENCHMARKS.md, bench_linear), but it picks its algorithm, tiles and split-K by M, so a row
computed alone (a draft's one-token forward), in a batch, or as one position of a (K+1)-token verify
block rounds differently, and a draft identical to the target is rejected.

By default mm and addmm are lowered only where kernels/gemv.py's kernels beat cuBLAS (its shape classes
"one_row*", "two_rows" and "few_rows*": products of one to gemv.DOT_MAX_ROWS rows): those config rows, block_m <=
gemv.MAX_ROWS, run gemv.py's kernels. They are not this kernel and never used under numerics="invariant" (which takes
the SM's row at every M).

Why a row's result cannot depend on M here: the tile (BLOCK_M, BLOCK_N, BLOCK_K), the split of K and the
order the partial sums are added in come from the config and (N, K) only. Each program accumulates its
row tile over its K range in ascending BLOCK_K blocks with the same tensor-core dot; rows never mix
(a dot's output row reads only its own input row). With splits > 1 every split writes an fp32 partial
and mm_reduce_kernel adds them in split order 0, 1, ... one at a time. M is passed unspecialized
(Triton would otherwise compile M == 1 apart), so every M runs the same compiled kernel.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from graphspec.kernels import gemv as gemv_kernel
from graphspec.kernels.common import cdiv, check_config_table, check_device, interpreting, round_to
from torch import Tensor

from graphspec import library

__all__ = ["CONFIGS", "mm", "mm_triton", "shape_class", "splits_for"]

# block_m/block_n/block_k: the output tile and the K step; split_programs: split K until the (N tiles x
# splits) grid reaches about this many programs (0 = never split), a count fixed per row, not by the
# device (so two GPUs running the same row compute the same bits); num_warps/num_stages: launch knobs.
# block_m 64 covers a verify block of up to 12 rows x (K+1 = 5) in one tile, so decode reads each
# weight byte once. 90: the best single row of `benchmarks/bench_linear.py --pairs llama --sweep` on an H200
# (2026-11-25, 12 rows at M = 1, 5, 40): summed over a batch-1 K=4 step's matmuls 8.00 ms against cuBLAS's
# 7.46 (the first guess, block_k 128 / 4 stages: 8.93; block_m 16 is 7.86 but 1.5x slower at M = 40).
# 80 and default are untuned. (sm, class): kernels/gemv.py's rows of each shape class (gemv.class_rows; block_m 1,
# 2 or gemv.MAX_ROWS), for the products its shape_class names.
CONFIGS: dict[int | str | tuple[int | str, str], dict[str, int]] = {
    80: {"block_m": 64, "block_n": 64, "block_k": 64, "split_programs": 256, "num_warps": 4, "num_stages": 4},
    90: {"block_m": 64, "block_n": 64, "block_k": 64, "split_programs": 256, "num_warps": 4, "num_stages": 6},
    "default": {"block_m": 64, "block_n": 64, "block_k": 64, "split_programs": 256, "num_warps": 4, "num_stages": 2},
    **gemv_kernel.class_rows(),
}
CONFIG_FIELDS = check_config_table(CONFIGS)
MIN_BLOCKS_PER_SPLIT = 4  # K blocks each split streams at least (shorter ones cost more in partials)
REDUCE_BLOCK = 1024  # output elements per reduce program


@triton.jit(do_not_specialize=["M"])
def mm_kernel(
    a_ptr,
    b_ptr,
    bias_ptr,
    out_ptr,
    part_ptr,
    M,
    N,
    K,
    blocks_per_split,
    stride_am,
    stride_ak,
    stride_bk,
    stride_bn,
    HAS_BIAS: tl.constexpr,
    SPLIT: tl.constexpr,
    PRECISION: tl.constexpr,
    UPCAST: tl.constexpr,  # interpreter only: 16-bit operands go through the dot as (exact) fp32
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    # Axis 0 (fastest) walks the row tiles of one column tile, so they read its b slab while it is in L2.
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    split = tl.program_id(2)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    ks = tl.arange(0, BLOCK_K)
    row_ok = rows < M
    col_ok = cols < N
    first = split * blocks_per_split * BLOCK_K
    last = tl.minimum(first + blocks_per_split * BLOCK_K, K)
    a_tile = a_ptr + rows.to(tl.int64)[:, None] * stride_am + (first + ks)[None, :] * stride_ak
    b_tile = b_ptr + (first + ks)[:, None] * stride_bk + cols.to(tl.int64)[None, :] * stride_bn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(first, last, BLOCK_K):
        k_ok = (k0 + ks) < last  # the last block may run past K: those products are exact zeros
        a = tl.load(a_tile, mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        b = tl.load(b_tile, mask=k_ok[:, None] & col_ok[None, :], other=0.0)
        if UPCAST:
            a, b = a.to(tl.float32), b.to(tl.float32)
        acc = tl.dot(a, b, acc, input_precision=PRECISION)
        a_tile += BLOCK_K * stride_ak
        b_tile += BLOCK_K * stride_bk
    offsets = rows.to(tl.int64)[:, None] * N + cols[None, :]  # out and each partial: contiguous [M, N]
    mask = row_ok[:, None] & col_ok[None, :]
    if SPLIT:
        tl.store(part_ptr + split.to(tl.int64) * M * N + offsets, acc, mask=mask)
    else:
        if HAS_BIAS:
            acc += tl.load(bias_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
        dtype = out_ptr.dtype.element_ty
        tl.store(out_ptr + offsets, round_to(acc, dtype).to(dtype), mask=mask)


@triton.jit(do_not_specialize=["M"])
def mm_reduce_kernel(part_ptr, bias_ptr, out_ptr, M, N, splits, HAS_BIAS: tl.constexpr, BLOCK: tl.constexpr):
    # The partials of each output element added in split order, one at a time: a fixed order.
    offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    ok = offsets < M * N
    total = tl.zeros((BLOCK,), dtype=tl.float32)
    for split in range(splits):
        total += tl.load(part_ptr + split * M * N + offsets, mask=ok, other=0.0)
    if HAS_BIAS:
        total += tl.load(bias_ptr + offsets % N, mask=ok, other=0.0).to(tl.float32)
    dtype = out_ptr.dtype.element_ty
    tl.store(out_ptr + offsets, round_to(total, dtype).to(dtype), mask=ok)


def shape_class(a: Tensor, b: Tensor, *_: object) -> str | None:
    """kernels/gemv.py's class of the product ("one_row*", "two_rows", "few_rows*": its config rows), else None."""
    return gemv_kernel.shape_class(a, b)


def splits_for(n: int, k: int, block_n: int, block_k: int, split_programs: int) -> int:
    """How many K ranges the product is cut into: doubled while the grid of N tiles x splits stays within
    split_programs and every split keeps MIN_BLOCKS_PER_SPLIT K blocks. A function of N and K only."""
    tiles, k_blocks, splits = cdiv(n, block_n), cdiv(k, block_k), 1
    while tiles * splits * 2 <= split_programs and k_blocks >= splits * 2 * MIN_BLOCKS_PER_SPLIT:
        splits *= 2
    return splits


def mm(
    a: Tensor,
    b: Tensor,
    bias: Tensor | None = None,
    block_m: int = CONFIGS["default"]["block_m"],
    block_n: int = CONFIGS["default"]["block_n"],
    block_k: int = CONFIGS["default"]["block_k"],
    split_programs: int = CONFIGS["default"]["split_programs"],
    num_warps: int = CONFIGS["default"]["num_warps"],
    num_stages: int = CONFIGS["default"]["num_stages"],
) -> Tensor:
    """a [M, K] @ b [K, N] (+ bias [N]) as a new contiguous [M, N] of a's dtype (any strides of a and b).
    block_m <= gemv.MAX_ROWS (the rows of gemv's shape classes) runs kernels/gemv.py instead, for operands gemv.fits
    (a bias may be [M, N])."""
    if block_m <= gemv_kernel.MAX_ROWS:
        return gemv_kernel.gemv(a, b, bias, None, block_m, block_n, block_k, num_warps, num_stages)
    check_device(a, b, *(() if bias is None else (bias,)))
    if a.dim() != 2 or b.dim() != 2 or a.shape[1] != b.shape[0] or a.dtype != b.dtype:
        raise ValueError(f"mm kernel: a {tuple(a.shape)} {a.dtype} @ b {tuple(b.shape)} {b.dtype} does not match")
    (m, k), n = a.shape, b.shape[1]
    if bias is not None and tuple(bias.shape) != (n,):
        raise ValueError(f"mm kernel: bias {tuple(bias.shape)} is not [{n}]")
    out = torch.empty((m, n), dtype=a.dtype, device=a.device)
    if m == 0 or n == 0:
        return out
    splits = splits_for(n, k, block_n, block_k, split_programs) if split_programs else 1
    blocks_per_split = cdiv(cdiv(k, block_k), splits)
    part = torch.empty((splits, m, n), dtype=torch.float32, device=a.device) if splits > 1 else out
    # HACK(triton<=3.9 interpreter): tl.dot on bf16/fp16 operands returns garbage under
    # TRITON_INTERPRET=1; there the kernel upcasts the (exactly representable) operands to fp32.
    upcast = interpreting() and a.dtype != torch.float32
    mm_kernel[(cdiv(m, block_m), cdiv(n, block_n), splits)](
        a, b, out if bias is None else bias, out, part, m, n, k, blocks_per_split, *a.stride(), *b.stride(),
        HAS_BIAS=bias is not None, SPLIT=splits > 1,
        PRECISION="ieee" if a.dtype == torch.float32 or upcast else "tf32", UPCAST=upcast,
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, num_warps=num_warps, num_stages=num_stages,
    )  # fmt: skip
    if splits > 1:
        mm_reduce_kernel[(cdiv(m * n, REDUCE_BLOCK),)](
            part, out if bias is None else bias, out, m, n, splits, HAS_BIAS=bias is not None, BLOCK=REDUCE_BLOCK
        )
    return out


# The kernel ops take aten.mm's own arguments (self @ mat2), then the config.
@library.op("graphspec::mm_triton", mutates_args=())
def mm_triton(
    self: Tensor,
    mat2: Tensor,
    block_m: int,
    block_n: int,
    block_k: int,
    split_programs: int,
    num_warps: int,
    num_stages: int,
) -> Tensor:
    """aten.mm lowered to mm_kernel; the trailing ints are CONFIG_FIELDS."""
    return mm(self, mat2, None, block_m, block_n, block_k, split_programs, num_warps, num_stages)


@torch.library.register_fake("graphspec::mm_triton")
def _(self, mat2, *config):
    return self.new_empty((self.shape[0], mat2.shape[1]))
