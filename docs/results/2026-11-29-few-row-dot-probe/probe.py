# ruff: noqa  (a probe, kept with its results)
"""Probe (issue 16, 2026-11-29 22:55 UTC): does a tensor-core (tl.dot) few-row GEMM beat cuBLAS at a K = 4 verify's
5-row products at batch 1?

The draft-model step's largest excess after the draft forwards is the verify: 4.38 ms against the one-row decode's
3.89 (same weights, same attention up to 5 queries). Its products are cuBLAS's, which reads the 8B's q/k/v and o at
68-76% of the copy rate and down at ~89% at 5 rows (docs/BENCHMARKS.md, 2026-11-29 15:45). The dot-free few-row
kernels lost there (docs/results/2026-11-29-few-row-gemv-probe: each weight element feeds 5 fp32 FMAs, issue-bound);
the tensor cores do those FMAs for free, so a kernel with the one-row GEMV's grid (a few weight rows a program across
all of K, no split) but a dot per step might stream the weight at the GEMV's rate.

Candidates (x padded to 16 rows by masked loads; the weight W [N, K] streamed once):
- "dotw": acc [BN, 16] += W tile [BN, BK] @ x tile^T (the weight is the dot's A operand: "swap AB");
- "dotx": acc [16, BN] += x tile @ W tile^T;
- "mm16": kernels/mm.py's invariant-numerics mm_kernel at block_m 16 (split-K with partials + a reduce launch).

    python docs/results/2026-11-29-few-row-dot-probe/probe.py [--rows 5,2,8] [--models llama-8b,llama-1b]
    TRITON_INTERPRET=1 python docs/results/2026-11-29-few-row-dot-probe/probe.py --check-cpu   # arithmetic
    python docs/results/2026-11-29-few-row-dot-probe/probe.py --build 90      # every config for sm_90, offline

Timing as benchmarks/bench_linear.py (weights rotated past L2, CUDA-graph replays, us per call, % of the copy rate).
"""

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

DTYPE = torch.bfloat16
BM = 16  # the dot's smallest row count: x's rows padded to it


@triton.jit
def dotw_kernel(
    x_ptr, w_ptr, out_ptr, M, N, K,
    BN: tl.constexpr, BK: tl.constexpr, STAGES: tl.constexpr, UPCAST: tl.constexpr, BM: tl.constexpr,
):  # fmt: skip
    n_rows = (tl.program_id(0) * BN + tl.arange(0, BN)).to(tl.int64)
    ms = tl.arange(0, BM)
    m_ok = ms < M
    acc = tl.zeros((BN, BM), dtype=tl.float32)
    for k0 in tl.range(0, K, BK, num_stages=STAGES):
        cols = k0 + tl.arange(0, BK)
        w = tl.load(w_ptr + n_rows[:, None] * K + cols[None, :])
        x = tl.load(x_ptr + ms[:, None] * K + cols[None, :], mask=m_ok[:, None], other=0.0)
        if UPCAST:
            w, x = w.to(tl.float32), x.to(tl.float32)
        acc = tl.dot(w, tl.trans(x), acc, input_precision="ieee")
    tl.store(out_ptr + ms[None, :] * N + n_rows[:, None], acc.to(out_ptr.dtype.element_ty), mask=m_ok[None, :])


@triton.jit
def dotx_kernel(
    x_ptr, w_ptr, out_ptr, M, N, K,
    BN: tl.constexpr, BK: tl.constexpr, STAGES: tl.constexpr, UPCAST: tl.constexpr, BM: tl.constexpr,
):  # fmt: skip
    n_rows = (tl.program_id(0) * BN + tl.arange(0, BN)).to(tl.int64)
    ms = tl.arange(0, BM)
    m_ok = ms < M
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in tl.range(0, K, BK, num_stages=STAGES):
        cols = k0 + tl.arange(0, BK)
        w = tl.load(w_ptr + n_rows[:, None] * K + cols[None, :])
        x = tl.load(x_ptr + ms[:, None] * K + cols[None, :], mask=m_ok[:, None], other=0.0)
        if UPCAST:
            w, x = w.to(tl.float32), x.to(tl.float32)
        acc = tl.dot(x, tl.trans(w), acc, input_precision="ieee")
    tl.store(out_ptr + ms[:, None] * N + n_rows[None, :], acc.to(out_ptr.dtype.element_ty), mask=m_ok[:, None])


