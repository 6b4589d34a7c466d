"""Time to first token: graphspec's compiled chunked prefill next to transformers (sdpa), and cold start.

On random bf16 checkpoints shaped like Llama-3.1-8B (target) and Llama-3.2-1B (draft), made on the
device (or the tiny stand-ins with --preset tiny-llama), in one run:
- time to first token for each --shapes entry (prompt tokens x batch): graphspec's Runtime.prefill
  (every chunk of the target and of the draft model but the draft's part of the last chunk, which runs
  after the first token has left for the host; the first token sampled and read on the host), and the
  time until the drafter's prefill has run too (ready for the first step)
  next to transformers' forward over the prompt with attn_implementation="sdpa" and logits_to_keep=1
  (the target alone, its argmax read on the host), median of --reps after one warm-up;
- graphspec with the n-gram drafter (no model: its prefill writes only the token history), the same
  target's prefill with next to nothing of a drafter's, so the draft model's share of the first shows
  (--no-target-only skips it);
- the compute floor: 2 x the target's matrix parameters (embedding gather excluded, lm_head included)
  x prompt tokens / the bf16 matmul rate measured here (and the same with the draft model's added,
  since graphspec prefills both);
- cold start (--cold-start, default on): the compiled Runtime (buckets --buckets plus the shapes' batch
  sizes, modes --modes: by default the issue's 1, 4, 8 and both modes) saved as an artifact (weights
  referenced, not copied), then, in --cold-start-runs fresh processes (the median's reported, every
  run's time beside it), Runtime.load to ready (verification, weights, warm-up and
  capture of every program), the first and the second request of the same prompt, and the Triton
  compiles and graph captures those requests caused (both must be 0);
- with --profile SHAPE (e.g. 4096x1): the kernels of one graphspec prefill and of one transformers
  forward at that shape, by category and the top ones by time, from the PyTorch profiler;
- with --cold-start-profile FILE: after the timed cold start, one more in another fresh process with
  Runtime.load under cProfile, its top functions by cumulative and by own time written to FILE, the raw
  stats to FILE.prof.

    python benchmarks/bench_prefill.py --json prefill.json       # on the H200: one command, ~5 minutes
    python benchmarks/bench_prefill.py --preset tiny-llama --device cpu --shapes 32x1,48x2 --max-seq-len 128 \
        --cold-start-tokens 16                                   # smoke run of this script (~30 s)
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import json
import os
import pstats
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

if __package__ in (None, ""):  # run as a script: make `benchmarks` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import graphspec
from benchmarks import common
from benchmarks.bench_step import PRESETS, write_checkpoint
from graphspec.config import FOLD_NORMS

SHAPES = "512x1,2048x1,4096x1,2048x8"


def parse_shapes(text: str) -> list[tuple[int, int]]:
    shapes = []
    for item in text.split(","):
        tokens, _, batch = item.partition("x")
        shapes.append((int(tokens), int(batch or 1)))
    return shapes


def prompts_for(tokens: int, batch: int, vocab: int, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (batch, tokens), generator=generator)  # [batch, tokens]


def wall_ms(fn, reps: int, device: str) -> dict[str, float]:
    """Host wall time of fn() (which ends by reading its result on the host) after one warm-up call."""
    fn()
    samples = []
    for _ in range(reps):
        common.sync(device)
        begin = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - begin) * 1e3)
    return {"ms": statistics.median(samples), "min_ms": min(samples), "max_ms": max(samples)}


def matmul_params(directory: Path) -> int:
    """Parameters in matrix products per token (the embedding gather excluded), from a meta model."""
    import transformers

    config = transformers.AutoConfig.from_pretrained(directory)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    return common.ModelCost.of(model).matmul_params


def measure(first_token, reps: int, device: str, profile: bool) -> dict[str, Any]:
    """wall_ms of first_token, with the kernels of one call (common.kernel_profile) when `profile`."""
    result: dict[str, Any] = wall_ms(first_token, reps, device)
    if profile:
        result["profile"] = common.kernel_profile(first_token, 1, top=15)
    return result


def time_graphspec(
    runtime: graphspec.Runtime, shapes, reps: int, seed: int, profile: str | None
) -> dict[str, dict[str, Any]]:
    results: dict[str, dict[str, Any]] = {}
    for tokens, batch in shapes:
        prompts = prompts_for(tokens, batch, runtime.vocab_size, seed).tolist()
        params = common.greedy_params(batch, runtime.device)

        def first_token(prompts: list[list[int]] = prompts, params: dict = params) -> list[int]:
            return runtime.prefill(prompts, list(range(len(prompts))), params).tolist()

        def ready(first_token=first_token) -> None:  # until the drafter's prefill has run too
            first_token()
            common.sync(runtime.device)

        key = f"{tokens}x{batch}"
        results[key] = measure(first_token, reps, runtime.device, profile=key == profile)
        results[key]["ready_ms"] = wall_ms(ready, reps, runtime.device)["ms"]
    return results


def time_transformers(
    directory: Path, shapes, reps: int, seed: int, device: str, profile: str | None
) -> dict[str, dict[str, Any]]:
    import transformers

    hf = transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=torch.bfloat16, attn_implementation="sdpa")
    hf = hf.to(device).eval().requires_grad_(False)
    results: dict[str, dict[str, Any]] = {}
    for tokens, batch in shapes:
        ids = prompts_for(tokens, batch, hf.config.vocab_size, seed).to(device)

        @torch.inference_mode()
        def first_token(ids: torch.Tensor = ids, hf: torch.nn.Module = hf) -> list[int]:
            return hf(ids, logits_to_keep=1).logits[:, -1].argmax(-1).tolist()

        key = f"{tokens}x{batch}"
        results[key] = measure(first_token, reps, device, profile=key == profile)
    del hf
    common.free_device_memory()
    return results


def cold_start(artifact: Path, tokens: int, seed: int, profile: Path | None = None) -> dict[str, Any]:
    """Run in a fresh process (with an empty Triton cache: the kernels come from the artifact): Runtime.load
    to ready, then the same request twice. profile: write the load's cProfile summary there."""
    from graphspec.triton_binaries import RECORDER

    profiler = cProfile.Profile()
    begin = time.perf_counter()
    with profiler if profile is not None else contextlib.nullcontext():
        runtime = graphspec.Runtime.load(artifact)
        common.sync(runtime.device)
    ready_s = time.perf_counter() - begin
    if profile is not None:
        text = io.StringIO()
        for order in ("cumulative", "tottime"):
            pstats.Stats(profiler, stream=text).sort_stats(order).print_stats(60)
        profile.write_text(text.getvalue())
        profiler.dump_stats(f"{profile}.prof")  # the raw stats, for callers and other orders (pstats)
    # Whether the process (graphspec's import, then start-up) imported these; seconds each on a GPU machine.
    imported = {name: name in sys.modules for name in ("torch._dynamo", "torchvision")}
    prompt = prompts_for(tokens, 1, runtime.vocab_size, seed).tolist()
    requests = []
    for _ in range(2):
        common.sync(runtime.device)
        begin = time.perf_counter()
        runtime.generate(prompt, max_new_tokens=16, stop_token_ids=[])
        requests.append((time.perf_counter() - begin) * 1e3)
    return {
        "load_to_ready_s": ready_s,
        "first_request_ms": requests[0],
        "second_request_ms": requests[1],
        "triton_compiles_during_requests": runtime.stats.triton_compiles_during_requests,
        "captures_during_requests": runtime.stats.captures_during_requests,
        "triton_kernels_built": RECORDER.built,  # load and requests; the Triton cache was empty
        "triton_kernels_carried": len(json.loads((artifact / "manifest.json").read_text())["triton_cache"]),
        "startup_seconds": runtime.startup_seconds,
        "warm_up_seconds": runtime.warm_up_seconds,
        "capture_phase_seconds": runtime.capture_phase_seconds,
        "imported_during_start_up": imported,
        "prompt_tokens": tokens,
        "new_tokens": 16,
    }


