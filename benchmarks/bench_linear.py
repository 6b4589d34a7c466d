"""Decode-sized linear layers: the row-invariant matmul of numerics="invariant" (kernels/mm.py) against
cuBLAS (and cuBLASLt) at the real projection shapes of the benchmark pairs, each captured in a CUDA graph as
the step runs them; --sweep times other config rows, to tune kernels/mm.py CONFIGS. (It first timed a
rows-adaptive candidate kernel, no faster than cuBLAS and never lowered: docs/BENCHMARKS.md, "Experiment 2".)
At M = 1 it also times the GEMV that default numerics lower one-row products to (kernels/gemv.py, mm's
"one_row" row for this SM), the "GEMV us" column.

    python benchmarks/bench_linear.py                       # default config per M, both pairs (~1-2 min, H200)
    python benchmarks/bench_linear.py --sweep               # also a grid of kernel configs
    python benchmarks/bench_linear.py --json out.json

Per (model, projection, M rows of x) the weight [N, K] is one of several copies (together well past
L2) and each replay calls the layer once per copy, so every weight byte comes from HBM, as in a real
forward. Columns: time per call, achieved weight bandwidth, and "% copy" against the device-to-device
copy rate measured here (which counts read + write). Every output's relative error against the fp32
product is printed next to cuBLAS's (a bf16 result lands near 2e-3).

The step estimate at the end adds one speculation step's GEMMs (batch 1, K=4: the draft's first
forward has 2 rows, its other K-1 forwards 1, the target's verify K+1), per projection, for each choice;
it is a sum of isolated timings, a prediction for bench_step, not a measurement of the step; "lowered" is
what default numerics run (the GEMV at one row, cuBLAS elsewhere).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from graphspec.kernels import mm as mm_kernel

from benchmarks import common

DTYPE = torch.bfloat16
ROTATE_BYTES = 512 << 20  # weight copies per point add up to at least this (H200 L2: 50 MB)
ROWS = (1, 2, 5, 8, 16, 20, 32, 40)
SWEEP_ROWS = (1, 5, 40)  # --sweep times every config at these M only
# Config rows for --sweep: kernels/mm.py's CONFIG_FIELDS (block_m, block_n, block_k, split_programs,
# num_warps, num_stages); the first is the sm_90 row.
SWEEP = [
    tuple(mm_kernel.CONFIGS[90].values()),
    (64, 32, 128, 256, 4, 4),
    (64, 32, 256, 256, 4, 3),
    (64, 64, 256, 256, 4, 3),
    (64, 128, 128, 256, 4, 4),
    (64, 64, 128, 512, 4, 4),
    (64, 64, 128, 128, 4, 4),
    (64, 64, 128, 256, 8, 4),
    (32, 64, 128, 256, 4, 4),
    (16, 64, 128, 256, 4, 4),
    (64, 64, 64, 256, 4, 6),
    (64, 32, 128, 512, 4, 4),
]


def projections(shape: str) -> dict[str, tuple[int, int]]:
    """name -> (N, K) of every linear layer of a SHAPES entry (q/k/v and gate/up fused, as graphspec loads them)."""
    s = common.SHAPES[shape]
    hidden, inter = s["hidden_size"], s["intermediate_size"]
    head_dim = s.get("head_dim", hidden // s["num_attention_heads"])
    q, kv = s["num_attention_heads"] * head_dim, s["num_key_value_heads"] * head_dim
    return {
        "qkv": (q + 2 * kv, hidden),
        "o": (hidden, q),
        "gate_up": (2 * inter, hidden),
        "down": (hidden, inter),
        "lm_head": (s["vocab_size"], hidden),
    }


def timed_us(fn, copies: int) -> float:
    return common.time_fn(fn, "cuda", reps=20, warmup=2)["ms"] * 1e3 / copies


def one_row_config(sm: int) -> tuple[int, ...]:
    """mm's "one_row" config (the GEMV) for this SM, as a SWEEP-style tuple."""
    key = (sm, "one_row") if (sm, "one_row") in mm_kernel.CONFIGS else ("default", "one_row")
    return tuple(mm_kernel.CONFIGS[key].values())


