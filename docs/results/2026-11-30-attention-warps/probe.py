# ruff: noqa  (the script as run, kept with its results)
"""Probe: the decode/verify attention with fewer warps a program (issue 16). The 2026-11-29 sweeps
(docs/results/2026-11-29-attention-short) tried 4 and 8 warps only. With 4 warps every key block's row max and
row sum are reduced across warps (a shared-memory round trip and barrier each) and P changes layout through shared
memory for the second dot; with 1 or 2 warps more of that stays in registers and shuffles, and more programs (more
splits) can share an SM. Batch 1, the step's shapes: 8B and 1B heads, T = 1 and 5, 512 of 1024 keys (issue 16's
benchmark) and long caches.

Each launch as the step runs it (rotary fused, the folded input norm's row scale), bf16, slots rotated over 4 sets
so K/V come from HBM, 4 launches a CUDA graph (common.time_fn, median of 30), us per launch. Config =
block_n / num_warps / num_stages / programs_per_sm (block_m, split_keys and wave_block_n 0 as CONFIGS[90]).

    python docs/results/2026-11-30-attention-warps/probe.py
"""

from __future__ import annotations

import sys

import torch

sys.path.insert(0, "benchmarks")
import common  # noqa: E402
from graphspec.kernels import attention as kernel  # noqa: E402

ROTATE = 4
HEADS = {"8B": (32, 8, 128, 4096), "1B": (32, 8, 64, 2048)}
CURRENT = tuple(kernel.CONFIGS[90][f] for f in ("block_n", "num_warps", "num_stages", "programs_per_sm"))
CONFIGS = [
    CURRENT,
    (64, 2, 3, 2),
    (64, 2, 3, 4),
    (64, 1, 3, 2),
    (64, 1, 2, 4),
    (32, 1, 3, 2),
    (32, 1, 3, 4),
    (32, 2, 3, 2),
    (32, 2, 3, 4),
    (32, 4, 3, 2),
    (128, 2, 2, 2),
]
SHAPES = [  # (heads, batch, T, length, capacity)
    *((h, 1, t, 512, 1024) for h in ("8B", "1B") for t in (1, 5)),
    ("1B", 1, 2, 512, 1024),
    *((h, 1, t, keys, cap) for h in ("8B", "1B") for t in (1, 5) for keys, cap in ((4000, 8192), (16000, 32768))),
]


def inputs(heads, batch, t, length, capacity):
    q_heads, kv_heads, d, hidden = HEADS[heads]
    cache = torch.empty(1, 2, batch * ROTATE, kv_heads, capacity, d, dtype=torch.bfloat16, device="cuda").normal_()
    q = torch.randn(batch, q_heads, t, d, dtype=torch.bfloat16, device="cuda")
    k = torch.randn(batch, kv_heads, t, d, dtype=torch.bfloat16, device="cuda")
    v = torch.randn_like(k)
    cos = torch.randn(batch, t, d, device="cuda").to(torch.bfloat16)
    sin = torch.randn_like(cos)
    src = torch.randn(batch, t, hidden, dtype=torch.bfloat16, device="cuda")
    slot_sets = [torch.arange(i * batch, (i + 1) * batch, device="cuda") for i in range(ROTATE)]
    start = torch.full((batch,), length - t, device="cuda")
    return cache, q, (k, v, cos, sin), (src, 1e-5), slot_sets, start, d


def launch(cache, q, rotary, row_scale, slots, start, d, config):
    block_n, warps, stages, pps = config
    return kernel.attention(
        q, cache, 0, slots, start, d**-0.5, block_n, warps, stages, pps, 0, 0, 0, rotary=rotary, row_scale=row_scale
    )


def main():
    print(torch.cuda.get_device_name(), torch.__version__, "block_n/warps/stages/programs_per_sm", flush=True)
    print("| heads | B | T | keys (cache) | " + " | ".join("/".join(map(str, c)) for c in CONFIGS) + " |", flush=True)
    for shape in SHAPES:
        cache, q, rotary, row_scale, slot_sets, start, d = inputs(*shape)
        ref = launch(cache, q, rotary, row_scale, slot_sets[0], start, d, CURRENT).float()
        cells = []
        for config in CONFIGS:
            try:
                run = lambda: [launch(cache, q, rotary, row_scale, s, start, d, config) for s in slot_sets]
                us = common.time_fn(run, "cuda", reps=30)["ms"] * 1e3 / ROTATE
                out = launch(cache, q, rotary, row_scale, slot_sets[0], start, d, config).float()
                err = ((out - ref).norm() / ref.norm()).item()
                cells.append(f"{us:.1f}" + ("" if err < 1e-2 else " WRONG"))
            except Exception as error:  # out of resources: not a candidate
                cells.append(type(error).__name__)
        print(
            f"| {shape[0]} | {shape[1]} | {shape[2]} | {shape[3]} ({shape[4]}) | " + " | ".join(cells) + " |",
            flush=True,
        )
        del cache


if __name__ == "__main__":
    main()
