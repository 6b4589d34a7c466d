# ruff: noqa  (the script as run, kept with its results)
"""Probe (issue 16): the decode/verify attention at B = 1 without a split, next to the split + reduce it runs now.

At B = 1 the kernel splits every KV head's keys over 16 programs and a second launch combines them; the step's
profile (docs/results/2026-11-29-gemv-final) has the pair at 6.3 us (4.5 + 1.8) for 1-2 MB of keys and values, 96
pairs a draft-model step. An unsplit program per KV head (8 programs) reads its whole range alone, pipelined
(num_stages), and writes the output itself: one launch. The question is whether one SM's streaming of 64-128 KB
plus no reduce beats 16x the parallelism plus a reduce launch, at the step's lengths and at a full cache.

As the step runs it: rotary, the KV write and the folded norm's row scale fused in (graphspec::rotary_kv_attention),
bf16, Llama-3.1-8B heads (32 q, 8 kv, D 128) and Llama-3.2-1B heads (32 q, 8 kv, D 64); slots rotated over 4 sets
so K/V come from HBM; each launch timed in a CUDA graph (median of 30), us per launch. Config = block_n / num_warps
/ num_stages / programs_per_sm (0: never split).

    python docs/results/2026-11-29-attention-unsplit/probe.py
"""

from __future__ import annotations

import itertools
import sys

import torch

sys.path.insert(0, "benchmarks")
import common  # noqa: E402
from graphspec.kernels import attention as kernel  # noqa: E402

ROTATE = 4
HEADS = {"8B": (32, 8, 128, 4096), "1B": (32, 8, 64, 2048)}  # q heads, kv heads, D, hidden
SHAPES = [  # (heads, batch, T, length, capacity)
    ("1B", 1, 1, 512, 1024),
    ("1B", 1, 2, 512, 1024),
    ("1B", 1, 1, 1000, 1024),
    ("8B", 1, 1, 512, 1024),
    ("8B", 1, 5, 512, 1024),
    ("8B", 1, 5, 1000, 1024),
    ("8B", 1, 1, 2000, 4096),
    ("8B", 4, 5, 512, 1024),
]
CURRENT = tuple(kernel.CONFIGS[90][f] for f in ("block_n", "num_warps", "num_stages", "programs_per_sm"))
UNSPLIT = sorted(itertools.product((64, 128, 256), (4, 8), (2, 3, 4), (0,)))


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
    return d, cache, q, (k, v, cos, sin), (src, 1e-5), slot_sets, start


def launch(d, cache, q, rotary, row_scale, slots, start, config):
    return kernel.attention(q, cache, 0, slots, start, d**-0.5, *config, 0, 0, 0, rotary=rotary, row_scale=row_scale)


def main():
    print(torch.cuda.get_device_name(), torch.__version__, "current", "/".join(map(str, CURRENT)), flush=True)
    for shape in SHAPES:
        d, cache, q, rotary, row_scale, slot_sets, start = inputs(*shape)
        ref = None
        times = {}
        for config in [CURRENT] + UNSPLIT:
            try:
                run = lambda: [launch(d, cache, q, rotary, row_scale, s, start, config) for s in slot_sets]
                us = common.time_fn(run, "cuda", reps=30, warmup=3)["ms"] * 1e3 / ROTATE
                out = launch(d, cache, q, rotary, row_scale, slot_sets[0], start, config)
            except Exception as error:  # out of resources: not a candidate
                continue
            if ref is None:
                ref = out.float()
            err = ((out.float() - ref).norm() / ref.norm()).item()
            times[config] = (us, err)
        best = sorted(times.items(), key=lambda item: item[1][0])[:6]
        now = times.get(CURRENT, (float("nan"), 0))[0]
        cells = ", ".join(f"{'/'.join(map(str, c))} {us:.1f}{'' if e < 1e-2 else ' WRONG'}" for c, (us, e) in best)
        print(f"{shape}: split (current) {now:.1f} us; best {cells}", flush=True)
        del cache


if __name__ == "__main__":
    main()
