"""Products of one to a few rows with a model weight, x [M, K] @ W.t() (W [N, K], an nn.Linear weight): a decode's
projections at batch 1 (the target's one-token forward, a draft model's or EAGLE-3 head's draft forwards) without
tensor cores, and two rows with or without them.

Why not cuBLAS: at M = 1 every projection streams its weight once, so the product is as fast as the weight
can be read. cuBLAS (no workspace, graphspec's setting) tiles N by 64 and reads q/k/v [6144 x 4096] at 75%
of the H200's copy rate, a 1B draft's o projection at 33%. This kernel gives each program BLOCK_N weight
rows (8: 768 programs for q/k/v on 132 SMs) across all of K, BLOCK_K columns a step, fp32 products
accumulated elementwise in a [BLOCK_N, BLOCK_K] tile and summed once at the end: on an H200 11-13% faster
than cuBLAS at the 8B's q/k/v and o, 6% at down, 0-3% at gate/up and lm_head, 17-25% at the 1B's q/k/v, o and
down (docs/BENCHMARKS.md, 2026-11-29; a batch-1 8B decode 4% faster). It is mm's, addmm's and addmm_in_place's
kernel for one-row products by default (their (sm, "one_row") config rows, block_m = 1; "one_row_long_k" rows where
K >= 4N); under numerics="invariant" mm and addmm keep kernels/mm.py's tiles at every M instead.

few_rows_kernel does the same for 2 to MAX_ROWS rows: each weight tile is loaded once and multiplied into
every row's accumulator, so the weight streams once whatever the rows. It beats cuBLAS only at two rows and
narrow weights (docs/results/2026-11-29-few-row-gemv-probe, H200: 1B q/k/v 6.4 -> 6.0 us, o 6.0 -> 4.9, down
14.2 -> 11.6; at 5 or 8 rows each weight element feeds that many fp32 FMAs and it lost everywhere, at gate/up
and the 1B lm_head already at two), so shape_class names that case ("two_rows", up to
TWO_ROWS_MAX_N wide: at the 8B's projections a batch-2 decode lost to cuBLAS) and the config rows lower only it:
a 1B draft model's catch-up forward at batch 1 and its draft forwards at batch 2.

few_rows_dot_kernel takes products of 2 to MAX_ROWS rows on the tensor cores: each program streams BLOCK_N weight
rows across all of K, each tile the left operand of one dot with x's rows (padded to the dot's least 16) as the
right. Alone it runs within 1 us of cuBLAS per product at 2 to 8 rows (docs/results/2026-11-29-few-row-dot-probe).
It is launched in plain stream order, not with programmatic dependent launch as the GEMVs are: a program holds
~80-100 KB of K-loop buffers, and launched early (resident, waiting for the kernel ahead) it cost a K = 4 verify at
batch 1 130 us, with or without letting the next kernel launch early, where launched plainly it saved 40 us over
cuBLAS (docs/results/2026-11-30-verify-dot-pdl). So shape_class gives it the products of 2 to DOT_MAX_ROWS rows
that "two_rows" does not take: "few_rows" (N < WIDE_MIN_RATIO x K: q/k/v, o, down) and "few_rows_wide" (gate/up,
lm_head), each with its own tile.

An addend [N] (a bias) or [M, N] (a residual: the folded norm's residual add) is added to the fp32 sum
before the one rounding, as cuBLAS does with beta = 1; the output may be the addend itself (each program
reads its tile of the addend before it writes it). The addend is asked for before the K loop, so its L2 round trip
overlaps the weight stream instead of ending every program.

Launched with programmatic dependent launch (kernels/common.pdl_launch), gemv_kernel asks for its first weight tile
before it waits for the kernels before it (a model weight: lowering/registry.py lowers nothing else here) and lets
the next kernel launch after its K loop, so the next projection's first tiles are on their way while this one's
last programs sum and store.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import triton
import triton.language as tl
from graphspec.kernels.common import (
    cdiv,
    check_device,
    interpreting,
    let_later_kernels_launch,
    pdl_launch,
    round_to,
    wait_for_earlier_kernels,
)
from torch import Tensor

__all__ = [
    "CLASS_CONFIGS",
    "CONFIGS",
    "DOT_MAX_ROWS",
    "DOT_ROWS",
    "FEW_ROWS_CONFIGS",
    "FEW_ROWS_WIDE_CONFIGS",
    "LONG_K_CONFIGS",
    "MAX_ROWS",
    "TWO_ROWS_CONFIGS",
    "WIDE_MIN_RATIO",
    "class_rows",
    "fits",
    "gemv",
    "shape_class",
]

MAX_ROWS = 8  # the most rows of x the few-row kernels take
DOT_ROWS = 16  # few_rows_dot_kernel: x's rows padded to the tensor-core dot's least
# The "few_rows*" classes take products of 2 to DOT_MAX_ROWS rows: the most rows measured in the step (a K = 4
# verify at batch 1); from 6 rows cuBLAS keeps them.
DOT_MAX_ROWS = 5
# ... those with N >= WIDE_MIN_RATIO x K (gate/up's N = 7K, lm_head's) "few_rows_wide"'s tile (64 x 128: 56.3 us at
# the 8B's gate/up at two rows where 32 x 256 took 61.5; the dot probe).
WIDE_MIN_RATIO = 4
# Two-row products are lowered where N <= TWO_ROWS_MAX_WIDTH x K (q/k/v, o, down): at the wide ones (gate/up's
# N = 7-8 K, lm_head) cuBLAS reads the weight at 88-102% of the copy rate with two rows and the GEMV did not win.
TWO_ROWS_MAX_WIDTH = 2
# ... and N <= TWO_ROWS_MAX_N: at the 1B's q/k/v, o and down (N 2048-3072) the GEMV won in the probe (0.4-2.6 us a
# launch) and in the batch-2 draft-model step (-2.0%), where at the 8B's (N 4096-6144; even in the probe) it lost
# the batch-2 target decode 1.1% (H200, docs/results/2026-11-29-two-rows-b2: cuBLAS fills the GPU from there).
TWO_ROWS_MAX_N = 3072
# One-row products with K >= LONG_K_MIN_RATIO x N (a 1B draft's down projection, [2048 x 8192]) take their own rows:
# with 8 weight rows a program they run N / 8 programs (256) each streaming a long row block; half as many rows a
# program and longer steps read them faster (docs/results/2026-11-29-gemv-probe: 11.2 -> 10.2 us), where the 8B's
# down ([4096 x 14336], K = 3.5 N) did not gain (28.9 -> 29.4 us).
LONG_K_MIN_RATIO = 4

# mm's CONFIG_FIELDS: block_m 1 marks this kernel; block_n weight rows per program; block_k columns a step;
# split_programs unused (0: K is never split); num_warps; num_stages of the K loop. 90: the best row of
# docs/results/2026-11-29-gemv-probe over the 8B and 1B projections at M = 1 (within 0.7 us of each
# projection's best config; a 1B down projection [2048 x 8192] takes 1 us less with 4 x 1024: LONG_K_CONFIGS).
# 80 and "default" (any other SM): the same, untuned.
CONFIGS: dict[int | str, dict[str, int]] = {
    80: {"block_m": 1, "block_n": 8, "block_k": 512, "split_programs": 0, "num_warps": 4, "num_stages": 3},
    90: {"block_m": 1, "block_n": 8, "block_k": 512, "split_programs": 0, "num_warps": 4, "num_stages": 3},
    "default": {"block_m": 1, "block_n": 8, "block_k": 512, "split_programs": 0, "num_warps": 4, "num_stages": 3},
}
# One row, K >= LONG_K_MIN_RATIO x N (gemv_kernel). 90: the probe's best at the 1B down projection, 4 x 1024; in the
# draft-model step (B = 1, 8B/1B) 7.974 -> 7.947 ms (docs/BENCHMARKS.md, 2026-11-29 17:35). 80 and "default": the
# same, untuned.
LONG_K_CONFIGS: dict[int | str, dict[str, int]] = {
    key: {"block_m": 1, "block_n": 4, "block_k": 1024, "split_programs": 0, "num_warps": 4, "num_stages": 3}
    for key in (80, 90, "default")
}
# Two rows (few_rows_kernel; block_m 2, the rows the class takes). 90: the probe's best tile over the 8B and 1B
# narrow projections at two rows, the one-row GEMV's 8 x 512 (within 0.4 us of each one's best). 80 and "default":
# the same, untuned.
TWO_ROWS_CONFIGS: dict[int | str, dict[str, int]] = {
    key: {"block_m": 2, "block_n": 8, "block_k": 512, "split_programs": 0, "num_warps": 4, "num_stages": 3}
    for key in (80, 90, "default")
}
# The tensor-core kernel (few_rows_dot_kernel; block_m MAX_ROWS marks it). 90: the dot probe's best "dotw" tiles at
# the 8B's 2-row products (q/k/v 15.4 us, o 11.4, down 30.7: 32 x 256; gate/up 56.3, lm_head 232.6: 64 x 128, 4
# stages, 4 warps each; cuBLAS 17.8, 11.7, 30.6, 56.7, 271.4). 80: the same, untuned. "default" (any other SM): 3
# stages, so the narrow tile's buffers (72 KB) fit the ~99 KB a program may hold on sm_86/89/120.
FEW_ROWS_CONFIGS: dict[int | str, dict[str, int]] = {
    key: {"block_m": MAX_ROWS, "block_n": 32, "block_k": 256, "split_programs": 0, "num_warps": 4, "num_stages": stages}
    for key, stages in ((80, 4), (90, 4), ("default", 3))
}
FEW_ROWS_WIDE_CONFIGS: dict[int | str, dict[str, int]] = {
    key: {"block_m": MAX_ROWS, "block_n": 64, "block_k": 128, "split_programs": 0, "num_warps": 4, "num_stages": stages}
    for key, stages in ((80, 4), (90, 4), ("default", 3))
}

# Each shape class's config rows, by the name shape_class gives it: the kernel ops that run these GEMVs (mm, addmm,
# addmm_in_place) take them as their (sm, class) rows through class_rows, so a class is declared here only.
CLASS_CONFIGS: dict[str, dict[int | str, dict[str, int]]] = {
    "one_row": CONFIGS,
    "one_row_long_k": LONG_K_CONFIGS,
    "two_rows": TWO_ROWS_CONFIGS,
    "few_rows": FEW_ROWS_CONFIGS,
    "few_rows_wide": FEW_ROWS_WIDE_CONFIGS,
}


def class_rows(classes: Iterable[str] = tuple(CLASS_CONFIGS)) -> dict[tuple[int | str, str], dict[str, int]]:
    """Copies of these shape classes' config rows keyed (sm, class), as a kernel op's CONFIGS holds them."""
    return {(key, name): dict(config) for name in classes for key, config in CLASS_CONFIGS[name].items()}


@triton.jit
def load_tile(row_ptrs, cols, row_ok, K, EVEN: tl.constexpr):
    """[R, BLOCK_K]: columns `cols` of the rows starting at row_ptrs [R, 1] (unit column stride: a transposed
    weight's rows); unless EVEN, rows where row_ok is false and columns past K read 0."""
    if EVEN:
        tile = tl.load(row_ptrs + cols[None, :])
    else:
        tile = tl.load(row_ptrs + cols[None, :], mask=row_ok[:, None] & (cols < K)[None, :], other=0.0)
    return tile


@triton.jit
def load_rows(row_ptrs, cols, m_ok, stride, K, EVEN: tl.constexpr):
    """[R, BLOCK_K]: the elements `cols` (at `stride`) of x's rows starting at row_ptrs [R, 1]; rows where m_ok is
    false (past M) read 0 whatever the shape, and unless EVEN so do columns past K."""
    if EVEN:
        rows = tl.load(row_ptrs + cols[None, :] * stride, mask=m_ok[:, None], other=0.0)
    else:
        rows = tl.load(row_ptrs + cols[None, :] * stride, mask=m_ok[:, None] & (cols < K)[None, :], other=0.0)
    return rows


@triton.jit
def load_vector(ptr, cols, stride, K, EVEN: tl.constexpr):
    """[BLOCK_K]: the elements `cols` of a vector at `stride`; unless EVEN, those past K read 0."""
    if EVEN:
        vector = tl.load(ptr + cols * stride)
    else:
        vector = tl.load(ptr + cols * stride, mask=cols < K, other=0.0)
    return vector


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
    USE_PDL: tl.constexpr = False,  # launched with programmatic dependent launch (common.pdl_launch)
):
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < N
    w_rows = w_ptr + rows.to(tl.int64)[:, None] * stride_wn
    first = tl.arange(0, BLOCK_K)
    w_first = load_tile(w_rows, first, row_ok, K, EVEN)  # no kernel writes the weight: asked for before the wait
    wait_for_earlier_kernels(USE_PDL)
    if HAS_ADDEND:  # asked for before the K loop: after it, its L2 round trip ended every program
        addend = tl.load(addend_ptr + rows, mask=row_ok, other=0.0)
    acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    acc += w_first.to(tl.float32) * load_vector(x_ptr, first, stride_xk, K, EVEN).to(tl.float32)[None, :]
    for k0 in tl.range(BLOCK_K, K, BLOCK_K, num_stages=STAGES):
        cols = k0 + tl.arange(0, BLOCK_K)
        w = load_tile(w_rows, cols, row_ok, K, EVEN)
        x = load_vector(x_ptr, cols, stride_xk, K, EVEN)
        acc += w.to(tl.float32) * x.to(tl.float32)[None, :]
    let_later_kernels_launch(USE_PDL)
    total = tl.sum(acc, 1)
    if HAS_ADDEND:
        total += addend.to(tl.float32)
    dtype = out_ptr.dtype.element_ty
    tl.store(out_ptr + rows, round_to(total, dtype).to(dtype), mask=row_ok)


