"""Serving under load: throughput and latency against offered load, continuous batching next to static
batching, both on graphspec's own engine in this process (no HTTP: the device has no web stack, and
the server adds the same small cost to both).

Requests arrive as a Poisson process at each rate in --rates (requests/s; `inf`: all at once), with
random token-id prompts and output lengths drawn from --prompt-len and --output-len (no stop tokens:
random weights would stop at random). Two policies serve the same arrivals:
- continuous: every request is submitted when it arrives; the engine admits it into a free slot
  between steps and the bucket follows the live rows;
- static: the old generate() behaviour: take up to the largest bucket of the requests that have
  arrived, run them to the last one's end, then take the next batch.
Reported per (policy, rate): output tokens/s, requests/s, time to first token (TTFT) and inter-token
latency (ITL: the gap between two deltas over the tokens the later one carried) p50/p99, in a table,
a JSON file and an SVG plot.

    python benchmarks/bench_serve.py --json serve.json --plot serve.svg     # H200, 8B/1B random bf16 (~6 min)
    python benchmarks/bench_serve.py --preset tiny-llama --device cpu --requests 8 --rates 20,inf \\
        --prompt-len 4,16 --output-len 4,12 --batch-sizes 1,2,4 --max-seq-len 64     # smoke test
"""

from __future__ import annotations

import argparse
import math
import queue
import random
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import torch

if __package__ in (None, ""):  # run as a script: make `benchmarks` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import graphspec
from benchmarks import common
from benchmarks.bench_step import PRESETS, write_checkpoint
from graphspec.runtime.requests import Delta, GenerationResult, SamplingParams

POLICIES = ("continuous", "static")


def int_range(text: str) -> tuple[int, int]:
    low, high = (int(v) for v in text.split(","))
    if not 1 <= low <= high:
        raise argparse.ArgumentTypeError(f"expected LOW,HIGH with 1 <= LOW <= HIGH, got {text!r}")
    return low, high


def make_requests(args: argparse.Namespace, vocab: int, rate: float) -> list[dict[str, Any]]:
    """Prompts, output lengths (the same at every rate) and arrival times (seconds from the start)."""
    rng, clock = random.Random(args.seed), random.Random(args.seed + 1)  # same requests at every rate
    arrival, requests = 0.0, []
    for _ in range(args.requests):
        prompt = [rng.randrange(3, vocab) for _ in range(rng.randint(*args.prompt_len))]
        requests.append({"prompt": prompt, "max_tokens": rng.randint(*args.output_len), "arrival": arrival})
        if math.isfinite(rate):
            arrival += clock.expovariate(rate)
    return requests


def run_load(runtime: graphspec.Runtime, requests: list[dict[str, Any]], policy: str) -> dict[str, Any]:
    """Serve `requests` under `policy`; per-request timestamps of every delta."""
    out: queue.SimpleQueue = queue.SimpleQueue()
    largest = max(runtime.config.batch_sizes)
    times: list[list[float]] = [[] for _ in requests]  # delta arrival times
    sizes: list[list[int]] = [[] for _ in requests]  # tokens per delta
    done = [threading.Event() for _ in requests]
    start = time.perf_counter()

    def params(request: dict[str, Any]) -> SamplingParams:
        return SamplingParams(max_tokens=request["max_tokens"], stop_token_ids=())

    def wait_until(moment: float) -> None:
        delay = start + moment - time.perf_counter()
        if delay > 0:
            time.sleep(delay)

    def drive() -> None:
        if policy == "continuous":
            for index, request in enumerate(requests):
                wait_until(request["arrival"])
                runtime.engine.submit(request["prompt"], params(request), out, index)
            return
        next_index = 0
        while next_index < len(requests):
            wait_until(requests[next_index]["arrival"])
            now = time.perf_counter() - start
            batch = [
                i for i in range(next_index, min(next_index + largest, len(requests))) if requests[i]["arrival"] <= now
            ]
            runtime.engine.submit_all([(requests[i]["prompt"], params(requests[i]), i) for i in batch], out)
            for i in batch:
                done[i].wait()
            next_index = batch[-1] + 1

    driver = threading.Thread(target=drive, daemon=True)
    driver.start()
    finished = 0
    while finished < len(requests):
        index, item = out.get()
        now = time.perf_counter() - start
        if isinstance(item, BaseException):
            raise item
        if isinstance(item, Delta):
            times[index].append(now)
            sizes[index].append(len(item.token_ids))
        elif isinstance(item, GenerationResult):
            finished += 1
            done[index].set()
    driver.join()
    return summarize(requests, times, sizes)


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q / 100 * len(ordered)) - 1))]


