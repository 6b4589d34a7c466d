# ruff: noqa  (the script as run, kept with its results)
"""Probe, second pass: the candidate configs from probe.py's sweep at every shape, the full table (us per launch,
same method as probe.py).

    python docs/results/2026-11-29-attention-short/table.py
"""

from __future__ import annotations

import sys

sys.path.insert(0, "docs/results/2026-11-29-attention-short")
import torch
from probe import CURRENT, inputs, time_config  # noqa: E402

CANDIDATES = [CURRENT, (64, 4, 3, 1), (64, 4, 4, 1), (128, 4, 3, 1), (128, 4, 3, 2)]
SHAPES = [(b, t, keys, cap) for b in (1, 4, 8, 16, 32, 64) for t in (1, 5) for keys, cap in ((512, 1024), (4000, 8192))]


def main():
    print(torch.cuda.get_device_name(), flush=True)
    print("| B | T | keys | " + " | ".join("/".join(map(str, c)) for c in CANDIDATES) + " |")
    for shape in SHAPES:
        cache, q, rotary, slot_sets, start = inputs(*shape)
        cells = []
        for config in CANDIDATES:
            try:
                cells.append(f"{time_config(cache, q, rotary, slot_sets, start, config):.1f}")
            except Exception as error:
                cells.append(type(error).__name__)
        print(f"| {shape[0]} | {shape[1]} | {shape[2]} | " + " | ".join(cells) + " |", flush=True)
        del cache


if __name__ == "__main__":
    main()