@triton.jit
def few_rows_kernel(
    x_ptr,
    w_ptr,
    addend_ptr,
    out_ptr,
    M,
    N,
    K,
    stride_xm,
    stride_xk,
    stride_wn,
    stride_am,  # the addend's row stride: 0 for an [N] bias
    HAS_ADDEND: tl.constexpr,
    EVEN: tl.constexpr,  # N % BLOCK_N == 0 and K % BLOCK_K == 0: no masks on the weight
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    STAGES: tl.constexpr,
    USE_PDL: tl.constexpr = False,
):
    # gemv_kernel with a row axis: each weight tile is loaded once and multiplied into every row's accumulator.
    # Its first tile is not asked for before the wait as in gemv_kernel: that took 16 more registers (96 -> 112,
    # five programs an SM -> four).
    wait_for_earlier_kernels(USE_PDL)
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < N
    ms = tl.arange(0, BLOCK_M)
    m_ok = ms < M
    w_rows = w_ptr + rows.to(tl.int64)[:, None] * stride_wn
    x_rows = x_ptr + ms[:, None] * stride_xm
    mask = m_ok[:, None] & row_ok[None, :]
    if HAS_ADDEND:  # asked for before the K loop, as in gemv_kernel
        addend = tl.load(addend_ptr + ms[:, None] * stride_am + rows[None, :], mask=mask, other=0.0)
    acc = tl.zeros((BLOCK_M, BLOCK_N, BLOCK_K), dtype=tl.float32)
    for k0 in tl.range(0, K, BLOCK_K, num_stages=STAGES):
        cols = k0 + tl.arange(0, BLOCK_K)
        w = load_tile(w_rows, cols, row_ok, K, EVEN)
        x = load_rows(x_rows, cols, m_ok, stride_xk, K, EVEN)
        acc += w.to(tl.float32)[None, :, :] * x.to(tl.float32)[:, None, :]
    total = tl.sum(acc, 2)
    if HAS_ADDEND:
        total += addend.to(tl.float32)
    dtype = out_ptr.dtype.element_ty
    tl.store(out_ptr + ms[:, None] * N + rows[None, :], round_to(total, dtype).to(dtype), mask=mask)


