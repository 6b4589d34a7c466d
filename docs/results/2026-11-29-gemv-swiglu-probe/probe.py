# ruff: noqa  (a probe, kept with its results)
"""Probe (issue 16; written 2026-11-29 after the one-row GEMV landed, not yet run on a GPU): one launch for a
batch-1 MLP's gate/up projection and its scaled SwiGLU instead of two.

With folded norms a one-row decode layer launches 6 kernels: the q/k/v GEMV, attention, the o GEMV (in place),
the gate/up GEMV, graphspec::scaled_silu_mul (1.9 us at one row: docs/results/2026-11-29-fold-norms/tiles_probe.log)
and the down GEMV (in place). The gate/up GEMV already streams the residual row x over K = H, which is all the
SwiGLU's row scale needs: "fused" gives each program BN rows of gate and the matching BN rows of up (weight rows
n and I + n), accumulates sum(x^2) from the x chunks it loads anyway, rounds gate and up to the dtype (what the
GEMV would have written) and writes silu(r g) (r u), r = rsqrt(mean(x^2) + eps), rounded once. Saved per layer:
one launch and the [2I] round trip; 32 layers of an 8B decode at ~1.9 us ~ 60 us, the 1B draft's three one-row
forwards ~ 90 us a K = 4 step.

    python docs/results/2026-11-29-gemv-swiglu-probe/probe.py [--models llama-8b,llama-1b]
    TRITON_INTERPRET=1 python docs/results/2026-11-29-gemv-swiglu-probe/probe.py --check-cpu   # arithmetic
    python docs/results/2026-11-29-gemv-swiglu-probe/probe.py --build 90      # every config for sm_90, offline

Timing as benchmarks/bench_linear.py (weights rotated past L2, CUDA-graph replays, us per call): cuBLAS +
scaled_silu_mul (before 2026-11-29), graphspec's GEMV + scaled_silu_mul (now), and each fused config; errors
against the fp32 reference of the unfused computation.
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

from graphspec.kernels.common import round_to  # noqa: E402

DTYPE = torch.bfloat16
EPS = 1e-5


@triton.jit
def fused_kernel(x_ptr, w_ptr, out_ptr, I, K, eps, BN: tl.constexpr, BK: tl.constexpr, STAGES: tl.constexpr):
    """out[n] = silu(r g[n]) (r u[n]) for n in p*BN .. p*BN+BN-1, g = W[n] . x, u = W[I + n] . x (each rounded to
    the dtype), r = rsqrt(mean(x^2) + eps); I, K multiples of BN, BK."""
    rows = (tl.program_id(0) * BN + tl.arange(0, BN)).to(tl.int64)
    gate_rows = w_ptr + rows[:, None] * K
    up_rows = w_ptr + (rows + I)[:, None] * K
    acc_g = tl.zeros((BN, BK), dtype=tl.float32)
    acc_u = tl.zeros((BN, BK), dtype=tl.float32)
    squares = tl.zeros((BK,), dtype=tl.float32)
    for k0 in tl.range(0, K, BK, num_stages=STAGES):
        cols = k0 + tl.arange(0, BK)
        x = tl.load(x_ptr + cols).to(tl.float32)
        acc_g += tl.load(gate_rows + cols[None, :]).to(tl.float32) * x[None, :]
        acc_u += tl.load(up_rows + cols[None, :]).to(tl.float32) * x[None, :]
        squares += x * x
    dtype = out_ptr.dtype.element_ty
    scale = tl.rsqrt(tl.sum(squares, 0) / K + eps)
    gate = round_to(tl.sum(acc_g, 1), dtype) * scale
    up = round_to(tl.sum(acc_u, 1), dtype) * scale
    out = tl.div_rn(gate, 1.0 + tl.exp(-gate)) * up
    tl.store(out_ptr + rows, out.to(dtype))


CONFIGS = [  # bn, bk, stages, warps
    (8, 512, 3, 4),
    (4, 512, 3, 4),
    (8, 256, 3, 4),
    (16, 256, 3, 4),
    (4, 1024, 3, 4),
    (8, 512, 3, 8),
]


class Fused:
    def __init__(self, weights: list[torch.Tensor], x: torch.Tensor, bn: int, bk: int, stages: int, warps: int):
        two_i, self.k = weights[0].shape
        self.i = two_i // 2
        if self.i % bn or self.k % bk:
            raise ValueError(f"I, K multiples of ({bn}, {bk}) only")
        self.weights, self.x, self.bn, self.bk, self.stages, self.warps = weights, x, bn, bk, stages, warps
        self.out = torch.empty(1, self.i, dtype=x.dtype, device=x.device)

    def __call__(self, index: int) -> torch.Tensor:
        fused_kernel[(self.i // self.bn,)](
            self.x, self.weights[index], self.out, self.i, self.k, EPS,
            BN=self.bn, BK=self.bk, STAGES=self.stages, num_warps=self.warps,
        )  # fmt: skip
        return self.out


def reference(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """The unfused computation in fp32 from the rounded gate/up product: scaled_silu_mul_reference(x @ W.T, x)."""
    from graphspec.ops import scaled_silu_mul_reference

    gate_up = (x.float() @ weight.float().T).to(x.dtype)
    return scaled_silu_mul_reference(gate_up, x, EPS).float()


def check_cpu() -> None:
    g = torch.Generator().manual_seed(0)
    for i, k, config in [(32, 1024, CONFIGS[0]), (64, 2048, CONFIGS[4])]:
        w = (torch.randn(2 * i, k, generator=g) / k**0.5).to(DTYPE)
        x = (torch.randn(1, k, generator=g) * 3).to(DTYPE)
        exact = reference(x, w)
        out = Fused([w], x, *config)(0)
        error = ((out.float() - exact).norm() / exact.norm()).item()
        assert error < 1e-2, error
        print(f"fused I={i} K={k} config {config}: relative error {error:.1e} (bf16 output)")


def build(sm: int) -> None:
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    cuobjdump = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    signature = {"x_ptr": "*bf16", "w_ptr": "*bf16", "out_ptr": "*bf16", "I": "i32", "K": "i32", "eps": "fp32"}
    for bn, bk, stages, warps in CONFIGS:
        constexprs = {"BN": bn, "BK": bk, "STAGES": stages}
        source = ASTSource(fused_kernel, {**signature, **{name: "constexpr" for name in constexprs}}, constexprs)
        compiled = triton.compile(source, target=GPUTarget("cuda", sm, 32), options={"num_warps": warps})
        with tempfile.NamedTemporaryFile(suffix=".cubin") as cubin:
            cubin.write(compiled.asm["cubin"])
            cubin.flush()
            usage = subprocess.run([str(cuobjdump), "-res-usage", cubin.name], capture_output=True, text=True)
        line = next((l.strip() for l in usage.stdout.splitlines() if "REG:" in l), usage.stdout.strip()[-200:])
        print(f"sm_{sm} fused bn {bn} bk {bk} stages {stages} warps {warps}: {line}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", default="llama-8b,llama-1b")
    parser.add_argument("--check-cpu", action="store_true")
    parser.add_argument("--build", type=int, default=0, help="compile every config for this SM (no GPU) and stop")
    args = parser.parse_args()
    if args.check_cpu:
        check_cpu()
        return
    if args.build:
        build(args.build)
        return
    from benchmarks import common
    from benchmarks.bench_linear import ROTATE_BYTES, projections, timed_us
    from graphspec.kernels import gemv, scaled_silu_mul

    copy_gb_s = common.measure_copy_bandwidth("cuda")["gb_s"]
    print(
        f"{common.device_name('cuda')}, triton {triton.__version__}, torch {torch.__version__}, copy {copy_gb_s:.0f} GB/s"
    )
    one, act = gemv.CONFIGS[90], scaled_silu_mul.CONFIGS[90]
    for model in args.models.split(","):
        n, k = projections(model)["gate_up"]
        layers = common.SHAPES[model]["num_hidden_layers"]
        copies = max(2, -(-ROTATE_BYTES // (n * k * 2)))
        weights = [torch.randn(n, k, dtype=DTYPE, device="cuda") / k**0.5 for _ in range(copies)]
        x = (torch.randn(1, k, device="cuda") * 3).to(DTYPE)
        exact = reference(x, weights[0])
        err = lambda out: ((out.float() - exact).norm() / exact.norm()).item()
        swiglu = lambda gate_up: scaled_silu_mul.scaled_silu_mul(gate_up, x, EPS, act["tile_elems"], act["num_warps"])
        unfused = {
            "cublas+act": lambda w: swiglu(F.linear(x, w)),
            "gemv+act": lambda w: swiglu(gemv.gemv(x, w.t(), None, None, one["block_n"], one["block_k"], 4, 3)),
        }
        times, errors = {}, {}
        for name, fn in unfused.items():
            errors[name] = err(fn(weights[0]))
            times[name] = timed_us(lambda fn=fn: [fn(w) for w in weights], copies)
        for config in CONFIGS:
            name = f"fused{config[0]}x{config[1]}s{config[2]}w{config[3]}"
            try:
                run = Fused(weights, x, *config)
                errors[name] = err(run(0).clone())
                times[name] = timed_us(lambda: [run(i) for i in range(copies)], copies)
            except Exception as failure:
                print(f"  {name}: {type(failure).__name__}: {str(failure)[:160]}")
        best = min((t, key) for key, t in times.items() if key.startswith("fused"))
        print(
            f"{model:9s} gate_up N={n} K={k}: cublas+act {times['cublas+act']:.1f} us, gemv+act {times['gemv+act']:.1f}; "
            f"best {best[1]} {best[0]:.1f} us (err {errors[best[1]]:.1e}, gemv+act {errors['gemv+act']:.1e}); "
            + ", ".join(f"{key} {us:.1f}" for key, us in times.items() if key.startswith("fused"))
            + f"; a one-row forward would save {layers * (times['gemv+act'] - best[0]):.0f} us against gemv+act",
            flush=True,
        )
        weights.clear()


if __name__ == "__main__":
    main()
