"""Time one speculation step: captured CUDA graphs vs eager, next to the memory-bandwidth floor.

Writes random bf16 checkpoints shaped like Llama-3.1-8B (target) and Llama-3.2-1B (draft), or the
Qwen3-8B/0.6B pair with --preset qwen3 (shapes from benchmarks/common.py), with the weights drawn on
the GPU, compiles the pair (greedy, K=4, buckets 1/4/8) and per bucket reports:
- the median time of one step, captured (replayed CUDA graph) and eager (capture="none");
- tokens per step from a generate() run, and tokens/s = rows * tokens per step / step time;
- the floor of a step: (bytes of target weights + K * bytes of draft weights) / copy bandwidth,
  the bandwidth measured in this run by a large device-to-device copy (bytes read + bytes written).
With --sampling the pair is also compiled in sampling mode and each bucket's row adds the captured
sampling step (draft tokens drawn by graphspec::sample, verify by rejection sampling) with every row
at --temperature/--top-k/--top-p, next to the greedy step of the same bucket ("sample/greedy").
Then a piecewise-captured bucket 1 (attention eager between captured pieces), a self-draft pair
(the target drafting for itself: the all-accepted ceiling), and a parity check: captured generate()
against eager generate() token for token at batch 1, 3, 5, 8 over fresh prompts. Random weights make
an unrelated 8B/1B pair accept almost nothing, so its tokens/s is the one-token-per-step case.

    python benchmarks/bench_step.py --json bench_step.json            # on the H200 (~3-4 minutes)
    python benchmarks/bench_step.py --preset tiny-llama --device cpu  # smoke test of this script
    python benchmarks/bench_step.py --sampling --no-stock --no-piecewise --self-draft none  # sampling vs greedy

The table is printed last; --json writes every number, the kernel profile and the parity result.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import gc
import json
import os
import random
import shutil
import signal
import statistics
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import transformers
from safetensors.torch import save_file

if __package__ in (None, ""):  # run as a script: make `benchmarks` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import graphspec
from benchmarks import common
from graphspec.compiled import Compiled
from graphspec.errors import InputError
from graphspec.inputs import check_sampling
from graphspec.models.decoder import checkpoint_shapes
from graphspec.models.loading import build_model
from graphspec.runtime.graphs import StepGraph
from graphspec.runtime.region_timing import time_regions
from graphspec.runtime.runtime import Runtime, RuntimeStats

# Presets are benchmarks/common.py pairs: "llama" (8B/1B, the default), "qwen3" (8B/0.6B), and the tiny
# stand-in of each for CPU smoke runs.
PRESETS = {**common.PAIRS, **{f"tiny-{name}": pair for name, pair in common.SMALL_PAIRS.items()}}


# --------------------------------------------------------------------------------------------------
# Checkpoints and the two numbers (bytes, bandwidth)
# --------------------------------------------------------------------------------------------------


def write_checkpoint(directory: Path, shape: str, device: str, seed: int) -> Path:
    """config.json + model.safetensors with N(0, 0.02) weights (norm weights 1 + N(0, 0.02)) drawn
    on `device` in bf16; names and shapes come from graphspec's own (meta) model for the config."""
    directory.mkdir(parents=True, exist_ok=True)
    config = common.make_config(shape)
    config.save_pretrained(directory)
    generator = torch.Generator(device=device).manual_seed(seed)
    state = {}
    for name, size in checkpoint_shapes(build_model(config)).items():  # tied weights appear once
        weight = torch.randn(size, generator=generator, device=device, dtype=torch.bfloat16).mul_(0.02)
        state[name] = (weight.add_(1.0) if name.endswith("norm.weight") else weight).cpu()
    save_file(state, str(directory / "model.safetensors"))
    return directory


def weight_bytes(compiled_model: torch.nn.Module, read_only: bool = False) -> int:
    """Bytes of the model's parameters; read_only drops an untied input embedding, of which a step
    reads only the rows of its tokens."""
    total = 0
    for name, parameter in compiled_model.named_parameters():
        if read_only and name == "model.embed_tokens.weight" and not compiled_model.spec.tie_word_embeddings:
            continue
        total += parameter.numel() * parameter.element_size()
    return total


