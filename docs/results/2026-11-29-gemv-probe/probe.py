# ruff: noqa  (a probe, kept with its results)
"""Probe (issue 16; written 2026-11-29 after the decode profile, run on an H200 at 2811146: run/probe.log): can a
Triton kernel beat cuBLAS at the decode's M = 1 (and a verify's 5) on the projections that stream below the copy
rate? Yes at M = 1, the dot-free GEMV (gemv8x512s3w4 became kernels/gemv.py); no at M = 5.

The B = 1 decode's profile (docs/results/2026-11-29-fold-input-norm/profile/) has cuBLAS's GEMMs alone at 1.087x
issue 16's floor: q/k/v [6144 x 4096] at 3.0 TB/s (16.6 us), the o and down projections (N = 4096) averaging
20.4 us, against gate/up's 4.2 TB/s. cuBLAS without a workspace (graphspec's setting) tiles N by 64: q/k/v runs
96 programs and o/down 64 on 132 SMs. The 2026-11-28 probe's swap-AB kernel (docs/results/2026-11-28-swap-ab-gemm)
with 64-row weight tiles came within a few percent of cuBLAS there. Candidates here, each over several configs:
- swap-AB with 16- and 32-row weight tiles (2-4x the programs), deeper pipelines;
- a dot-free GEMV for M = 1: each program BN weight rows across all of K, BK columns a step, fp32 products
  accumulated in a [BN, BK] tile and summed once at the end; as written (tl.range(num_stages)), and with the next
  step's loads issued before this step's products (Triton 3.6 does not pipeline loads that feed no dot: the sm_90
  build of the plain loop has no shared-memory buffers and its SASS waits on each step's loads).

    python docs/results/2026-11-29-gemv-probe/probe.py [--rows 1,5] [--models llama-8b,llama-1b]
    TRITON_INTERPRET=1 python docs/results/2026-11-29-gemv-probe/probe.py --check-cpu   # arithmetic only

Timing as benchmarks/bench_linear.py (weights rotated past L2, CUDA-graph replays, us per call, % of the
device-to-device copy rate). What would count: the best candidate per projection against cuBLAS, summed over a
decode's 32 layers (a 0.3 ms gain would bring the B = 1 decode to about 1.1x its floor).
"""

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

DTYPE = torch.bfloat16


@triton.jit
def gemv_kernel(w_ptr, x_ptr, out_ptr, K, BN: tl.constexpr, BK: tl.constexpr, STAGES: tl.constexpr):
    """out[n] = sum_k W[n, k] x[k] for program p's rows p*BN .. p*BN+BN-1 (N and K multiples of BN and BK)."""
    rows = (tl.program_id(0) * BN + tl.arange(0, BN)).to(tl.int64)
    acc = tl.zeros((BN, BK), dtype=tl.float32)
    for k0 in tl.range(0, K, BK, num_stages=STAGES):
        cols = k0 + tl.arange(0, BK)
        w = tl.load(w_ptr + rows[:, None] * K + cols[None, :])
        x = tl.load(x_ptr + cols)
        acc += w.to(tl.float32) * x.to(tl.float32)[None, :]
    tl.store(out_ptr + rows, tl.sum(acc, 1).to(out_ptr.dtype.element_ty))


@triton.jit
def gemv_prefetch_kernel(w_ptr, x_ptr, out_ptr, K, BN: tl.constexpr, BK: tl.constexpr, STAGES: tl.constexpr):
    """gemv_kernel with the next BK columns' loads issued before this step's products (a register double buffer:
    the compiler does not pipeline loads that feed no dot, and a plain loop waits for each step's loads)."""
    rows = (tl.program_id(0) * BN + tl.arange(0, BN)).to(tl.int64)
    cols = tl.arange(0, BK)
    acc = tl.zeros((BN, BK), dtype=tl.float32)
    w = tl.load(w_ptr + rows[:, None] * K + cols[None, :])
    x = tl.load(x_ptr + cols)
    for k0 in range(BK, K + BK, BK):
        ahead = (k0 + cols) < K
        w_next = tl.load(w_ptr + rows[:, None] * K + (k0 + cols)[None, :], mask=ahead[None, :], other=0.0)
        x_next = tl.load(x_ptr + k0 + cols, mask=ahead, other=0.0)
        acc += w.to(tl.float32) * x.to(tl.float32)[None, :]
        w, x = w_next, x_next
    tl.store(out_ptr + rows, tl.sum(acc, 1).to(out_ptr.dtype.element_ty))