def run_cold_start(artifact: Path, args: argparse.Namespace, triton_cache: Path, profile: Path | None = None) -> dict:
    """cold_start in a fresh process with an empty Triton cache (TRITON_CACHE_DIR=triton_cache), as on a
    machine that never ran graphspec: every kernel must come from the artifact (triton_binaries), or the
    load builds it and says so."""
    command = [sys.executable, str(Path(__file__).resolve()), "--cold-start-artifact", str(artifact)]
    command += ["--cold-start-tokens", str(args.cold_start_tokens)]
    if profile is not None:
        command += ["--cold-start-profile", str(profile.absolute())]
    env = {**os.environ, "TRITON_CACHE_DIR": str(triton_cache)}
    done = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    if done.returncode != 0:
        print(done.stderr, file=sys.stderr)
        return {"error": done.stderr[-2000:]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def median_run(runs: list[dict]) -> dict:
    """The cold start whose load-to-ready time is the median of `runs` (the upper one of an even count),
    with every run's time beside it; the first failed run if any failed."""
    failed = [run for run in runs if "error" in run]
    if failed:
        return failed[0]
    ordered = sorted(runs, key=lambda run: run["load_to_ready_s"])
    return {**ordered[len(ordered) // 2], "load_to_ready_runs_s": [run["load_to_ready_s"] for run in runs]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", choices=sorted(PRESETS), default="llama")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--shapes", default=SHAPES, help="prompt tokens x batch, comma separated")
    parser.add_argument("-k", "--k", type=int, default=4)
    parser.add_argument("--max-seq-len", type=int, default=8192)
    parser.add_argument("--prefill-tokens", type=int, default=4096, help="graphspec's prefill chunk budget")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--buckets", default="1,4,8", help="batch buckets compiled besides the shapes' batch sizes")
    parser.add_argument("--modes", default="greedy,sample", help="sampling modes compiled (comma separated)")
    parser.add_argument("--no-cold-start", dest="cold_start", action="store_false")
    parser.add_argument("--no-target-only", dest="target_only", action="store_false")
    parser.add_argument("--cold-start-tokens", type=int, default=512, help="prompt tokens of the cold-start requests")
    parser.add_argument(
        "--cold-start-runs", type=int, default=3, help="fresh processes timed (the median's run is reported)"
    )
    parser.add_argument("--cold-start-artifact", default=None, help=argparse.SUPPRESS)  # the fresh process
    parser.add_argument("--cold-start-profile", default=None, metavar="FILE", help="cProfile the cold start's load")
    parser.add_argument("--profile", default=None, metavar="SHAPE", help="profile the kernels at one of --shapes")
    parser.add_argument(
        "--fold-norms",
        choices=sorted(FOLD_NORMS),
        default="auto",
        help="fold the norms into the projections they feed (compile's fold_norms; auto: on CUDA) (A/B runs)",
    )
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    if args.cold_start_artifact:
        profile = Path(args.cold_start_profile) if args.cold_start_profile else None
        print(json.dumps(cold_start(Path(args.cold_start_artifact), args.cold_start_tokens, args.seed, profile)))
        return 0
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("bench_prefill: CUDA is not available; pass --device cpu for a smoke run", file=sys.stderr)
        return 2
    shapes = parse_shapes(args.shapes)
    if args.profile is not None and args.profile not in {f"{tokens}x{batch}" for tokens, batch in shapes}:
        parser.error(f"--profile {args.profile} is not one of --shapes {args.shapes}")
    if args.profile is not None and not common.is_cuda(args.device):
        parser.error("--profile reads CUDA kernels: it needs --device cuda")
    buckets = tuple(sorted({batch for _, batch in shapes} | {int(b) for b in args.buckets.split(",") if b}))
    modes = tuple(args.modes.split(","))
    report: dict[str, Any] = {"device": common.device_name(args.device), "args": vars(args)}
    target_shape, draft_shape = PRESETS[args.preset]
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(dir=common.checkpoint_dir(0)) as workdir:
        target_dir = write_checkpoint(Path(workdir) / "target", target_shape, args.device, seed=1)
        draft_dir = write_checkpoint(Path(workdir) / "draft", draft_shape, args.device, seed=2)
        print(f"[bench] checkpoints written at {time.perf_counter() - started:.0f} s", flush=True)
        begin = time.perf_counter()
        runtime = graphspec.Runtime.from_pretrained(
            target_dir, draft_dir, k=args.k, batch_sizes=buckets, dtype="bfloat16", device=args.device,
            max_seq_len=args.max_seq_len, prefill_tokens=args.prefill_tokens, modes=modes,
            fold_norms=FOLD_NORMS[args.fold_norms],
        )  # fmt: skip
        report["compile_and_warm_up_s"] = time.perf_counter() - begin
        print(f"[bench] graphspec compiled and warmed up in {report['compile_and_warm_up_s']:.0f} s", flush=True)
        report["buckets"], report["modes"] = list(buckets), list(modes)
        report["chunks"] = {bucket: runtime.compiled.prefill_chunks(bucket) for bucket in buckets}
        report["graphspec"] = time_graphspec(runtime, shapes, args.reps, args.seed, args.profile)
        artifact = Path(workdir) / "artifact"
        if args.cold_start:
            from graphspec.artifact import save_artifact

            save_artifact(runtime.compiled, artifact, copy_weights=False)
        del runtime
        common.free_device_memory()
        if args.target_only:
            runtime = graphspec.Runtime.from_pretrained(
                target_dir, "ngram", k=args.k, batch_sizes=sorted({batch for _, batch in shapes}),
                dtype="bfloat16", device=args.device, max_seq_len=args.max_seq_len,
                prefill_tokens=args.prefill_tokens, modes=("greedy",), fold_norms=FOLD_NORMS[args.fold_norms],
            )  # fmt: skip
            report["graphspec_ngram"] = time_graphspec(runtime, shapes, args.reps, args.seed, args.profile)
            del runtime
            common.free_device_memory()
        report["transformers"] = time_transformers(target_dir, shapes, args.reps, args.seed, args.device, args.profile)
        print(f"[bench] transformers timed at {time.perf_counter() - started:.0f} s", flush=True)
        rate = common.measure_matmul_rate(args.device, torch.bfloat16 if args.device != "cpu" else torch.float32)
        report["matmul_tflops"] = rate["tflops"]
        params = {"target": matmul_params(target_dir), "draft": matmul_params(draft_dir)}
        report["matmul_params"] = params
        if args.cold_start:
            runs = [
                run_cold_start(artifact, args, Path(workdir) / f"empty_triton_cache_{run}")
                for run in range(args.cold_start_runs)
            ]
            report["cold_start"] = median_run(runs)
            if args.cold_start_profile:  # one more fresh process: the profiler slows what the others timed
                run_cold_start(
                    artifact, args, Path(workdir) / "empty_triton_cache_profile", Path(args.cold_start_profile)
                )
    report["seconds"] = time.perf_counter() - started
    print_table(report, shapes)
    if args.json:
        common.write_json(args.json, report)
    return 0


def runs_text(cold: dict[str, Any]) -> str:
    runs = cold.get("load_to_ready_runs_s", [])
    return f" (median of {len(runs)} processes: {', '.join(f'{s:.1f}' for s in runs)} s)" if len(runs) > 1 else ""


def print_table(report: dict[str, Any], shapes) -> None:
    flops_per_second = report["matmul_tflops"] * 1e12
    params = report["matmul_params"]
    print(
        f"\ntime to first token, {report['device']}, bf16, matmul rate {report['matmul_tflops']:.0f} TFLOP/s, "
        f"prefill chunks {report['chunks']} positions per row"
    )
    ngram = report.get("graphspec_ngram", {})
    header = (
        f"{'prompt':>10} {'graphspec ms':>13} {'ready ms':>9} {'transformers ms':>16} {'speedup':>8} "
        f"{'floor ms (target)':>18} {'gs / floor':>11} {'floor ms (+draft)':>18} {'gs / floor':>11}"
        + (f" {'gs n-gram ms':>13} {'/ floor (target)':>17}" if ngram else "")
    )
    print(header)
    for tokens, batch in shapes:
        key = f"{tokens}x{batch}"
        ours, theirs = report["graphspec"][key]["ms"], report["transformers"][key]["ms"]
        ready = report["graphspec"][key]["ready_ms"]
        floor = 2 * params["target"] * tokens * batch / flops_per_second * 1e3
        floor_both = 2 * (params["target"] + params["draft"]) * tokens * batch / flops_per_second * 1e3
        target_only = f" {ngram[key]['ms']:>13.1f} {ngram[key]['ms'] / floor:>16.2f}x" if ngram else ""
        print(
            f"{key:>10} {ours:>13.1f} {ready:>9.1f} {theirs:>16.1f} {theirs / ours:>7.2f}x {floor:>18.1f} "
            f"{ours / floor:>10.2f}x {floor_both:>18.1f} {ours / floor_both:>10.2f}x{target_only}"
        )
    cold = report.get("cold_start")
    if cold and "error" not in cold:
        print(
            f"\ncold start (fresh process, artifact with referenced weights, buckets {report['buckets']}, modes "
            f"{report['modes']}): Runtime.load to ready "
            f"{cold['load_to_ready_s']:.1f} s{runs_text(cold)}; request of {cold['prompt_tokens']} + "
            f"{cold['new_tokens']} tokens: "
            f"first {cold['first_request_ms']:.0f} ms, second {cold['second_request_ms']:.0f} ms "
            f"({cold['first_request_ms'] / cold['second_request_ms']:.2f}x); during requests: "
            f"{cold['triton_compiles_during_requests']} Triton compiles, {cold['captures_during_requests']} captures; "
            f"in an empty Triton cache, {cold.get('triton_kernels_built', '?')} kernels built in all "
            f"({cold.get('triton_kernels_carried', '?')} carried by the artifact)"
        )
        for key, title, digits in (
            ("startup_seconds", "start-up by phase", 1),
            ("warm_up_seconds", "warm-up and capture by kind", 2),
            ("capture_phase_seconds", "warm-up and capture by phase", 2),
        ):
            if cold.get(key):
                parts = ", ".join(f"{name} {seconds:.{digits}f} s" for name, seconds in cold[key].items())
                print(f"  {title}: {parts}")
        imported = [name for name, done in cold.get("imported_during_start_up", {}).items() if done]
        shown = ", ".join(imported) or "neither torch._dynamo nor torchvision"
        print(f"  imported by the import of graphspec and start-up: {shown}")
    elif cold:
        print("\ncold start failed (see stderr)")
    for system in ("graphspec", "graphspec_ngram", "transformers"):
        profile = next((row["profile"] for row in report.get(system, {}).values() if "profile" in row), None)
        if profile:
            common.print_kernel_profile(f"kernels of one {system} prefill", profile)
    print(f"compile + warm-up {report['compile_and_warm_up_s']:.0f} s; whole run {report['seconds']:.0f} s")


if __name__ == "__main__":
    sys.exit(main())
