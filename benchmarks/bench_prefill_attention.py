"""Prefill attention kernel: graphspec::prefill_attention_triton next to torch SDPA (cuDNN / flash,
causal, GQA) at the prefill shapes of a Llama-3.1-8B target (32/8 heads x 128), a Llama-3.2-1B draft
(32/8 x 64) and Qwen3.5's full-attention layers (16/4 x 256), bf16, in TFLOP/s of causal attention
(2 matmuls, half of T x T scored), with the relative error against the fp32 reference.

    python benchmarks/bench_prefill_attention.py            # the registry's config for this GPU's SM
    python benchmarks/bench_prefill_attention.py --sweep    # also every config of SWEEP_GRID, fastest first

Each call is captured in a CUDA graph and timed over replays (benchmarks/common.time_fn, median), as the
runtime runs it. SDPA gets its inputs already contiguous in [B, H, T, D] and writes no cache, so it does
a little less than graphspec's kernel (which also stores the chunk's K/V into the cache).
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from graphspec.kernels import prefill_attention as kernel

from benchmarks import common
from graphspec.lowering import registry

SHAPES = [  # (name, q heads, kv heads, head dim, cached prefix, chunk tokens)
    ("8B 4096", 32, 8, 128, 0, 4096),
    ("8B 2048", 32, 8, 128, 0, 2048),
    ("8B 512 after 3584", 32, 8, 128, 3584, 512),
    ("1B 4096", 32, 8, 64, 0, 4096),
    ("Qwen3.5 x256 4096", 16, 4, 256, 0, 4096),
]
SWEEP_GRID = list(itertools.product((64, 128), (32, 64, 128), (4, 8), (2, 3, 4)))  # block_m, block_n, warps, stages


def inputs(q_heads: int, kv_heads: int, head_dim: int, prefix: int, tokens: int):
    g = torch.Generator(device="cuda").manual_seed(0)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g, device="cuda", dtype=torch.bfloat16)

    q = randn(1, q_heads, tokens, head_dim)
    k, v = randn(1, kv_heads, tokens, head_dim), randn(1, kv_heads, tokens, head_dim)
    cache = randn(1, 2, 2, kv_heads, prefix + tokens, head_dim)  # [L, 2, SLOTS, Hkv, S, D]
    slot_ids = torch.zeros(1, dtype=torch.int64, device="cuda")
    start_pos = torch.full((1,), prefix, dtype=torch.int64, device="cuda")
    return q, k, v, cache, slot_ids, start_pos


def causal_flops(q_heads: int, head_dim: int, prefix: int, tokens: int) -> float:
    """2 matmuls of 2 * D flops per scored (query, key) pair; a query sees the prefix and half the chunk."""
    pairs = tokens * prefix + tokens * (tokens + 1) / 2
    return 4.0 * head_dim * q_heads * pairs


def time_kernel(case, scale: float, values: tuple[int, ...]) -> tuple[float, float]:
    q, k, v, cache, slot_ids, start_pos = case

    def run() -> torch.Tensor:
        return torch.ops.graphspec.prefill_attention_triton(q, k, v, cache, 0, slot_ids, start_pos, scale, *values)

    ms = common.time_fn(run, "cuda", reps=20)["ms"]
    fp32 = (q.float(), k.float(), v.float(), cache.float())
    exact = kernel.prefill_attention_reference(*fp32, 0, slot_ids, start_pos, scale)
    return ms, ((run().float() - exact).norm() / exact.norm()).item()


def time_sdpa(case) -> float:
    q, k, v, cache, _, start_pos = case
    prefix = int(start_pos[0])
    keys = torch.cat((cache[0, 0, 0, :, :prefix].unsqueeze(0), k), dim=2)
    values = torch.cat((cache[0, 1, 0, :, :prefix].unsqueeze(0), v), dim=2)
    # Causal over the chunk after a fully visible prefix: a bool mask when there is a prefix.
    mask = None
    if prefix:
        total = prefix + q.shape[2]
        mask = torch.ones(q.shape[2], total, dtype=torch.bool, device="cuda").tril(prefix)

    def run() -> torch.Tensor:
        return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, is_causal=mask is None, enable_gqa=True)

    return common.time_fn(run, "cuda", reps=20)["ms"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sweep", action="store_true", help="also time every config of SWEEP_GRID")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("bench_prefill_attention needs a CUDA GPU")
        return 1
    major, minor = torch.cuda.get_device_capability()
    sm = major * 10 + minor
    entry = registry.resolve("prefill_attention", sm)
    configured = tuple(entry.config.values()) if entry else tuple(kernel.CONFIGS["default"].values())
    fields = "/".join(kernel.CONFIG_FIELDS)
    print(f"{torch.cuda.get_device_name()} sm_{sm}, torch {torch.__version__}; config {fields}")
    rows = []
    for name, q_heads, kv_heads, head_dim, prefix, tokens in SHAPES:
        case = inputs(q_heads, kv_heads, head_dim, prefix, tokens)
        flops = causal_flops(q_heads, head_dim, prefix, tokens)
        sdpa_ms = time_sdpa(case)
        grid = [configured] + ([values for values in SWEEP_GRID if values != configured] if args.sweep else [])
        timed = []
        for values in grid:
            try:
                ms, error = time_kernel(case, head_dim**-0.5, values)
            except Exception as failure:  # out of shared memory or registers: not a candidate
                print(f"{name} {values}: {type(failure).__name__}", file=sys.stderr)
                continue
            timed.append(
                {"shape": name, "config": values, "ms": ms, "tflops": flops / ms / 1e9, "rel_err": error,
                 "configured": values == configured, "sdpa_ms": sdpa_ms}
            )  # fmt: skip
        timed.sort(key=lambda row: row["ms"])
        rows += timed
        print(f"\n{name}: SDPA {sdpa_ms:.3f} ms ({flops / sdpa_ms / 1e9:.0f} TFLOP/s)")
        for row in [r for r in timed if r["configured"]] + [r for r in timed[:8] if not r["configured"]]:
            mark = "configured" if row["configured"] else ""
            print(
                f"  {'/'.join(map(str, row['config'])):>14} {row['ms']:8.3f} ms {row['tflops']:5.0f} TFLOP/s "
                f"{sdpa_ms / row['ms']:5.2f}x SDPA  rel err {row['rel_err']:.1e} {mark}"
            )
    if args.json:
        args.json.write_text(json.dumps({"sm": sm, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