def measure(n: int, k: int, m: int, configs: list[tuple[int, ...]], copy_gb_s: float, sm: int) -> dict:
    copies = max(2, -(-ROTATE_BYTES // (n * k * 2)))
    weights = [torch.randn(n, k, dtype=DTYPE, device="cuda") for _ in range(copies)]
    x = torch.randn(m, k, dtype=DTYPE, device="cuda")
    exact = x.float() @ weights[0].float().T
    nbytes = n * k * 2

    def error(out: torch.Tensor) -> float:
        return ((out.float() - exact).norm() / exact.norm()).item()

    result = {"n": n, "k": k, "m": m, "weight_mb": nbytes / 1e6}
    result["cublas_us"] = timed_us(lambda: [F.linear(x, w) for w in weights], copies)
    result["cublas_err"] = error(F.linear(x, weights[0]))
    previous = torch.backends.cuda.preferred_blas_library()
    try:
        torch.backends.cuda.preferred_blas_library("cublaslt")
        result["cublaslt_us"] = timed_us(lambda: [F.linear(x, w) for w in weights], copies)
    except Exception as failure:  # a torch without the switch: leave the column empty
        result["cublaslt_us"] = None
        print(f"cublaslt: {failure}")
    finally:
        torch.backends.cuda.preferred_blas_library(previous)
    result["triton"] = {}
    for config in configs:

        def run(config=config) -> list:
            return [mm_kernel.mm(x, w.t(), None, *config) for w in weights]

        out = run()[0]
        us = timed_us(run, copies)
        result["triton"][str(config)] = {"us": us, "err": error(out), "finite": bool(out.isfinite().all())}
    one_row = str(one_row_config(sm))
    result["gemv_us"] = result["triton"][one_row]["us"] if one_row in result["triton"] else None
    result["gemv_err"] = result["triton"][one_row]["err"] if one_row in result["triton"] else None
    best = min(result["triton"].items(), key=lambda item: item[1]["us"])
    result["best_config"], result["best_us"] = best[0], best[1]["us"]
    default = str(configs[0])
    result["default_us"] = result["triton"][default]["us"]
    for key in ("cublas_us", "default_us", "best_us"):
        result[key.replace("_us", "_pct")] = 100 * nbytes / (result[key] * 1e-6) / 1e9 / copy_gb_s
    weights.clear()  # free the copies before the next point allocates its own
    return result


def step_estimate(rows: list[dict], target: str, draft: str, k: int = 4) -> dict:
    """Sum of one batch-1 step's GEMM times (see the module docstring) per choice."""
    index = {(r["model"], r["proj"], r["m"]): r for r in rows}
    calls = [(target, k + 1, 1)]
    calls += [(draft, 2, 1), (draft, 1, k - 1)]
    totals = {"cublas": 0.0, "default": 0.0, "best": 0.0, "min(cublas,default)": 0.0, "lowered": 0.0}
    for model, m, times in calls:
        layers = common.SHAPES[model]["num_hidden_layers"]
        for proj in projections(model):
            r = index.get((model, proj, m))
            if r is None:
                return {}
            count = times * (1 if proj == "lm_head" else layers)
            totals["cublas"] += count * r["cublas_us"]
            totals["default"] += count * r["default_us"]
            totals["best"] += count * r["best_us"]
            totals["min(cublas,default)"] += count * min(r["cublas_us"], r["default_us"])
            totals["lowered"] += count * (r["gemv_us"] if r["gemv_us"] is not None else r["cublas_us"])
    return {key: value / 1e3 for key, value in totals.items()}  # ms


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sweep", action="store_true", help="time every config of SWEEP, not just the default")
    parser.add_argument("--pairs", default="llama,qwen3")
    parser.add_argument("--models", default="", help="comma list of SHAPES names (default: both models of each pair)")
    parser.add_argument("--rows", default=",".join(map(str, ROWS)))
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("bench_linear needs a CUDA GPU")
        return 2
    torch.manual_seed(0)
    major, minor = torch.cuda.get_device_capability()
    sm = major * 10 + minor
    default = SWEEP[0]
    configs = [default] + [c for c in SWEEP if c != default] if args.sweep else [default]
    copy_gb_s = common.measure_copy_bandwidth("cuda")["gb_s"]
    print(f"{common.device_name('cuda')} sm_{sm}, copy {copy_gb_s:.0f} GB/s, default config {default}")
    rows_m = [int(v) for v in args.rows.split(",")]
    rows = []
    for pair in args.pairs.split(","):
        for model in common.PAIRS[pair]:
            if args.models and model not in args.models.split(","):
                continue
            for proj, (n, k) in projections(model).items():
                for m in rows_m:
                    chosen = configs if m in SWEEP_ROWS else [default]
                    r = measure(n, k, m, chosen + [one_row_config(sm)] * (m == 1), copy_gb_s, sm)
                    r.update(model=model, proj=proj)
                    rows.append(r)
                    print(
                        f"{model:11s} {proj:8s} N={n:6d} K={k:5d} M={m:2d}: cublas {r['cublas_us']:7.1f} us "
                        f"({r['cublas_pct']:5.1f}%), lt {r['cublaslt_us'] or float('nan'):7.1f}, "
                        f"ours {r['default_us']:7.1f} ({r['default_pct']:5.1f}%), "
                        + (f"gemv {r['gemv_us']:6.1f} (err {r['gemv_err']:.1e}), " if r["gemv_us"] else "")
                        + f"best {r['best_us']:7.1f} "
                        f"{r['best_config']} err ours {r['triton'][str(default)]['err']:.1e} "
                        f"cublas {r['cublas_err']:.1e}",
                        flush=True,
                    )
    estimates = {pair: step_estimate(rows, *common.PAIRS[pair]) for pair in args.pairs.split(",")}
    print(
        "\n| model | proj | N | K | M | cuBLAS us | cuBLASLt us | ours us | ours/cuBLAS | ours % copy | GEMV us | "
        "GEMV/cuBLAS | best config |"
    )
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
    for r in rows:
        lt = f"{r['cublaslt_us']:.1f}" if r["cublaslt_us"] else "-"
        print(
            f"| {r['model']} | {r['proj']} | {r['n']} | {r['k']} | {r['m']} | {r['cublas_us']:.1f} | {lt} | "
            f"{r['default_us']:.1f} | {r['default_us'] / r['cublas_us']:.2f} | {r['default_pct']:.1f} | "
            + (f"{r['gemv_us']:.1f} | {r['gemv_us'] / r['cublas_us']:.2f} | " if r["gemv_us"] else "- | - | ")
            + f"{r['best_config']} ({r['best_us']:.1f}) |"
        )
    print("\nGEMM time of one batch-1 K=4 step, summed from the isolated timings above (ms):")
    for pair, totals in estimates.items():
        summed = ", ".join(f"{key} {value:.2f}" for key, value in totals.items())
        print(f"  {pair}: " + (summed or "needs --rows with 1, 2 and 5 (the draft's forwards and the verify)"))
    if args.json:
        common.write_json(args.json, {"sm": sm, "copy_gb_s": copy_gb_s, "rows": rows, "step": estimates})
    return 0


if __name__ == "__main__":
    sys.exit(main())
