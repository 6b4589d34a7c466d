# ruff: noqa  (the script as run, kept with its results)
"""Probe: the sampling step's candidates selection, torch.topk over whole rows against candidates.top_logits (topk
within vocabulary chunks, then over their picks), bf16 logits of a 128256-token vocabulary, cap 128 (issue 16: the
sampling step's ~90 top-k launches took ~230 us of its 0.63 ms over the greedy step, 2026-11-30). Each call timed in
a CUDA graph (common.time_fn, median of 50), us per call; the two results' values compared sorted.

    python docs/results/2026-11-30-topk/probe.py
"""

from __future__ import annotations

import sys

import torch

sys.path.insert(0, "benchmarks")
import common  # noqa: E402
from graphspec.kernels import candidates  # noqa: E402

VOCAB, CAP = 128256, 128
SHAPES = [(1, 1), (1, 4), (1, 5), (4, 1), (4, 5), (16, 5), (64, 5)]  # (batch, positions)


def main():
    print(
        torch.cuda.get_device_name(),
        torch.__version__,
        f"vocab {VOCAB}, cap {CAP}, chunks",
        candidates.vocab_chunks(VOCAB, CAP),
        flush=True,
    )
    print("| rows (B x positions) | torch.topk us | top_logits us | same values |")
    for batch, positions in SHAPES:
        logits = torch.randn(batch, positions, VOCAB, device="cuda").to(torch.bfloat16)
        whole = common.time_fn(lambda: torch.topk(logits, CAP, dim=-1, sorted=False), "cuda", reps=50)["ms"] * 1e3
        chunked = common.time_fn(lambda: candidates.top_logits(logits, CAP), "cuda", reps=50)["ms"] * 1e3
        a = torch.topk(logits, CAP, dim=-1, sorted=False)[0].sort(-1).values
        values, index = candidates.top_logits(logits, CAP)
        same = torch.equal(a, values.sort(-1).values) and torch.equal(torch.gather(logits, -1, index), values)
        print(f"| {batch} x {positions} | {whole:.1f} | {chunked:.1f} | {same} |", flush=True)


if __name__ == "__main__":
    main()
