# ruff: noqa  (the script as run, kept with its results)
"""Probe: scaled_silu_mul's tile size by row count on the H200 (issue 16). Each program reads its rows of x whole
for the row scale, so small tiles re-read x many times at verify sizes; us per launch in CUDA-graph replays
(200 launches a graph, 8B MLP: H 4096, I 14336), next to silu_mul + add_rms_norm (what the fold replaces).

    python docs/results/2026-11-29-fold-norms/tiles_probe.py
"""

from __future__ import annotations

import torch
from graphspec.kernels import add_rms_norm, scaled_silu_mul, silu_mul

HIDDEN, INTER, LAUNCHES = 4096, 14336, 200


def time_us(fn) -> float:
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(LAUNCHES):
            fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(7):
        torch.cuda.synchronize()
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / LAUNCHES)
    return sorted(times)[3]


def main() -> None:
    print(torch.cuda.get_device_name(), flush=True)
    tiles = (512, 1024, 2048, 4096, 8192)
    print("| rows | silu_mul 512 + add_rms_norm | " + " | ".join(f"scaled {t} w4 / w8" for t in tiles) + " |")
    print("| ---: | ---: | " + " | ".join("---:" for _ in tiles) + " |")
    for rows in (1, 4, 5, 16, 20, 64, 80, 320):
        gate_up = torch.randn(rows, 2 * INTER, device="cuda", dtype=torch.bfloat16)
        x, residual = (torch.randn(rows, HIDDEN, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        weight = torch.rand(HIDDEN, device="cuda", dtype=torch.bfloat16)
        base = time_us(lambda: silu_mul.silu_mul(gate_up, 512, 4)) + time_us(
            lambda: add_rms_norm.add_rms_norm(x, residual, weight, 1e-5, **add_rms_norm.CONFIGS[90])
        )
        cells = []
        for tile in tiles:
            w4 = time_us(lambda t=tile: scaled_silu_mul.scaled_silu_mul(gate_up, x, 1e-5, t, 4))
            w8 = time_us(lambda t=tile: scaled_silu_mul.scaled_silu_mul(gate_up, x, 1e-5, t, 8))
            cells.append(f"{w4:.2f} / {w8:.2f}")
        print(f"| {rows} | {base:.2f} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