def timed(fn: Callable[[], Any], iterations: int, device: str) -> list[float]:
    """Milliseconds of each call: CUDA events around each call on a GPU, the host clock on CPU."""
    if device.startswith("cuda"):
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(iterations)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(iterations)]
        for start, end in zip(starts, ends, strict=True):
            start.record()
            fn()
            end.record()
        torch.cuda.synchronize()
        return [start.elapsed_time(end) for start, end in zip(starts, ends, strict=True)]
    times = []
    for _ in range(iterations):
        begin = time.perf_counter()
        fn()
        times.append((time.perf_counter() - begin) * 1e3)
    return times


def copy_bandwidth(device: str, gib: float) -> dict[str, float]:
    """Device-to-device copy of `gib` GiB of random bf16, counting bytes read plus bytes written."""
    elements = int(gib * 2**30) // 2
    source = torch.randn(elements, device=device, dtype=torch.bfloat16)
    target = torch.empty_like(source)
    for _ in range(3):
        target.copy_(source)
    ms = statistics.median(timed(lambda: target.copy_(source), 20, device))
    moved = 2 * source.numel() * source.element_size()
    return {"bytes_moved": moved, "ms": ms, "bytes_per_s": moved / (ms / 1e3)}


# --------------------------------------------------------------------------------------------------
# Measurements on a compiled pair
# --------------------------------------------------------------------------------------------------


def without_capture(compiled: Compiled) -> Compiled:
    return dataclasses.replace(compiled, config=dataclasses.replace(compiled.config, capture="none"))


def fill_caches(runtime: Runtime, seed: int) -> None:
    """Random state contents (timing on zeros can flatter kernels), written in place."""
    generator = torch.Generator(device=runtime.device).manual_seed(seed)
    for cache in runtime.state.values():
        if not cache.is_floating_point():  # token ids (an n-gram history): random valid ids
            cache.copy_(torch.randint(0, runtime.vocab_size, cache.shape, generator=generator, device=runtime.device))
            continue
        for layer in range(cache.shape[0]):  # one layer at a time keeps the fp32 temporary small
            cache[layer].copy_(torch.randn(cache[layer].shape, generator=generator, device=runtime.device))


def load_bucket(
    graph: StepGraph,
    rows: int,
    context: int,
    vocab: int,
    seed: int,
    device: str,
    sampling: dict[str, Any] | None = None,
) -> None:
    """`rows` real rows with committed lengths around `context` in slots 0..rows-1; rest padding.
    `sampling` (temperature, top_k, top_p) sets every real row's sampling parameters and a seed each."""
    rng = random.Random(seed)
    values = {
        "last_tokens": torch.tensor([[rng.randrange(vocab), rng.randrange(vocab)] for _ in range(rows)]).to(device),
        "committed_len": torch.tensor([context + rng.randrange(-16, 16) for _ in range(rows)]).to(device),
        "slot_ids": torch.arange(rows, device=device),
        "step_counter": torch.ones(rows, dtype=torch.int64, device=device),
    }
    if sampling is not None:
        values["temperature"] = torch.full((rows,), float(sampling["temperature"]), device=device)
        values["top_k"] = torch.full((rows,), int(sampling["top_k"]), dtype=torch.int64, device=device)
        values["top_p"] = torch.full((rows,), float(sampling["top_p"]), device=device)
        values["seed"] = torch.tensor([rng.randrange(2**62) for _ in range(rows)], device=device)
    graph.buffers.load_rows(values)


def sampling_params(args: argparse.Namespace) -> dict[str, Any]:
    return {"temperature": args.temperature, "top_k": args.top_k, "top_p": args.top_p}


