# ruff: noqa  (a probe, kept with its results)
"""Probe (issue 16; written 2026-11-29 after the one-row GEMV landed, not yet run on a GPU): does a dot-free GEMV
for a few rows (2: a draft model's catch-up forward; 5: a K = 4 verify at batch 1; 8) beat cuBLAS the way the
one-row GEMV (kernels/gemv.py) does?

At batch 1 the K = 4 draft-model step's GEMMs are the verify's 5-row products (cuBLAS: 8B q/k/v 15.9 us, the same as
at one row; docs/results/2026-11-29-gemv/first/linear_table.md), the draft's 2-row catch-up forward and its three
one-row forwards (now on the GEMV). Every one of them streams its weight once, so a few-row kernel that reads the
weight as fast as the one-row GEMV would take the verify from cuBLAS's speed to the GEMV's: about 0.3 ms of an
8.0 ms step (the GEMV took 0.17 ms off the one-row decode), and the 2-row forward about 0.1 ms.

Candidates (the weight tile [BN, BK] is loaded once and multiplied into every row's accumulator):
- "acc3": fp32 products of the BM (>= M, a power of two) rows accumulated elementwise in a [BM, BN, BK] tile, summed
  over BK once at the end (the one-row GEMV's scheme with a row axis);
- "red2": each step's [BM, BN, BK] products summed over BK into a [BM, BN] accumulator (fewer live registers, a
  reduction per step).
Configs keep BM * BN * BK / (32 * warps) <= 128 fp32 accumulators a thread.

    python docs/results/2026-11-29-few-row-gemv-probe/probe.py [--rows 2,5,8] [--models llama-8b,llama-1b]
    TRITON_INTERPRET=1 python docs/results/2026-11-29-few-row-gemv-probe/probe.py --check-cpu   # arithmetic
    python docs/results/2026-11-29-few-row-gemv-probe/probe.py --build 90      # every config for sm_90, offline

Timing as benchmarks/bench_linear.py (weights rotated past L2, CUDA-graph replays, us per call, % of the copy rate);
each line also times the one-row GEMV at the same shape (the weight-streaming speed to reach) and prints what the
best candidate per projection would save a forward against cuBLAS.
"""

import argparse
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


@triton.jit
def acc3_kernel(
    x_ptr, w_ptr, out_ptr, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, STAGES: tl.constexpr
):
    """out[m, n] = sum_k x[m, k] W[n, k] for weight rows p*BN .. p*BN+BN-1 and every row m < M (N, K multiples)."""
    n_rows = (tl.program_id(0) * BN + tl.arange(0, BN)).to(tl.int64)
    ms = tl.arange(0, BM)
    m_ok = ms < M
    acc = tl.zeros((BM, BN, BK), dtype=tl.float32)
    for k0 in tl.range(0, K, BK, num_stages=STAGES):
        cols = k0 + tl.arange(0, BK)
        w = tl.load(w_ptr + n_rows[:, None] * K + cols[None, :])
        x = tl.load(x_ptr + ms[:, None] * K + cols[None, :], mask=m_ok[:, None], other=0.0)
        acc += w.to(tl.float32)[None, :, :] * x.to(tl.float32)[:, None, :]
    out = tl.sum(acc, 2)
    tl.store(out_ptr + ms[:, None] * N + n_rows[None, :], out.to(out_ptr.dtype.element_ty), mask=m_ok[:, None])


@triton.jit
def red2_kernel(
    x_ptr, w_ptr, out_ptr, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, STAGES: tl.constexpr
):
    """acc3_kernel with each step's products summed over BK into a [BM, BN] accumulator."""
    n_rows = (tl.program_id(0) * BN + tl.arange(0, BN)).to(tl.int64)
    ms = tl.arange(0, BM)
    m_ok = ms < M
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in tl.range(0, K, BK, num_stages=STAGES):
        cols = k0 + tl.arange(0, BK)
        w = tl.load(w_ptr + n_rows[:, None] * K + cols[None, :])
        x = tl.load(x_ptr + ms[:, None] * K + cols[None, :], mask=m_ok[:, None], other=0.0)
        acc += tl.sum(w.to(tl.float32)[None, :, :] * x.to(tl.float32)[:, None, :], 2)
    tl.store(out_ptr + ms[:, None] * N + n_rows[None, :], acc.to(out_ptr.dtype.element_ty), mask=m_ok[:, None])


KERNELS = {"acc3": acc3_kernel, "red2": red2_kernel}
CONFIGS = [  # bn, bk, stages, warps (BM comes from M)
    (8, 128, 3, 4),
    (8, 256, 3, 4),
    (4, 256, 3, 4),
    (4, 512, 3, 4),
    (16, 64, 4, 4),
    (8, 128, 4, 8),
    (8, 512, 3, 4),
]