def summarize(requests: list[dict[str, Any]], times: list[list[float]], sizes: list[list[int]]) -> dict[str, Any]:
    ttft = [t[0] - r["arrival"] for r, t in zip(requests, times, strict=True)]
    itl = [
        (t[i] - t[i - 1]) / s[i]
        for t, s in zip(times, sizes, strict=True)
        for i in range(1, len(t))
        for _ in range(s[i])
    ]
    tokens = sum(sum(s) for s in sizes)
    makespan = max(t[-1] for t in times) - min(r["arrival"] for r in requests)
    return {
        "output_tokens": tokens,
        "seconds": makespan,
        "tokens_per_s": tokens / makespan,
        "requests_per_s": len(requests) / makespan,
        "ttft_p50_ms": 1e3 * percentile(ttft, 50),
        "ttft_p99_ms": 1e3 * percentile(ttft, 99),
        "itl_p50_ms": 1e3 * percentile(itl, 50),
        "itl_p99_ms": 1e3 * percentile(itl, 99),
        "ttft_mean_ms": 1e3 * statistics.fmean(ttft),
    }


# --------------------------------------------------------------------------------------------------
# Plot: a dependency-free SVG (the device may not have matplotlib)
# --------------------------------------------------------------------------------------------------

COLORS = {"continuous": "#1f77b4", "static": "#d62728"}
PANELS = (
    ("tokens_per_s", "output tokens/s"),
    ("ttft_p50_ms", "TTFT p50 (ms)"),
    ("ttft_p99_ms", "TTFT p99 (ms)"),
    ("itl_p50_ms", "ITL p50 (ms)"),
    ("itl_p99_ms", "ITL p99 (ms)"),
)


def svg_plot(rows: list[dict[str, Any]], title: str) -> str:
    """One panel per metric: the metric against offered load (x: rate index, labelled), one line per policy."""
    rates = sorted({row["rate"] for row in rows}, key=lambda r: (math.isinf(r), r))
    width, height, pad = 260, 200, 40
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width * len(PANELS)}" height="{height + 40}" '
        'font-family="sans-serif" font-size="10">',
        f'<text x="8" y="14" font-size="12">{title}</text>',
    ]
    for panel, (key, label) in enumerate(PANELS):
        left = panel * width + pad
        top, bottom, right = 30, height, (panel + 1) * width - 10
        values = [row[key] for row in rows if math.isfinite(row[key])]
        high = max(values, default=1.0) * 1.1 or 1.0
        parts.append(
            f'<rect x="{left}" y="{top}" width="{right - left}" height="{bottom - top}" fill="none" stroke="#999"/>'
        )
        parts.append(f'<text x="{left}" y="{top - 4}">{label} (max {high / 1.1:.1f})</text>')

        def x(index: int, left: float = left, right: float = right) -> float:
            return left + (right - left) * (index + 0.5) / len(rates)

        for index, rate in enumerate(rates):
            name = "inf" if math.isinf(rate) else f"{rate:g}"
            parts.append(f'<text x="{x(index) - 8:.1f}" y="{bottom + 14}">{name}</text>')
        for policy, color in COLORS.items():
            points = []
            for index, rate in enumerate(rates):
                row = next((r for r in rows if r["policy"] == policy and r["rate"] == rate), None)
                if row is not None and math.isfinite(row[key]):
                    points.append(f"{x(index):.1f},{bottom - (bottom - top) * row[key] / high:.1f}")
            if points:
                parts.append(f'<polyline fill="none" stroke="{color}" stroke-width="2" points="{" ".join(points)}"/>')
        parts.append(f'<text x="{left}" y="{bottom + 28}">offered load (requests/s)</text>')
    for index, (policy, color) in enumerate(COLORS.items()):
        parts.append(f'<text x="{300 + 90 * index}" y="14" fill="{color}">{policy}</text>')
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