def time_step(
    runtime: Runtime, bucket: int, args: argparse.Namespace, iterations: int, mode: str = "greedy"
) -> dict[str, Any]:
    """Median ms of the bucket's step with `bucket` real rows; inputs are not fed back, so every call
    does the same work. The first call captures (or warms up) and is not timed. In mode "sample" the
    rows sample with the --temperature/--top-k/--top-p parameters."""
    graph = runtime.graphs[(mode, bucket)]
    sampling = sampling_params(args) if mode == "sample" else None
    load_bucket(graph, bucket, args.context, runtime.vocab_size, bucket, runtime.device, sampling)
    graph()
    for _ in range(args.warmup):
        graph()
    times = timed(graph, iterations, runtime.device)
    return {
        "mode": graph.mode,  # how the step runs: captured (full, piecewise) or eager
        "step_mode": mode,  # what it computes: greedy or sample
        "median_ms": statistics.median(times),
        "mean_ms": statistics.fmean(times),
        "min_ms": min(times),
        "iterations": iterations,
        "graph": graph.describe(),
    }


def time_drafter_steps(
    target: Path,
    draft: str,
    buckets: tuple[int, ...],
    args: argparse.Namespace,
    label: str,
    profiles: dict[str, Any] | None = None,
    read_bytes: dict[str, int] | None = None,
    **options: Any,
) -> tuple[dict[int, float], torch.nn.Module]:
    """Compile (target, draft) with `options`, then the median ms of its captured greedy step per bucket
    (time_step, rows at committed length about args.context). Returns those and the compiled target
    model (for target-only timings); the runtime is released. With `profiles` and args.profile (a bucket),
    profiles[label] gets the kernels of that bucket's step (common.kernel_profile); with `read_bytes`,
    read_bytes[label] the drafter model's weight bytes a forward reads (weight_bytes, read_only; 0 without one)."""
    begin = time.perf_counter()
    runtime = graphspec.Runtime.from_pretrained(target, draft, batch_sizes=buckets, **options)
    print(f"[bench] {label}: compiled in {time.perf_counter() - begin:.1f} s", flush=True)
    fill_caches(runtime, 0)
    steps = {b: time_step(runtime, b, args, args.replays)["median_ms"] for b in buckets}
    bucket = getattr(args, "profile", None)
    if profiles is not None and bucket in buckets and common.is_cuda(args.device):
        profiles[label] = common.kernel_profile(runtime.graphs[("greedy", bucket)], 3, top=10)
    if read_bytes is not None:
        model = runtime.drafter.model
        read_bytes[label] = 0 if model is None else weight_bytes(model, read_only=True)
    target_model = runtime.target
    del runtime
    common.free_device_memory()
    return steps, target_model


def time_replays(step: Callable[[], None], args: argparse.Namespace) -> float:
    """Median ms of `step` (captured into a CUDA graph on a GPU), after args.warmup untimed calls."""
    run = common.capture(step, args.device).replay if common.is_cuda(args.device) else step
    for _ in range(args.warmup):
        run()
    return statistics.median(timed(run, args.replays, args.device))


def random_prompts(count: int, length: int, vocab: int, rng: random.Random) -> list[list[int]]:
    return [[rng.randrange(vocab) for _ in range(length)] for _ in range(count)]


def acceptance(runtime: Runtime, rows: int, args: argparse.Namespace, seed: int) -> dict[str, float]:
    """Tokens per step and the host loop's tokens/s from one greedy generate() of `rows` prompts."""
    runtime.stats = RuntimeStats(runtime.k)
    prompts = random_prompts(rows, args.prompt_len, runtime.vocab_size, random.Random(seed))
    runtime.generate(prompts, max_new_tokens=args.gen_tokens, stop_token_ids=())
    stats = runtime.stats
    return {
        "tokens_per_step": stats.mean_tokens_per_step,
        "acceptance_rate": stats.acceptance_rate,
        "loop_tokens_per_s": stats.emitted / stats.step_seconds if stats.step_seconds else 0.0,
        "loop_step_ms": stats.mean_step_ms,
    }