KERNELS = {"dotw": dotw_kernel, "dotx": dotx_kernel}
CONFIGS = [  # bn, bk, stages, warps
    (16, 256, 4, 4),
    (16, 512, 3, 4),
    (16, 512, 4, 4),
    (16, 128, 6, 4),
    (32, 256, 4, 4),
    (32, 512, 3, 4),
    (32, 128, 6, 4),
    (64, 128, 4, 4),
    (64, 256, 3, 4),
    (32, 256, 4, 8),
    (64, 256, 4, 8),
    (16, 256, 4, 2),
]
MM16 = [  # kernels/mm.py rows: block_m, block_n, block_k, split_programs, num_warps, num_stages
    (16, 16, 256, 0, 4, 4),
    (16, 32, 256, 0, 4, 4),
    (16, 32, 128, 264, 4, 4),
    (16, 64, 128, 264, 4, 4),
    (16, 64, 256, 528, 4, 3),
]


class FewRows:
    def __init__(
        self, kind: str, weights: list[torch.Tensor], x: torch.Tensor, bn: int, bk: int, stages: int, warps: int
    ):
        self.n, self.k = weights[0].shape
        if self.n % bn or self.k % bk:
            raise ValueError(f"N, K multiples of ({bn}, {bk}) only")
        self.kernel, self.weights, self.x = KERNELS[kind], weights, x
        self.bn, self.bk, self.stages, self.warps = bn, bk, stages, warps
        self.out = torch.empty(x.shape[0], self.n, dtype=x.dtype, device=x.device)
        self.upcast = os.environ.get("TRITON_INTERPRET") == "1"

    def __call__(self, index: int) -> torch.Tensor:
        self.kernel[(self.n // self.bn,)](
            self.x, self.weights[index], self.out, self.x.shape[0], self.n, self.k,
            BN=self.bn, BK=self.bk, STAGES=self.stages, UPCAST=self.upcast, BM=BM, num_warps=self.warps,
        )  # fmt: skip
        return self.out


def check_cpu() -> None:
    """Both kernels' arithmetic under the interpreter against the fp32 product (no timing)."""
    g = torch.Generator().manual_seed(0)
    for m, n, k, config in [(2, 32, 512, CONFIGS[0]), (5, 64, 1024, CONFIGS[4]), (8, 64, 256, CONFIGS[7])]:
        w = (torch.randn(n, k, generator=g) / k**0.5).to(DTYPE)
        x = torch.randn(m, k, generator=g).to(DTYPE)
        exact = x.float() @ w.float().T
        for kind in KERNELS:
            out = FewRows(kind, [w], x, *config)(0)
            error = ((out.float() - exact).norm() / exact.norm()).item()
            assert error < 4e-3, (kind, m, error)
            print(f"{kind} M={m} {n}x{k} config {config}: relative error {error:.1e} (bf16 output)")


def build(sm: int) -> None:
    """Every (kernel, config) compiled for `sm` without a GPU; registers, spills and shared memory from cuobjdump."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    cuobjdump = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    signature = {"x_ptr": "*bf16", "w_ptr": "*bf16", "out_ptr": "*bf16", "M": "i32", "N": "i32", "K": "i32"}
    for kind, kernel in KERNELS.items():
        for config in CONFIGS:
            bn, bk, stages, warps = config
            constexprs = {"BN": bn, "BK": bk, "STAGES": stages, "UPCAST": False, "BM": BM}
            # the JIT's specialization at the real shapes: pointers, N and K divisible by 16 (M is not)
            attrs = {(index,): [["tt.divisibility", 16]] for index, name in enumerate(signature) if name != "M"}
            source = ASTSource(kernel, {**signature, **{name: "constexpr" for name in constexprs}}, constexprs, attrs)
            compiled = triton.compile(source, target=GPUTarget("cuda", sm, 32), options={"num_warps": warps})
            with tempfile.NamedTemporaryFile(suffix=".cubin") as cubin:
                cubin.write(compiled.asm["cubin"])
                cubin.flush()
                usage = subprocess.run([str(cuobjdump), "-res-usage", cubin.name], capture_output=True, text=True)
            line = next((l.strip() for l in usage.stdout.splitlines() if "REG:" in l), usage.stdout.strip()[-200:])
            mma = (
                "wgmma"
                if "wgmma" in compiled.asm["ptx"]
                else ("mma.sync" if "mma.sync" in compiled.asm["ptx"] else "?")
            )
            ptx = compiled.asm["ptx"]
            copies = "cp.async" if "cp.async" in ptx else ("tma" if "cp.async.bulk" in ptx else "ld.global")
            print(
                f"sm_{sm} {kind} bn {bn} bk {bk} stages {stages} warps {warps}: {mma}, {copies}, shared "
                f"{compiled.metadata.shared} B; {line.split(' TEXTURE')[0]}",
                flush=True,
            )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", default="5,2,8")
    parser.add_argument("--models", default="llama-8b,llama-1b")
    parser.add_argument("--projections", default="qkv,o,down,gate_up,lm_head")
    parser.add_argument("--check-cpu", action="store_true")
    parser.add_argument("--build", type=int, default=0, help="compile every config for this SM (no GPU) and stop")
    args = parser.parse_args()
    rows = [int(r) for r in args.rows.split(",")]
    if args.check_cpu:
        check_cpu()
        return
    if args.build:
        build(args.build)
        return
    from benchmarks import common
    from benchmarks.bench_linear import ROTATE_BYTES, projections, timed_us
    from graphspec.kernels import gemv, mm

    copy_gb_s = common.measure_copy_bandwidth("cuda")["gb_s"]
    print(
        f"{common.device_name('cuda')}, triton {triton.__version__}, torch {torch.__version__}, copy {copy_gb_s:.0f} GB/s"
    )
    gains = {}  # (model, M) -> us a forward would save with the best candidate of every projection
    for model in args.models.split(","):
        shapes = projections(model)
        layers = common.SHAPES[model]["num_hidden_layers"]
        for m in rows:
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
                one = gemv.CONFIGS[90]
                row0 = x[:1]
                times["gemv(1 row)"] = timed_us(
                    lambda: [gemv.gemv(row0, w.t(), None, None, one["block_n"], one["block_k"], 4, 3) for w in weights],
                    copies,
                )
                candidates = {}
                for kind in KERNELS:
                    for config in CONFIGS:
                        candidates[f"{kind}{config[0]}x{config[1]}s{config[2]}w{config[3]}"] = (kind, config)
                for config in MM16:
                    candidates[f"mm16n{config[1]}k{config[2]}p{config[3]}"] = ("mm16", config)
                for name, (kind, config) in candidates.items():
                    try:
                        if kind == "mm16":
                            run = lambda i, c=config: mm.mm(x, weights[i].t(), None, *c)
                        else:
                            run = FewRows(kind, weights, x, *config)
                        errors[name] = err(run(0).clone())
                        times[name] = timed_us(lambda: [run(i) for i in range(copies)], copies)
                    except Exception as failure:
                        print(f"  {name}: {type(failure).__name__}: {str(failure)[:160]}")
                best = min((t, key) for key, t in times.items() if key not in ("cublas", "gemv(1 row)"))
                cublas = times["cublas"]
                print(
                    f"{model:9s} M={m} {proj:8s} N={n:6d} K={k:5d}: cublas {cublas:.1f} us ({pct(cublas):.0f}%), one-row "
                    f"gemv {times['gemv(1 row)']:.1f} ({pct(times['gemv(1 row)']):.0f}%); best {best[1]} {best[0]:.1f} us "
                    f"({pct(best[0]):.0f}%, err {errors[best[1]]:.1e}, cublas {errors['cublas']:.1e}); "
                    + ", ".join(f"{key} {us:.1f}" for key, us in times.items() if key not in ("cublas", "gemv(1 row)")),
                    flush=True,
                )
                count = 1 if proj == "lm_head" else layers
                gains[(model, m)] = gains.get((model, m), 0.0) + count * max(0.0, cublas - best[0])
                weights.clear()
    for (model, m), us in gains.items():
        print(
            f"{model} M={m}: the best candidate per projection would save {us:.0f} us a forward (sum of isolated timings)"
        )


if __name__ == "__main__":
    main()