# --------------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", choices=sorted(PRESETS), default="llama")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("-k", "--k", type=int, default=4)
    parser.add_argument("--batch-sizes", default="1,2,4,8,16,32")
    parser.add_argument("--max-seq-len", type=int, default=1024)
    parser.add_argument("--requests", type=int, default=64, help="requests per (policy, rate)")
    parser.add_argument("--rates", default="4,8,16,32,inf", help="offered loads in requests/s; inf: all at once")
    parser.add_argument("--prompt-len", type=int_range, default=(64, 512), metavar="LOW,HIGH")
    parser.add_argument("--output-len", type=int_range, default=(32, 192), metavar="LOW,HIGH")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", default=None)
    parser.add_argument("--plot", default=None, help="SVG file for the plot")
    args = parser.parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("bench_serve: CUDA is not available; pass --device cpu for a smoke run", file=sys.stderr)
        return 2
    rates = [float(r) for r in args.rates.split(",")]
    buckets = tuple(int(b) for b in args.batch_sizes.split(","))
    dtype = "float32" if args.device == "cpu" else "bfloat16"
    target_shape, draft_shape = PRESETS[args.preset]
    with tempfile.TemporaryDirectory(dir=common.checkpoint_dir(0)) as workdir:
        target_dir = write_checkpoint(Path(workdir) / "target", target_shape, args.device, seed=1)
        draft_dir = write_checkpoint(Path(workdir) / "draft", draft_shape, args.device, seed=2)
        begin = time.perf_counter()
        runtime = graphspec.Runtime.from_pretrained(
            target_dir, draft_dir, k=args.k, batch_sizes=buckets, dtype=dtype, device=args.device,
            max_seq_len=args.max_seq_len, modes=("greedy",),
        )  # fmt: skip
    print(f"[bench_serve] compiled in {time.perf_counter() - begin:.1f} s", flush=True)
    for bucket in buckets:  # capture every bucket before anything is timed
        runtime.generate([[5, 6, 7]] * bucket, max_new_tokens=2, stop_token_ids=[])
    rows = []
    header = (
        f"{'policy':>10} {'rate':>6} {'tok/s':>9} {'req/s':>7} {'TTFT p50':>9} {'p99':>8} {'ITL p50':>8} {'p99':>8}"
    )
    print(f"{args.preset} K={args.k} buckets {buckets} on {common.device_name(args.device)}; ms\n{header}", flush=True)
    for rate in rates:
        requests = make_requests(args, runtime.vocab_size, rate)
        for policy in POLICIES:
            row = {"policy": policy, "rate": rate, **run_load(runtime, requests, policy)}
            rows.append(row)
            print(
                f"{policy:>10} {rate:>6g} {row['tokens_per_s']:>9.1f} {row['requests_per_s']:>7.2f} "
                f"{row['ttft_p50_ms']:>9.1f} {row['ttft_p99_ms']:>8.1f} "
                f"{row['itl_p50_ms']:>8.2f} {row['itl_p99_ms']:>8.2f}",
                flush=True,
            )
    stats = runtime.stats
    print(f"tokens per step {stats.mean_tokens_per_step:.2f}, mean step {stats.mean_step_ms:.2f} ms")
    if args.json:
        report = {"device": common.device_name(args.device), "args": {**vars(args), "rates": rates}, "rows": rows}
        common.write_json(args.json, report)
    if args.plot:
        Path(args.plot).write_text(svg_plot(rows, f"graphspec serving: {args.preset}, K={args.k}, {len(rows)} runs"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
