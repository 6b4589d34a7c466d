"""Prefill-sized kernels: each graphspec kernel the prefill chunk program runs besides the GEMMs, at the
shapes of a 4096-token chunk of a Llama-3.1-8B target (32/8 heads x 128, hidden 4096, MLP 14336), a
Llama-3.2-1B draft (32/8 x 64, hidden 2048, MLP 8192) and Qwen3.5's full-attention layers (16/4 x 256),
bf16, next to the stock torch path: prefill attention against SDPA (cuDNN / flash, causal, GQA) in
TFLOP/s of causal attention (2 matmuls, half of T x T scored) with the relative error against the fp32
reference; silu_mul, rotary and add_rms_norm against their torch references in GB/s of the bytes they
must move.

    python benchmarks/bench_prefill_kernels.py            # the registry's config for this GPU's SM
    python benchmarks/bench_prefill_kernels.py --sweep    # also every config of each kernel's grid, fastest first
    python benchmarks/bench_prefill_kernels.py --sweep --kernels silu_mul,rotary   # some kernels only

Each call is captured in a CUDA graph and timed over replays (benchmarks/common.time_fn, median), as the
runtime runs it. SDPA gets its inputs already contiguous in [B, H, T, D] and writes no cache, so it does
a little less than graphspec's kernel (which also stores the chunk's K/V into the cache). The decode-step
configs (CONFIGS[90]) were tuned at a few rows; this says what they cost at thousands.
"""

from __future__ import annotations

import argparse
import itertools
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from graphspec.kernels import add_rms_norm, prefill_attention, rotary, silu_mul

from benchmarks import common
from graphspec import ops
from graphspec.lowering import registry

DTYPE = torch.bfloat16
TOKENS = 4096


@dataclass
class Case:
    """One kernel at one shape: run(config values) launches it, reference() the stock torch path."""

    kernel: str
    shape: str
    run: Callable[[tuple[int, ...]], object]
    reference: Callable[[], object]
    work: float  # flops (attention) or bytes (the others)
    unit: str  # "TFLOP/s" or "GB/s"
    grid: list[tuple[int, ...]]
    error: Callable[[tuple[int, ...]], float] | None = None
    shape_class: str | None = None  # the kernel's shape_class for these inputs: which config row is "configured"


def randn(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, device="cuda", dtype=DTYPE)


def attention_case(name: str, q_heads: int, kv_heads: int, head_dim: int, prefix: int, tokens: int) -> Case:
    q = randn(1, q_heads, tokens, head_dim)
    k, v = randn(1, kv_heads, tokens, head_dim), randn(1, kv_heads, tokens, head_dim)
    cache = randn(1, 2, 2, kv_heads, prefix + tokens, head_dim)  # [L, 2, SLOTS, Hkv, S, D]
    slot_ids = torch.zeros(1, dtype=torch.int64, device="cuda")
    start_pos = torch.full((1,), prefix, dtype=torch.int64, device="cuda")
    scale = head_dim**-0.5

    def run(values: tuple[int, ...]) -> torch.Tensor:
        return torch.ops.graphspec.prefill_attention_triton(q, k, v, cache, 0, slot_ids, start_pos, scale, *values)

    keys = torch.cat((cache[0, 0, 0, :, :prefix].unsqueeze(0), k), dim=2)
    values_ = torch.cat((cache[0, 1, 0, :, :prefix].unsqueeze(0), v), dim=2)
    mask = torch.ones(tokens, prefix + tokens, dtype=torch.bool, device="cuda").tril(prefix) if prefix else None

    def reference() -> torch.Tensor:
        return F.scaled_dot_product_attention(q, keys, values_, attn_mask=mask, is_causal=mask is None, enable_gqa=True)

    def error(values: tuple[int, ...]) -> float:
        fp32 = (q.float(), k.float(), v.float(), cache.float())
        exact = prefill_attention.prefill_attention_reference(*fp32, 0, slot_ids, start_pos, scale)
        return ((run(values).float() - exact).norm() / exact.norm()).item()

    pairs = tokens * prefix + tokens * (tokens + 1) / 2  # a query sees the prefix and half the chunk
    grid = [v for v in itertools.product((64, 128), (32, 64, 128), (4, 8), (2, 3, 4)) if v[0] % v[1] == 0]
    return Case(
        "prefill_attention", name, run, reference, 4.0 * head_dim * q_heads * pairs, "TFLOP/s", grid, error,
        prefill_attention.shape_class(q),
    )  # fmt: skip


def silu_mul_case(inter: int, tokens: int = TOKENS) -> Case:
    gate_up = randn(tokens, 2 * inter)
    grid = list(itertools.product((512, 1024, 2048, 4096, 8192), (4, 8)))
    return Case(
        "silu_mul", f"{tokens} x {inter}", lambda values: torch.ops.graphspec.silu_mul_triton(gate_up, *values),
        lambda: ops.silu_mul_reference(gate_up), 3.0 * tokens * inter * 2, "GB/s", grid,
        shape_class=silu_mul.shape_class(gate_up),
    )  # fmt: skip