@triton.jit
def few_rows_dot_kernel(
    x_ptr,
    w_ptr,
    addend_ptr,
    out_ptr,
    M,
    N,
    K,
    stride_xm,
    stride_xk,
    stride_wn,
    stride_am,  # the addend's row stride: 0 for an [N] bias
    HAS_ADDEND: tl.constexpr,
    EVEN: tl.constexpr,  # N % BLOCK_N == 0 and K % BLOCK_K == 0: no masks on the weight
    BLOCK_M: tl.constexpr,  # DOT_ROWS: x's rows padded to the dot's least
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    STAGES: tl.constexpr,
    PRECISION: tl.constexpr,
    UPCAST: tl.constexpr,
):
    # The weight tile is the dot's left operand, [BLOCK_N, BLOCK_K] @ [BLOCK_K, BLOCK_M]: the few rows are the dot's
    # narrow side. Launched in plain stream order (module doc: why not with PDL).
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < N
    ms = tl.arange(0, BLOCK_M)
    m_ok = ms < M
    w_rows = w_ptr + rows.to(tl.int64)[:, None] * stride_wn
    x_rows = x_ptr + ms[:, None] * stride_xm
    mask = row_ok[:, None] & m_ok[None, :]  # the output tile is transposed: [BLOCK_N, BLOCK_M]
    if HAS_ADDEND:  # asked for before the K loop, as in gemv_kernel
        addend = tl.load(addend_ptr + ms[None, :] * stride_am + rows[:, None], mask=mask, other=0.0)
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    for k0 in tl.range(0, K, BLOCK_K, num_stages=STAGES):
        cols = k0 + tl.arange(0, BLOCK_K)
        w = load_tile(w_rows, cols, row_ok, K, EVEN)
        x = load_rows(x_rows, cols, m_ok, stride_xk, K, EVEN)
        if UPCAST:
            w, x = w.to(tl.float32), x.to(tl.float32)
        acc = tl.dot(w, tl.trans(x), acc, input_precision=PRECISION)
    if HAS_ADDEND:
        acc += addend.to(tl.float32)
    dtype = out_ptr.dtype.element_ty
    tl.store(out_ptr + ms[None, :] * N + rows[:, None], round_to(acc, dtype).to(dtype), mask=mask)