def parity(captured: Runtime, eager: Runtime, args: argparse.Namespace) -> dict[str, Any]:
    """Captured vs eager generate(), token for token, at batch 1, 3, 5, 8 over fresh prompts each
    round, until about args.parity_steps eager steps have been compared."""
    rng = random.Random(1234)
    batches = (1, 3, 5, 8)
    eager.stats = RuntimeStats(eager.k)
    mismatches, compared_rows, rounds = [], 0, 0
    while eager.stats.graph_steps < args.parity_steps:
        round_index, rounds = rounds, rounds + 1
        for batch in batches:
            prompts = [[rng.randrange(captured.vocab_size) for _ in range(rng.randrange(4, 48))] for _ in range(batch)]
            options = dict(max_new_tokens=args.parity_tokens, stop_token_ids=())
            got = [r.token_ids for r in captured.generate(prompts, **options)]
            want = [r.token_ids for r in eager.generate(prompts, **options)]
            compared_rows += batch
            for row, (g, w) in enumerate(zip(got, want, strict=True)):
                if g != w:
                    first = next((i for i, (a, b) in enumerate(zip(g, w, strict=False)) if a != b), min(len(g), len(w)))
                    mismatches.append({"round": round_index, "batch": batch, "row": row, "first_difference": first})
    return {
        "batches": batches,
        "rounds": rounds,
        "steps_compared": eager.stats.graph_steps,
        "rows_compared": compared_rows,
        "mismatches": mismatches,
        "identical": not mismatches,
    }


