# ruff: noqa  (the script as run, kept with its results)
"""Probe: the decode/verify attention kernel (rotary fused, as the step runs it) at short contexts, per launch
config, next to the long-context shapes CONFIGS[90] was tuned at (issue 16: attention is the largest non-GEMM
item of a decode: 13 us per launch at B = 16 over 512 keys, 30% of the copy rate).

8B heads (32 q, 8 kv, D 128), bf16; the cache of `capacity` positions per slot holds `length` keys per row
(start_pos = length - T); slots rotated over 4 sets so K/V come from HBM; each launch timed in a CUDA graph
(median of 30), us per launch. Config = block_n / num_warps / num_stages / programs_per_sm (block_m and
split_keys 0, as CONFIGS[90]).

    python docs/results/2026-11-29-attention-short/probe.py
"""

from __future__ import annotations

import itertools
import sys

import torch

sys.path.insert(0, "benchmarks")
import common  # noqa: E402
from graphspec.kernels import attention as kernel  # noqa: E402

Q_HEADS, KV_HEADS, D, ROTATE = 32, 8, 128, 4
SHAPES = [  # (batch, T, length, capacity)
    (1, 1, 512, 1024),
    (1, 5, 512, 1024),
    (16, 1, 512, 1024),
    (16, 5, 512, 1024),
    (16, 5, 512, 8192),
    (1, 5, 8000, 8192),
    (16, 5, 8000, 8192),
    (64, 5, 4000, 4096),
]
CURRENT = tuple(kernel.CONFIGS[90][f] for f in ("block_n", "num_warps", "num_stages", "programs_per_sm"))
GRID = sorted(set(itertools.product((32, 64, 128), (4, 8), (2, 3, 4), (1, 2, 4))) | {CURRENT})


def inputs(batch, t, length, capacity):
    cache = torch.empty(1, 2, batch * ROTATE, KV_HEADS, capacity, D, dtype=torch.bfloat16, device="cuda").normal_()
    q = torch.randn(batch, Q_HEADS, t, D, dtype=torch.bfloat16, device="cuda")
    k = torch.randn(batch, KV_HEADS, t, D, dtype=torch.bfloat16, device="cuda")
    v = torch.randn_like(k)
    cos = torch.randn(batch, t, D, device="cuda").to(torch.bfloat16)
    sin = torch.randn_like(cos)
    slot_sets = [torch.arange(i * batch, (i + 1) * batch, device="cuda") for i in range(ROTATE)]
    start = torch.full((batch,), length - t, device="cuda")
    return cache, q, (k, v, cos, sin), slot_sets, start


def time_config(cache, q, rotary, slot_sets, start, config):
    block_n, warps, stages, pps = config

    def run():
        for slots in slot_sets:
            kernel.attention(q, cache, 0, slots, start, D**-0.5, block_n, warps, stages, pps, 0, 0, rotary=rotary)

    return common.time_fn(run, "cuda", reps=30, warmup=3)["ms"] * 1e3 / ROTATE


def main():
    print(torch.cuda.get_device_name(), torch.__version__, "current", "/".join(map(str, CURRENT)), flush=True)
    for shape in SHAPES:
        cache, q, rotary, slot_sets, start = inputs(*shape)
        ref = None
        times = {}
        for config in GRID:
            try:
                us = time_config(cache, q, rotary, slot_sets, start, config)
                out = kernel.attention(q, cache, 0, slot_sets[0], start, D**-0.5, *config, 0, 0, rotary=rotary)
            except Exception as error:  # out of resources: not a candidate
                continue
            if ref is None:
                ref = out.float()
            err = ((out.float() - ref).norm() / ref.norm()).item()
            times[config] = (us, err)
        best = sorted(times.items(), key=lambda item: item[1][0])[:5]
        now = times.get(CURRENT, (float("nan"), 0))[0]
        cells = ", ".join(f"{'/'.join(map(str, c))} {us:.1f}{'' if e < 1e-2 else ' WRONG'}" for c, (us, e) in best)
        print(
            f"B={shape[0]} T={shape[1]} keys={shape[2]} cap={shape[3]}: current {now:.1f} us; best {cells}", flush=True
        )
        del cache


if __name__ == "__main__":
    main()