def fits(x: Tensor, w_t: Tensor, addend: Tensor | None = None) -> bool:
    """Whether gemv takes these operands: 1 to MAX_ROWS rows x [M, K] and a weight's transposed view w_t [K, N]
    whose columns are contiguous (strides (1, K'), as nn.Linear's weight.t()), one float dtype, and an addend of
    [N] or [M, N] with contiguous rows. Fake tensors do: the registry asks this of a node's values."""
    if x.dim() != 2 or w_t.dim() != 2 or not 1 <= x.shape[0] <= MAX_ROWS or x.shape[1] != w_t.shape[0]:
        return False
    n = w_t.shape[1]
    if x.dtype != w_t.dtype or x.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        return False
    if w_t.shape[0] > 1 and w_t.stride(0) != 1:
        return False
    if addend is not None and (tuple(addend.shape) not in ((n,), (x.shape[0], n))):
        return False  # a scalar or an [M, 1] addend would broadcast
    if addend is not None and ((n > 1 and addend.stride(-1) != 1) or addend.dtype != x.dtype):
        return False
    last = (x.shape[0] - 1) * abs(x.stride(0)) + x.shape[1] * max(1, abs(x.stride(1)))
    return last < 2**31 and x.shape[0] * n < 2**31  # x's and out's offsets are int32 (the weight's are int64)