# Kernel name substrings -> category, first match wins (cuBLAS on sm90 names its GEMMs nvjet_*).
def step_regions(runtime: Runtime, row: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """Draft / verify / accept time of the bucket's real step, measured inside it by marks at its region
    boundaries (graphspec.runtime.region_timing), at the mean context of the acceptance run; host = that
    run's wall time per step minus the plain step."""
    bucket = row["batch"]
    graph = runtime.graphs[("greedy", bucket)]
    context = args.prompt_len + args.gen_tokens // 2
    load_bucket(graph, bucket, context, runtime.vocab_size, bucket, runtime.device)
    timing = time_regions(graph, runs=max(5, args.replays // 5), warmup=args.warmup)
    return {"bucket": bucket, "context": context, **timing.as_dict(row.get("accept", {}).get("loop_step_ms"))}


def print_regions(regions: dict[str, Any] | None) -> None:
    if not regions:
        return
    if "error" in regions:
        print(f"\nregions of the step failed: {regions['error']}")
        return
    marked = regions["marked_ms"]
    print(
        f"\nregions of one {regions['mode']} step at batch {regions['bucket']}, context ~{regions['context']} "
        f"({regions['clock']}, inside the step): "
        + ", ".join(
            f"{name} {regions[f'{name}_ms']:.2f} ms ({100 * regions[f'{name}_ms'] / marked:.0f}%)"
            for name in ("draft", "verify", "accept")
        )
        + f" = {marked:.2f} ms; plain step {regions['step_ms']:.2f} ms"
        + (
            f"; host {regions['host_ms']:.2f} ms of generate()'s {regions['wall_ms_per_step']:.2f} ms per step"
            if "host_ms" in regions
            else ""
        )
    )


def measure_pair(
    name: str, compiled: Compiled, args: argparse.Namespace, floor_ms: float | None, eager_too: bool
) -> tuple[list[dict[str, Any]], Runtime, Runtime | None]:
    captured = Runtime(compiled)
    eager = Runtime(without_capture(compiled)) if eager_too else None
    for runtime in (captured, eager):
        if runtime is not None:
            fill_caches(runtime, 0)
    rows = []
    for bucket in compiled.config.batch_sizes:
        row: dict[str, Any] = {"pair": name, "batch": bucket, "floor_ms": floor_ms}
        try:
            row["captured"] = time_step(captured, bucket, args, args.replays)
            if eager is not None:
                row["eager"] = time_step(eager, bucket, args, args.eager_steps)
            if ("sample", bucket) in captured.graphs:
                row["sampled"] = {**time_step(captured, bucket, args, args.replays, "sample"), **sampling_params(args)}
            row["accept"] = acceptance(captured, bucket, args, seed=bucket)
            fill_caches(captured, 0)  # generate() wrote real KV; keep timing inputs the same
        except Exception as error:  # keep the other buckets' numbers when one fails
            row["error"] = f"{type(error).__name__}: {error}"
            traceback.print_exc()
        rows.append(row)
        print(f"[bench] {name} batch {bucket}: {summarize(row)}", flush=True)
    return rows, captured, eager


def summarize(row: dict[str, Any]) -> str:
    if "error" in row:
        return "ERROR " + row["error"]
    parts = [f"{row['captured']['mode']} {row['captured']['median_ms']:.2f} ms"]
    if "eager" in row:
        parts.append(f"eager {row['eager']['median_ms']:.2f} ms")
    if "sampled" in row:
        sampled = row["sampled"]["median_ms"]
        parts.append(f"sampling {sampled:.2f} ms ({sampled / row['captured']['median_ms']:.2f}x greedy)")
    parts.append(f"{row['accept']['tokens_per_step']:.2f} tok/step")
    return ", ".join(parts)


# --------------------------------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------------------------------


def table(rows: list[dict[str, Any]]) -> str:
    header = (
        "pair",
        "batch",
        "mode",
        "step ms",
        "eager ms",
        "speedup",
        "floor ms",
        "step/floor",
        "tok/step",
        "tok/s",
        "eager tok/s",
        "loop tok/s",
        "sample ms",
        "sample/greedy",
    )
    lines = [header]
    for row in rows:
        if "error" in row:
            lines.append((row["pair"], str(row["batch"]), "ERROR", row["error"][:60], *[""] * 10))
            continue
        sampled = row.get("sampled", {}).get("median_ms")
        step, tokens = row["captured"]["median_ms"], row["accept"]["tokens_per_step"]
        eager = row.get("eager", {}).get("median_ms")
        floor = row.get("floor_ms")
        lines.append(
            (
                row["pair"],
                str(row["batch"]),
                row["captured"]["mode"],
                f"{step:.2f}",
                f"{eager:.2f}" if eager else "-",
                f"{eager / step:.1f}x" if eager else "-",
                f"{floor:.2f}" if floor else "-",
                f"{step / floor:.2f}" if floor else "-",
                f"{tokens:.2f}",
                f"{row['batch'] * tokens / step * 1e3:.0f}",
                f"{row['batch'] * tokens / eager * 1e3:.0f}" if eager else "-",
                f"{row['accept']['loop_tokens_per_s']:.0f}",
                f"{sampled:.2f}" if sampled else "-",
                f"{sampled / step:.2f}x" if sampled else "-",
            )
        )
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    rendered = [
        "  ".join(cell.rjust(w) if i else cell.ljust(w) for i, (cell, w) in enumerate(zip(line, widths, strict=True)))
        for line in lines
    ]
    rendered.insert(1, "-" * len(rendered[0]))
    return "\n".join(rendered)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", choices=sorted(PRESETS), default="llama")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("-k", "--k", type=int, default=4)
    parser.add_argument("--batch-sizes", default="1,4,8")
    parser.add_argument("--max-seq-len", type=int, default=1024)
    parser.add_argument("--context", type=int, default=512, help="committed length of the timed rows")
    parser.add_argument("--replays", type=int, default=100, help="timed captured steps per bucket")
    parser.add_argument("--eager-steps", type=int, default=15, help="timed eager steps per bucket")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--gen-tokens", type=int, default=48, help="new tokens per row when measuring acceptance")
    parser.add_argument("--parity-steps", type=int, default=200)
    parser.add_argument("--parity-tokens", type=int, default=25)
    parser.add_argument("--self-draft", choices=("auto", "target", "draft", "none"), default="auto")
    parser.add_argument("--no-piecewise", action="store_true", help="skip the piecewise bucket-1 row")
    parser.add_argument("--no-stock", action="store_true", help="skip the stock-torch (lowering=reference) rows")
    parser.add_argument("--copy-gib", type=float, default=4.0)
    parser.add_argument("--workdir", default=None, help="where checkpoints go (default /dev/shm, else /tmp)")
    parser.add_argument("--skip-passes", default="", help="comma list of pipeline passes to skip (A/B runs)")
    parser.add_argument("--json", default=None)
    parser.add_argument("--sampling", action="store_true", help="also time the sampling-mode step per bucket")
    parser.add_argument("--temperature", type=float, default=0.8, help="sampling rows' temperature (--sampling)")
    parser.add_argument("--top-k", type=int, default=50, help="sampling rows' top-k, 0 = off (--sampling)")
    parser.add_argument("--top-p", type=float, default=0.9, help="sampling rows' top-p, 1 = off (--sampling)")
    args = parser.parse_args(argv)
    if args.sampling:
        try:
            check_sampling(args.temperature, args.top_k, args.top_p)
        except InputError as error:
            parser.error(str(error))
        if args.temperature <= 0:
            parser.error("--sampling needs --temperature > 0 (0 is greedy)")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # A stage time limit (timeout) sends SIGTERM: exit through `finally` so the table and JSON still appear.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    device = args.device
    cuda = device.startswith("cuda")
    buckets = tuple(int(b) for b in args.batch_sizes.split(","))
    started = time.perf_counter()
    shm = Path("/dev/shm")
    base = Path(args.workdir) if args.workdir else (shm if shm.is_dir() and os.access(shm, os.W_OK) else Path("/tmp"))
    workdir = Path(tempfile.mkdtemp(prefix="graphspec_bench_", dir=base))
    report: dict[str, Any] = {
        "date": datetime.date.today().isoformat(),
        "command": " ".join([sys.executable.split("/")[-1], *sys.argv]),
        "device": torch.cuda.get_device_name() if cuda else "cpu",
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "args": vars(args),
        "rows": [],
    }
    try:
        import triton

        report["triton"] = triton.__version__
    except ImportError:
        pass
    target_shape, draft_shape = PRESETS[args.preset]
    modes = ("greedy", "sample") if args.sampling else ("greedy",)
    options = dict(k=args.k, dtype="bfloat16", device=device, max_seq_len=args.max_seq_len, modes=modes)
    options["skip"] = tuple(name for name in args.skip_passes.split(",") if name)
    try:
        bandwidth = copy_bandwidth(device, args.copy_gib if cuda else 0.25)
        report["copy_bandwidth"] = bandwidth
        print(f"[bench] copy bandwidth {bandwidth['bytes_per_s'] / 1e12:.2f} TB/s (read + write)", flush=True)
        begin = time.perf_counter()
        target_dir = write_checkpoint(workdir / "target", target_shape, device, seed=1)
        draft_dir = write_checkpoint(workdir / "draft", draft_shape, device, seed=2)
        report["checkpoint_seconds"] = time.perf_counter() - begin
        print(f"[bench] checkpoints written in {report['checkpoint_seconds']:.1f} s to {workdir}", flush=True)

        begin = time.perf_counter()
        compiled = graphspec.compile(target_dir, draft_dir, batch_sizes=buckets, **options)
        report["compile_seconds"] = time.perf_counter() - begin
        target_bytes, draft_bytes = weight_bytes(compiled.target.model), weight_bytes(compiled.drafter.model)
        floor_bytes = target_bytes + args.k * draft_bytes
        floor_ms = floor_bytes / bandwidth["bytes_per_s"] * 1e3
        report["floor"] = {
            "target_bytes": target_bytes,
            "draft_bytes": draft_bytes,
            "bytes": floor_bytes,
            "ms": floor_ms,
            "read_only_ms": (
                weight_bytes(compiled.target.model, True) + args.k * weight_bytes(compiled.drafter.model, True)
            )
            / bandwidth["bytes_per_s"]
            * 1e3,
        }
        print(f"[bench] compiled in {report['compile_seconds']:.1f} s; floor {floor_ms:.2f} ms", flush=True)
        pair = f"{target_shape.split('-')[-1].upper()}/{draft_shape.split('-')[-1].upper()}"
        rows, captured, eager = measure_pair(pair, compiled, args, floor_ms, eager_too=True)
        report["rows"] += rows
        for mode, key in (("greedy", "profile_batch_1"), ("sample", "profile_batch_1_sample")):
            graph = captured.graphs.get((mode, buckets[0]))
            if not (cuda and graph is not None and graph.captured):
                continue
            try:
                report[key] = common.kernel_profile(graph, 3)
            except Exception as error:
                report[key] = {"error": f"{type(error).__name__}: {error}"}
                traceback.print_exc()
        if rows and "error" not in rows[0]:
            try:
                report["regions_batch_1"] = step_regions(captured, rows[0], args)
            except Exception as error:
                report["regions_batch_1"] = {"error": f"{type(error).__name__}: {error}"}
                traceback.print_exc()
        try:
            begin = time.perf_counter()
            report["parity"] = parity(captured, eager, args)
            report["parity"]["seconds"] = time.perf_counter() - begin
            print(f"[bench] parity: {json.dumps({k: v for k, v in report['parity'].items() if k != 'mismatches'})}")
        except Exception as error:
            report["parity"] = {"error": f"{type(error).__name__}: {error}"}
            traceback.print_exc()
        del captured, eager, compiled
        release(cuda)

        if not args.no_stock and cuda:
            # The same step with every graphspec op left as its torch reference (lowering="reference"):
            # what stock torch kernels (cuBLAS GEMMs, aten elementwise) reach under the same capture.
            try:
                stock = graphspec.compile(target_dir, draft_dir, batch_sizes=buckets, lowering="reference", **options)
                rows, stock_runtime, _ = measure_pair(f"{pair} stock", stock, args, floor_ms, eager_too=False)
                report["rows"] += rows
                with contextlib.suppress(Exception):
                    stock_graph = stock_runtime.graphs[("greedy", buckets[0])]
                    report["profile_batch_1_stock"] = common.kernel_profile(stock_graph, 3)
                del stock, stock_runtime, rows
            except Exception as error:
                report["stock_error"] = f"{type(error).__name__}: {error}"
                traceback.print_exc()
            release(cuda)

        if not args.no_piecewise and cuda:
            try:
                begin = time.perf_counter()
                piecewise = graphspec.compile(target_dir, draft_dir, batch_sizes=(1,), capture="piecewise", **options)
                report["piecewise_compile_seconds"] = time.perf_counter() - begin
                rows, _, _ = measure_pair(pair, piecewise, args, floor_ms, eager_too=False)
                report["rows"] += rows
                del piecewise, rows
            except Exception as error:
                report["piecewise_error"] = f"{type(error).__name__}: {error}"
                traceback.print_exc()
            release(cuda)

        self_dir = self_draft_dir(args, target_dir, draft_dir, target_shape, cuda)
        if self_dir is not None:
            begin = time.perf_counter()
            own = graphspec.compile(self_dir, self_dir, batch_sizes=buckets, **options)
            report["self_draft_compile_seconds"] = time.perf_counter() - begin
            own_bytes = weight_bytes(own.target.model)
            own_floor = (own_bytes + args.k * own_bytes) / bandwidth["bytes_per_s"] * 1e3
            label = pair.split("/")[0 if self_dir == target_dir else 1]
            name = f"{label}/{label} self"
            rows, _, _ = measure_pair(name, own, args, own_floor, eager_too=False)
            report["rows"] += rows
            report["self_draft"] = {"checkpoint": self_dir.name, "floor_ms": own_floor}
            del own, rows
            release(cuda)
    finally:
        report["seconds"] = time.perf_counter() - started
        shutil.rmtree(workdir, ignore_errors=True)
        if args.json:
            common.write_json(args.json, report)
        print_report(report)
    ok = all("error" not in row for row in report["rows"]) and report.get("parity", {}).get("identical", False)
    return 0 if ok else 1


def self_draft_dir(args: argparse.Namespace, target: Path, draft: Path, target_shape: str, cuda: bool) -> Path | None:
    """The target as its own draft when two copies fit in free GPU memory with room to spare,
    else the draft as its own draft."""
    if args.self_draft == "none":
        return None
    if args.self_draft in ("target", "draft"):
        return target if args.self_draft == "target" else draft
    if not cuda:
        return target
    free, _ = torch.cuda.mem_get_info()
    config = common.make_config(target_shape)
    need = 2 * sum(p.numel() * 2 for p in build_model(config).parameters())
    return target if need < 0.7 * free else draft


def release(cuda: bool) -> None:
    gc.collect()
    if cuda:
        torch.cuda.empty_cache()


def print_report(report: dict[str, Any]) -> None:
    for key, kind in (
        ("profile_batch_1", "lowered"),
        ("profile_batch_1_sample", "sampling"),
        ("profile_batch_1_stock", "stock-torch"),
    ):
        print_profile(report, report.get(key), kind)
    print_regions(report.get("regions_batch_1"))
    print_summary(report)


def print_profile(report: dict[str, Any], profile: dict[str, Any] | None, kind: str) -> None:
    """A step's kernel profile; kind: "lowered" (greedy), "sampling" (the lowered sampling step), "stock-torch"."""
    if profile and "top" in profile:
        stock = kind == "stock-torch"
        rows = [r for r in report["rows"] if "captured" in r and r["pair"].endswith(" stock") == stock]
        timing = rows[0].get("sampled" if kind == "sampling" else "captured") if rows else None
        step = timing["median_ms"] if timing else None
        idle = f"; the step takes {step:.2f} ms" if step else ""
        print(
            f"\nkernels of one captured {kind} step at batch 1: {profile['kernels_per_step']:.0f} launches, "
            f"{profile['kernel_us_per_step'] / 1e3:.2f} ms of kernel time{idle}"
        )
        for category, entry in sorted(profile["categories"].items(), key=lambda item: -item[1]["us_per_step"]):
            print(f"  {category:10s} {entry['us_per_step']:8.1f} us in {entry['calls_per_step']:5.0f} kernels")
        print("  top kernels:")
        for kernel in profile["top"]:
            print(
                f"  {kernel['share'] * 100:5.1f}%  {kernel['us_per_step']:8.1f} us  "
                f"x{kernel['calls_per_step']:5.0f}  {kernel['name'][:80]}"
            )


def print_summary(report: dict[str, Any]) -> None:
    parity_result = report.get("parity", {})
    if "identical" in parity_result:
        print(
            f"\nparity captured vs eager generate(): {'IDENTICAL' if parity_result['identical'] else 'DIFFERENT'} "
            f"tokens over {parity_result['steps_compared']} eager steps, {parity_result['rows_compared']} rows, "
            f"batches {parity_result['batches']}; mismatches: {parity_result['mismatches'][:5]}"
        )
    elif parity_result:
        print(f"\nparity check failed to run: {parity_result}")
    bandwidth, floor = report.get("copy_bandwidth"), report.get("floor")
    print(
        f"\ngraphspec step benchmark {report['date']}: {report['device']}, torch {report['torch']}, "
        f"triton {report.get('triton', '-')}, bf16, K={report['args']['k']}, "
        f"max_seq_len {report['args']['max_seq_len']}, context {report['args']['context']}, "
        f"{report['seconds']:.0f} s"
    )
    if bandwidth and floor:
        print(
            f"copy bandwidth {bandwidth['bytes_per_s'] / 1e12:.2f} TB/s; floor = (target "
            f"{floor['target_bytes'] / 1e9:.2f} GB + {report['args']['k']} x draft {floor['draft_bytes'] / 1e9:.2f} GB)"
            f" / bandwidth = {floor['ms']:.2f} ms (without the untied input embedding {floor['read_only_ms']:.2f} ms)"
        )
    print(table(report["rows"]))


if __name__ == "__main__":
    sys.exit(main())