def block_m(m: int) -> int:
    return triton.next_power_of_2(max(2, m))


def fits(m: int, config: tuple[int, int, int, int]) -> bool:
    bn, bk, _, warps = config
    return block_m(m) * bn * bk <= 128 * 32 * warps


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

    def __call__(self, index: int) -> torch.Tensor:
        m = self.x.shape[0]
        self.kernel[(self.n // self.bn,)](
            self.x, self.weights[index], self.out, m, self.n, self.k,
            BM=block_m(m), BN=self.bn, BK=self.bk, STAGES=self.stages, num_warps=self.warps,
        )  # fmt: skip
        return self.out


def check_cpu() -> None:
    """Both kernels' arithmetic under the interpreter against the fp32 product (no timing)."""
    g = torch.Generator().manual_seed(0)
    for m, n, k, config in [(2, 32, 512, CONFIGS[0]), (5, 64, 1024, CONFIGS[3]), (8, 48, 256, CONFIGS[4])]:
        w = (torch.randn(n, k, generator=g) / k**0.5).to(DTYPE)
        x = torch.randn(m, k, generator=g).to(DTYPE)
        exact = x.float() @ w.float().T
        for kind in KERNELS:
            out = FewRows(kind, [w], x, *config)(0)
            error = ((out.float() - exact).norm() / exact.norm()).item()
            assert error < 4e-3, (kind, m, error)
            print(f"{kind} M={m} {n}x{k} config {config}: relative error {error:.1e} (bf16 output)")


def build(sm: int, rows: list[int]) -> None:
    """Every (kernel, M, config) compiled for `sm` without a GPU; registers and spills from cuobjdump."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    cuobjdump = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    signature = {"x_ptr": "*bf16", "w_ptr": "*bf16", "out_ptr": "*bf16", "M": "i32", "N": "i32", "K": "i32"}
    for kind, kernel in KERNELS.items():
        for m in rows:
            for config in CONFIGS:
                if not fits(m, config):
                    continue
                bn, bk, stages, warps = config
                constexprs = {"BM": block_m(m), "BN": bn, "BK": bk, "STAGES": stages}
                source = ASTSource(kernel, {**signature, **{name: "constexpr" for name in constexprs}}, constexprs)
                compiled = triton.compile(source, target=GPUTarget("cuda", sm, 32), options={"num_warps": warps})
                with tempfile.NamedTemporaryFile(suffix=".cubin") as cubin:
                    cubin.write(compiled.asm["cubin"])
                    cubin.flush()
                    usage = subprocess.run([str(cuobjdump), "-res-usage", cubin.name], capture_output=True, text=True)
                line = next((l.strip() for l in usage.stdout.splitlines() if "REG:" in l), usage.stdout.strip()[-200:])
                print(f"sm_{sm} {kind} M={m} bn {bn} bk {bk} stages {stages} warps {warps}: {line}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", default="2,5,8")
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
        build(args.build, rows)
        return
    from benchmarks import common
    from benchmarks.bench_linear import ROTATE_BYTES, projections, timed_us
    from graphspec.kernels import gemv

    copy_gb_s = common.measure_copy_bandwidth("cuda")["gb_s"]
    print(
        f"{common.device_name('cuda')}, triton {triton.__version__}, torch {torch.__version__}, copy {copy_gb_s:.0f} GB/s"
    )
    gains = {}  # (model, M) -> us a forward would save with the best candidate of every projection (never cuBLAS's loss)
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
                for kind in KERNELS:
                    for config in CONFIGS:
                        if not fits(m, config):
                            continue
                        name = f"{kind}{config[0]}x{config[1]}s{config[2]}w{config[3]}"
                        try:
                            run = FewRows(kind, weights, x, *config)
                            errors[name] = err(run(0).clone())
                            times[name] = timed_us(lambda: [run(i) for i in range(copies)], copies)
                        except Exception as failure:
                            print(f"  {name}: {type(failure).__name__}: {str(failure)[:160]}")
                best = min((t, key) for key, t in times.items() if key not in ("cublas", "gemv(1 row)"))
                cublas = times["cublas"]
                print(
                    f"{model:9s} M={m} {proj:8s} N={n:6d} K={k:5d}: cublas {cublas:.1f} us ({pct(cublas):.0f}%), one-row "
                    f"gemv {times['gemv(1 row)']:.1f}; best {best[1]} {best[0]:.1f} us ({pct(best[0]):.0f}%, err "
                    f"{errors[best[1]]:.1e}, cublas {errors['cublas']:.1e}); "
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