class Gemv:
    kernel = gemv_kernel

    def __init__(self, weights: list[torch.Tensor], x: torch.Tensor, bn: int, bk: int, stages: int, warps: int):
        self.n, self.k = weights[0].shape
        if x.shape[0] != 1 or self.n % bn or self.k % bk:
            raise ValueError(f"gemv: M = 1 and N, K multiples of ({bn}, {bk}) only")
        self.weights, self.x, self.bn, self.bk, self.stages, self.warps = weights, x, bn, bk, stages, warps
        self.out = torch.empty(1, self.n, dtype=x.dtype, device=x.device)

    def __call__(self, index: int) -> torch.Tensor:
        self.kernel[(self.n // self.bn,)](
            self.weights[index],
            self.x,
            self.out,
            self.k,
            BN=self.bn,
            BK=self.bk,
            STAGES=self.stages,
            num_warps=self.warps,
        )
        return self.out


class GemvPrefetch(Gemv):
    kernel = gemv_prefetch_kernel


GEMV_CONFIGS = [  # bn, bk, stages, warps
    (8, 512, 3, 4),
    (16, 256, 4, 4),
    (16, 512, 3, 4),
    (16, 512, 4, 8),
    (32, 256, 3, 4),
    (32, 256, 4, 8),
    (4, 1024, 3, 4),
    (8, 1024, 2, 4),
]
SWAP_CONFIGS = [  # bn, bk, stages, warps: the 2026-11-28 probe's best rows, then smaller weight tiles
    (64, 128, 6, 4),
    (32, 128, 6, 4),
    (32, 128, 8, 2),
    (32, 256, 4, 4),
    (16, 128, 8, 1),
    (16, 256, 6, 2),
    (16, 256, 4, 4),
]


def check_cpu() -> None:
    """The GEMV's arithmetic under the interpreter against the fp32 product (no timing)."""
    g = torch.Generator().manual_seed(0)
    for n, k, (bn, bk, stages, warps) in [(64, 512, GEMV_CONFIGS[1]), (96, 1024, GEMV_CONFIGS[6])]:
        w = (torch.randn(n, k, generator=g) / k**0.5).to(DTYPE)
        x = torch.randn(1, k, generator=g).to(DTYPE)
        exact = x.float() @ w.float().T
        for kind in (Gemv, GemvPrefetch):
            out = kind([w], x, bn, bk, stages, warps)(0)
            error = ((out.float() - exact).norm() / exact.norm()).item()
            assert error < 4e-3, error
            print(f"{kind.__name__} {n}x{k} bn {bn} bk {bk}: relative error {error:.1e} (bf16 output)")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", default="1,5")
    parser.add_argument("--models", default="llama-8b,llama-1b")
    parser.add_argument("--projections", default="qkv,o,down,gate_up")
    parser.add_argument("--check-cpu", action="store_true")
    args = parser.parse_args()
    if args.check_cpu:
        check_cpu()
        return
    from benchmarks import common
    from benchmarks.bench_linear import ROTATE_BYTES, projections, timed_us

    import importlib.util

    path = Path(__file__).resolve().parents[1] / "2026-11-28-swap-ab-gemm" / "probe.py"
    spec = importlib.util.spec_from_file_location("swap_ab_probe", path)
    swap_ab = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(swap_ab)
    SwapAB = swap_ab.SwapAB

    copy_gb_s = common.measure_copy_bandwidth("cuda")["gb_s"]
    print(
        f"{common.device_name('cuda')}, triton {triton.__version__}, torch {torch.__version__}, copy {copy_gb_s:.0f} GB/s"
    )
    gains = {}  # (model, M) -> us a forward would save with the best candidate of every projection (never cuBLAS's loss)
    for model in args.models.split(","):
        shapes = projections(model)
        layers = common.SHAPES[model]["num_hidden_layers"]
        for m in [int(r) for r in args.rows.split(",")]:
            for proj in args.projections.split(","):
                n, k = shapes[proj]
                copies = max(2, -(-ROTATE_BYTES // (n * k * 2)))
                weights = [torch.randn(n, k, dtype=DTYPE, device="cuda") / k**0.5 for _ in range(copies)]
                x = torch.randn(m, k, dtype=DTYPE, device="cuda")
                exact = x.float() @ weights[0].float().T
                err = lambda out: ((out.float() - exact).norm() / exact.norm()).item()
                pct = lambda us: 100 * n * k * 2 / (us * 1e-6) / 1e9 / copy_gb_s
                times, errors = {"cublas": timed_us(lambda: [F.linear(x, w) for w in weights], copies)}, {}
                errors["cublas"] = err(F.linear(x, weights[0]))
                candidates = [(f"swap{c[0]}x{c[1]}s{c[2]}w{c[3]}", SwapAB, c) for c in SWAP_CONFIGS]
                if m == 1:
                    candidates += [(f"gemv{c[0]}x{c[1]}s{c[2]}w{c[3]}", Gemv, c) for c in GEMV_CONFIGS]
                    candidates += [(f"prefetch{c[0]}x{c[1]}w{c[3]}", GemvPrefetch, c) for c in GEMV_CONFIGS]
                for name, kind, config in candidates:
                    try:
                        run = kind(weights, x, *config)
                        errors[name] = err(run(0).clone())
                        times[name] = timed_us(lambda: [run(i) for i in range(copies)], copies)
                    except Exception as failure:
                        print(f"  {name}: {type(failure).__name__}: {str(failure)[:160]}")
                best = min((t, key) for key, t in times.items() if key != "cublas")
                cublas = times["cublas"]
                print(
                    f"{model:9s} M={m} {proj:8s} N={n:6d} K={k:5d}: cublas {cublas:.1f} us ({pct(cublas):.0f}%); "
                    f"best {best[1]} {best[0]:.1f} us ({pct(best[0]):.0f}%, err {errors[best[1]]:.1e}); "
                    + ", ".join(f"{key} {us:.1f}" for key, us in times.items() if key != "cublas"),
                    flush=True,
                )
                gains[(model, m)] = gains.get((model, m), 0.0) + layers * max(0.0, cublas - best[0])
                weights.clear()
    for (model, m), us in gains.items():
        print(
            f"{model} M={m}: the best candidate per projection would save {us:.0f} us a forward (sum of isolated timings)"
        )


if __name__ == "__main__":
    main()