def shape_class(x: Tensor, w_t: Tensor, addend: Tensor | None = None) -> str | None:
    """Where these kernels beat cuBLAS (the probes, H200): "one_row" for every product gemv takes with one row
    ("one_row_long_k" where K >= LONG_K_MIN_RATIO x N: its own tiles), "two_rows" for two rows and
    N <= min(TWO_ROWS_MAX_WIDTH x K, TWO_ROWS_MAX_N), "few_rows" for the other products of up to DOT_MAX_ROWS rows
    ("few_rows_wide" where N >= WIDE_MIN_RATIO x K); None for more rows and where gemv does not fit (cuBLAS keeps
    it)."""
    if not fits(x, w_t, addend):
        return None
    (m, k), n = x.shape, w_t.shape[1]
    if m == 1:
        return "one_row_long_k" if k >= LONG_K_MIN_RATIO * n else "one_row"
    if m == 2 and n <= min(TWO_ROWS_MAX_WIDTH * k, TWO_ROWS_MAX_N):
        return "two_rows"
    if m > DOT_MAX_ROWS:
        return None
    return "few_rows_wide" if n >= WIDE_MIN_RATIO * k else "few_rows"


def gemv(
    x: Tensor,
    w_t: Tensor,
    addend: Tensor | None = None,
    out: Tensor | None = None,
    block_m: int = CONFIGS["default"]["block_m"],
    block_n: int = CONFIGS["default"]["block_n"],
    block_k: int = CONFIGS["default"]["block_k"],
    num_warps: int = CONFIGS["default"]["num_warps"],
    num_stages: int = CONFIGS["default"]["num_stages"],
) -> Tensor:
    """x [M, K] @ w_t [K, N] (+ addend) into `out` (a contiguous [M, N] of x's dtype, may be the addend; a new
    tensor if None), returned. block_m picks the kernel as a config row does: MAX_ROWS few_rows_dot_kernel (the
    tensor cores), else gemv_kernel for one row and few_rows_kernel for 2 to MAX_ROWS. ValueError where `fits` says
    no."""
    check_device(x, w_t, *(() if addend is None else (addend,)))
    if not fits(x, w_t, addend):
        raise ValueError(
            f"gemv kernel: x {tuple(x.shape)} {x.dtype} @ w_t {tuple(w_t.shape)} strides {w_t.stride()} "
            f"{w_t.dtype}" + ("" if addend is None else f" + {tuple(addend.shape)} {addend.dtype}")
            + f" is not 1 to {MAX_ROWS} rows times a transposed weight (+ an [N] or [M, N] addend, contiguous rows)"
        )  # fmt: skip
    (m, k), n = x.shape, w_t.shape[1]
    if out is None:
        out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    elif out.shape != (m, n) or out.dtype != x.dtype or not out.is_contiguous():
        raise ValueError(f"gemv kernel: out {tuple(out.shape)} {out.dtype} is not a contiguous [{m}, {n}] {x.dtype}")
    if n == 0:
        return out
    even = n % block_n == 0 and k % block_k == 0 and k > 0  # K = 0: the first tile's loads are all masked
    addend_row = 0 if addend is None or addend.dim() == 1 else addend.stride(0)
    if block_m == MAX_ROWS:
        # HACK(triton<=3.9 interpreter): tl.dot on bf16/fp16 operands returns garbage under TRITON_INTERPRET=1;
        # there the kernel upcasts the (exactly representable) operands to fp32, as kernels/mm.py does.
        upcast = interpreting() and x.dtype != torch.float32
        few_rows_dot_kernel[(cdiv(n, block_n),)](
            x, w_t, out if addend is None else addend, out, m, n, k, x.stride(0), x.stride(1), w_t.stride(1),
            addend_row, HAS_ADDEND=addend is not None, EVEN=even, BLOCK_M=DOT_ROWS, BLOCK_N=block_n, BLOCK_K=block_k,
            STAGES=num_stages, PRECISION="ieee" if x.dtype == torch.float32 or upcast else "tf32", UPCAST=upcast,
            num_warps=num_warps,
        )  # fmt: skip
        return out
    if m == 1:
        gemv_kernel[(cdiv(n, block_n),)](
            x, w_t, out if addend is None else addend, out, n, k, x.stride(1), w_t.stride(1),
            HAS_ADDEND=addend is not None, EVEN=even, BLOCK_N=block_n, BLOCK_K=block_k, STAGES=num_stages,
            num_warps=num_warps, **pdl_launch(x.device),
        )  # fmt: skip
        return out
    few_rows_kernel[(cdiv(n, block_n),)](
        x, w_t, out if addend is None else addend, out, m, n, k, x.stride(0), x.stride(1), w_t.stride(1), addend_row,
        HAS_ADDEND=addend is not None, EVEN=even, BLOCK_M=triton.next_power_of_2(m), BLOCK_N=block_n,
        BLOCK_K=block_k, STAGES=num_stages, num_warps=num_warps, **pdl_launch(x.device),
    )  # fmt: skip
    return out
