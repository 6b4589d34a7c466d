# ruff: noqa  (the script as run, kept with its results)
"""Probe: batch-1 decode/verify attention at long contexts, split count and reduce chunk (issue 16, a user at 4-16k
tokens). The 2026-11-29 table (docs/results/2026-11-29-attention-short/table_h200.log) had programs_per_sm 1 ahead
of CONFIGS[90]'s 2 at B = 1 and 4000 keys (T = 1 13.2 -> 11.0 us, T = 5 15.4 -> 13.1) and behind at B >= 4. At B = 1
(8 KV heads) 2 a SM makes 33 splits of ~121 keys at 4000 keys, and the reduce sums them REDUCE_CHUNK (16) at a time:
three dependent L2 round trips. This asks which of the two costs it: split size or the reduce's chunks.

Each launch rotary-fused as the step runs it, bf16, slots rotated over 4 sets so K/V come from HBM, timed in a CUDA
graph (common.time_fn, median of 30), us per launch. Variant = programs_per_sm / REDUCE_CHUNK / REDUCE_WARPS.

    python docs/results/2026-11-30-long-context-splits/probe.py
"""

from __future__ import annotations

import sys

import torch

sys.path.insert(0, "benchmarks")
import common  # noqa: E402
from graphspec.kernels import attention as kernel  # noqa: E402

ROTATE = 4
HEADS = {"8B": (32, 8, 128), "1B": (32, 8, 64)}
VARIANTS = [(2, 16, 1), (1, 16, 1), (2, 32, 1), (2, 64, 2), (2, 128, 4), (1, 32, 1)]
SHAPES = [  # (heads, batch, T, length, capacity)
    *(
        (h, 1, t, keys, cap)
        for h in ("8B", "1B")
        for t in (1, 5)
        for keys, cap in ((512, 1024), (2000, 8192), (4000, 8192), (8000, 8192), (16000, 32768))
    ),
    *((h, b, 5, 4000, 8192) for h in ("8B",) for b in (2, 4)),
]


def inputs(heads, batch, t, length, capacity):
    q_heads, kv_heads, d = HEADS[heads]
    cache = torch.empty(1, 2, batch * ROTATE, kv_heads, capacity, d, dtype=torch.bfloat16, device="cuda").normal_()
    q = torch.randn(batch, q_heads, t, d, dtype=torch.bfloat16, device="cuda")
    k = torch.randn(batch, kv_heads, t, d, dtype=torch.bfloat16, device="cuda")
    v = torch.randn_like(k)
    cos = torch.randn(batch, t, d, device="cuda").to(torch.bfloat16)
    sin = torch.randn_like(cos)
    slot_sets = [torch.arange(i * batch, (i + 1) * batch, device="cuda") for i in range(ROTATE)]
    start = torch.full((batch,), length - t, device="cuda")
    return cache, q, (k, v, cos, sin), slot_sets, start, d


def launch(cache, q, rotary, slots, start, d, variant):
    pps, chunk, warps = variant
    kernel.REDUCE_CHUNK, kernel.REDUCE_WARPS = chunk, warps
    config = kernel.CONFIGS[90]
    return kernel.attention(
        q,
        cache,
        0,
        slots,
        start,
        d**-0.5,
        config["block_n"],
        config["num_warps"],
        config["num_stages"],
        pps,
        0,
        0,
        0,
        rotary=rotary,
    )


def main():
    print(torch.cuda.get_device_name(), torch.__version__, "splits/chunk/warps", flush=True)
    print(
        "| heads | B | T | keys (cache) | splits pp1/pp2 | "
        + " | ".join("/".join(map(str, v)) for v in VARIANTS)
        + " |"
    )
    saved = kernel.REDUCE_CHUNK, kernel.REDUCE_WARPS
    for shape in SHAPES:
        cache, q, rotary, slot_sets, start, d = inputs(*shape)
        ref = launch(cache, q, rotary, slot_sets[0], start, d, VARIANTS[0]).float()
        cells = []
        for variant in VARIANTS:
            try:
                us = (
                    common.time_fn(
                        lambda: [launch(cache, q, rotary, s, start, d, variant) for s in slot_sets], "cuda", reps=30
                    )["ms"]
                    * 1e3
                    / ROTATE
                )
                out = launch(cache, q, rotary, slot_sets[0], start, d, variant).float()
                err = ((out - ref).norm() / ref.norm()).item()
                cells.append(f"{us:.1f}" + ("" if err < 1e-2 else " WRONG"))
            except Exception as error:
                cells.append(type(error).__name__)
        _, kv_heads, _ = HEADS[shape[0]]
        splits = [kernel.num_splits(shape[1], kv_heads, 1, shape[4], 64, pps, common_sms()) for pps in (1, 2)]
        print(
            f"| {shape[0]} | {shape[1]} | {shape[2]} | {shape[3]} ({shape[4]}) | {splits[0]}/{splits[1]} | "
            + " | ".join(cells)
            + " |",
            flush=True,
        )
        del cache
    kernel.REDUCE_CHUNK, kernel.REDUCE_WARPS = saved


def common_sms():
    return torch.cuda.get_device_properties(0).multi_processor_count


if __name__ == "__main__":
    main()