def rotary_case(q_heads: int, kv_heads: int, head_dim: int) -> Case:
    q = randn(1, TOKENS, q_heads, head_dim).transpose(1, 2)  # views of the projection's output, as the model's
    k = randn(1, TOKENS, kv_heads, head_dim).transpose(1, 2)
    cos, sin = torch.rand(1, TOKENS, head_dim, device="cuda"), torch.rand(1, TOKENS, head_dim, device="cuda")
    nbytes = 2 * (q.numel() + k.numel()) * 2 + 2 * cos.numel() * 4
    grid = list(itertools.product((1, 2, 4, 8, 16, 32), (1, 2, 4, 8)))
    return Case(
        "rotary", f"{TOKENS} x {q_heads}/{kv_heads} x {head_dim}",
        lambda values: torch.ops.graphspec.rotary_triton(q, k, cos, sin, *values),
        lambda: ops.rotary_reference(q, k, cos, sin), nbytes, "GB/s", grid,
    )  # fmt: skip


def add_rms_norm_case(hidden: int) -> Case:
    x, residual, weight = randn(TOKENS, hidden), randn(TOKENS, hidden), randn(hidden)
    grid = list(itertools.product((1024, 2048, 4096, 8192, 16384), (4, 8, 16)))
    return Case(
        "add_rms_norm", f"{TOKENS} x {hidden}",
        lambda values: torch.ops.graphspec.add_rms_norm_triton(x, residual, weight, 1e-5, *values),
        lambda: ops.add_rms_norm_reference(x, residual, weight, 1e-5), 4.0 * TOKENS * hidden * 2, "GB/s", grid,
    )  # fmt: skip


def cases() -> list[Case]:
    return [
        attention_case("8B 4096", 32, 8, 128, 0, 4096),
        attention_case("8B 2048", 32, 8, 128, 0, 2048),
        attention_case("8B 512 after 3584", 32, 8, 128, 3584, 512),
        attention_case("1B 4096", 32, 8, 64, 0, 4096),
        attention_case("Qwen3.5 x256 4096", 16, 4, 256, 0, 4096),
        silu_mul_case(14336),
        silu_mul_case(8192),
        silu_mul_case(14336, tokens=512),  # where the many-rows config row starts (silu_mul.MANY_ROWS)
        rotary_case(32, 8, 128),
        rotary_case(32, 8, 64),
        add_rms_norm_case(4096),
        add_rms_norm_case(2048),
    ]


MODULES = {"prefill_attention": prefill_attention, "silu_mul": silu_mul, "rotary": rotary, "add_rms_norm": add_rms_norm}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sweep", action="store_true", help="also time every config of each kernel's grid")
    parser.add_argument("--kernels", default=",".join(MODULES), help="comma-separated subset of " + ",".join(MODULES))
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    wanted = args.kernels.split(",")
    if not set(wanted) <= set(MODULES):
        parser.error(f"--kernels {args.kernels}: choose from {', '.join(MODULES)}")
    if not torch.cuda.is_available():
        print("bench_prefill_kernels needs a CUDA GPU")
        return 1
    major, minor = torch.cuda.get_device_capability()
    sm = major * 10 + minor
    print(f"{torch.cuda.get_device_name()} sm_{sm}, torch {torch.__version__}")
    rows = []
    for case in (case for case in cases() if case.kernel in wanted):
        entry, configs = registry.resolve(case.kernel, sm), MODULES[case.kernel].CONFIGS
        # The row lowering picks for this shape (its shape class's, where the table has one).
        config = configs[registry.shape_row(case.kernel, entry.sm, case.shape_class)] if entry else configs["default"]
        configured = tuple(config.values())
        scale = 1e9 if case.unit == "TFLOP/s" else 1e6  # work / ms -> the unit
        reference_ms = common.time_fn(case.reference, "cuda", reps=20)["ms"]
        grid = [configured] + ([v for v in case.grid if v != configured] if args.sweep else [])
        timed = []
        for values in grid:
            try:
                ms = common.time_fn(lambda run=case.run, values=values: run(values), "cuda", reps=20)["ms"]
                error = case.error(values) if case.error else None
            except Exception as failure:  # out of shared memory or registers: not a candidate
                print(f"{case.kernel} {case.shape} {values}: {type(failure).__name__}", file=sys.stderr)
                continue
            timed.append({"kernel": case.kernel, "shape": case.shape, "config": values, "ms": ms,
                          "rate": case.work / ms / scale, "unit": case.unit, "rel_err": error,
                          "configured": values == configured, "reference_ms": reference_ms})  # fmt: skip
        timed.sort(key=lambda row: row["ms"])
        rows += timed
        fields = "/".join(MODULES[case.kernel].CONFIG_FIELDS)
        print(f"\n{case.kernel} {case.shape} ({fields}): torch {reference_ms:.3f} ms "
              f"({case.work / reference_ms / scale:.0f} {case.unit})")  # fmt: skip
        for row in [r for r in timed if r["configured"]] + [r for r in timed[:6] if not r["configured"]]:
            error = f"  rel err {row['rel_err']:.1e}" if row["rel_err"] is not None else ""
            print(
                f"  {'/'.join(map(str, row['config'])):>14} {row['ms']:8.3f} ms {row['rate']:6.0f} {case.unit} "
                f"{reference_ms / row['ms']:5.2f}x torch{error} {'configured' if row['configured'] else ''}"
            )
    if args.json:
        common.write_json(args.json, {"sm": sm, "rows": rows}, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
