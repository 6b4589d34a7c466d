"""numerics="invariant" next to the default, in one run: step times, a draft equal to the target, and
speculative vs target-only output (issue "Decode at the floor", item 3).

    python benchmarks/bench_invariant.py                      # H200: Llama-3.1-8B / 3.2-1B shapes, bf16
    python benchmarks/bench_invariant.py --preset tiny-llama --numerics default --device cpu   # smoke run

For each numerics, with random-weight checkpoints written once (benchmarks/bench_step.py write_checkpoint):
1. the pair compiled greedy for buckets 1 and 8: the median captured step (bench_step.time_step, rows at
   committed length about --context), graphspec's own target-only decode per token (target_only.py,
   lowered with the same numerics, batch 8), and the prefill of one --prefill-len-token prompt (time to
   first token: invariant prefill runs the decode attention kernel and the invariant matmuls);
2. --prompts prompts x --new-tokens tokens, in groups of the largest bucket: the speculative output
   (Runtime.generate of the group) against target-only greedy decoding from the runtime's own prefill of
   the same group (so both start from the same cache): prompts whose outputs are equal, token for token;
3. the target as its own draft: acceptance over --self-tokens tokens at batch 1 and batch 8 (share of
   drafts accepted; share of steps accepting all K).
Random weights accept almost nothing from the 1B draft: item 2 then checks verify and commit against
plain decoding at every position, and item 3 the case where speculation must accept everything.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks import bench_step, common, target_only
from graphspec.compiled import device_sm
from graphspec.runtime.runtime import Runtime, RuntimeStats
from graphspec.state import TARGET_CACHE

BUCKETS = (1, 8)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", choices=sorted(bench_step.PRESETS), default="llama")
    parser.add_argument("--numerics", default="default,invariant", help="comma-separated, measured in this order")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--max-seq-len", type=int, default=512)
    parser.add_argument("--context", type=int, default=256, help="committed length of the timed steps' rows")
    parser.add_argument("--prompts", type=int, default=20)
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--self-tokens", type=int, default=256)
    parser.add_argument("--prefill-len", type=int, default=448)
    parser.add_argument("--no-self-draft", action="store_true", help="skip item 3 (a second target in memory)")
    parser.add_argument("--replays", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--checkpoint-dir", help="where the random checkpoints go (default: /dev/shm or temp)")
    parser.add_argument("--json", help="write every number here")
    args = parser.parse_args(argv)
    args.numerics = tuple(args.numerics.split(","))
    return args


def compile_runtime(target: Path, draft: Path, numerics: str, args: argparse.Namespace) -> Runtime:
    dtype = "bfloat16" if common.is_cuda(args.device) else "float32"
    return Runtime.from_pretrained(
        target, draft, k=args.k, batch_sizes=BUCKETS, dtype=dtype, device=args.device,
        max_seq_len=args.max_seq_len, modes=("greedy",), numerics=numerics,
    )  # fmt: skip


def target_only_outputs(
    runtime: Runtime, prompts: list[list[int]], new_tokens: int, numerics: str
) -> tuple[list[list[int]], float]:
    """Target-only greedy tokens of `prompts` (at most the largest bucket) decoded from the runtime's own
    prefill of them, and ms per decode forward. The decode graph is traced for this cache and row count."""
    rows = len(prompts)
    slots = list(range(rows))
    first = runtime.prefill(prompts, slots, common.greedy_params(rows, runtime.device)).to(runtime.device)
    cache = runtime.state[TARGET_CACHE]
    model = runtime.target
    gm = target_only.trace_decode(
        model, rows, runtime.max_seq_len, device_sm(runtime.device), numerics=numerics, cache=cache
    )
    start = torch.tensor([len(p) for p in prompts], device=runtime.device)
    slot_ids = torch.tensor(slots, device=runtime.device)
    result = target_only.decode(model, gm, cache, slot_ids, first, start, new_tokens)
    return result.tokens, result.decode_ms_per_token


def compare_outputs(runtime: Runtime, numerics: str, args: argparse.Namespace) -> dict[str, Any]:
    """Speculative vs target-only output, group by group of the largest bucket."""
    rng = random.Random(7)
    prompts = bench_step.random_prompts(args.prompts, args.prompt_len, runtime.vocab_size, rng)
    group_size = max(BUCKETS)
    equal, first_difference, decode_ms = 0, [], []
    for begin in range(0, len(prompts), group_size):
        group = prompts[begin : begin + group_size]
        results = runtime.generate(group, max_new_tokens=args.new_tokens, stop_token_ids=())
        plain, ms = target_only_outputs(runtime, group, args.new_tokens, numerics)
        decode_ms.append(ms)
        for result, expected in zip(results, plain, strict=True):
            got = list(result.token_ids)
            equal += got == expected
            mismatch = next((i for i, (a, b) in enumerate(zip(got, expected, strict=True)) if a != b), None)
            if mismatch is not None:
                first_difference.append(mismatch)
    return {"prompts": len(prompts), "equal": equal, "first_difference": first_difference, "decode_ms": decode_ms}


def prefill_ms(runtime: Runtime, args: argparse.Namespace) -> float:
    """Median ms of prefilling one random prompt of --prefill-len tokens (first token on the host)."""
    prompt = bench_step.random_prompts(1, args.prefill_len, runtime.vocab_size, random.Random(3))
    params = common.greedy_params(1, runtime.device)
    return statistics.median(
        bench_step.timed(lambda: runtime.prefill(prompt, [0], params).tolist(), 5, runtime.device)[1:]
    )


def self_acceptance(runtime: Runtime, rows: int, args: argparse.Namespace) -> dict[str, float]:
    runtime.stats = RuntimeStats(runtime.k)
    prompts = bench_step.random_prompts(rows, args.prompt_len, runtime.vocab_size, random.Random(rows))
    runtime.generate(prompts, max_new_tokens=args.self_tokens, stop_token_ids=())
    stats = runtime.stats
    return {
        "acceptance_rate": stats.acceptance_rate,
        "all_accepted": stats.accepted_histogram[-1] / stats.steps if stats.steps else 0.0,
        "row_steps": stats.steps,
    }


def measure(target: Path, draft: Path, numerics: str, args: argparse.Namespace) -> dict[str, Any]:
    row: dict[str, Any] = {"numerics": numerics}
    begin = time.perf_counter()
    runtime = compile_runtime(target, draft, numerics, args)
    row["compile_s"] = time.perf_counter() - begin
    print(f"[bench] {numerics}: pair compiled in {row['compile_s']:.1f} s", flush=True)
    bench_step.fill_caches(runtime, 0)
    row["step_ms"] = {b: bench_step.time_step(runtime, b, args, args.replays)["median_ms"] for b in BUCKETS}
    row["prefill_ms"] = prefill_ms(runtime, args)
    row["outputs"] = compare_outputs(runtime, numerics, args)
    del runtime
    common.free_device_memory()
    if not args.no_self_draft:
        runtime = compile_runtime(target, target, numerics, args)
        row["self_draft"] = {b: self_acceptance(runtime, b, args) for b in BUCKETS}
        del runtime
        common.free_device_memory()
    print(f"[bench] {numerics}: {json.dumps(row)}", flush=True)
    return row


def table(rows: list[dict[str, Any]], args: argparse.Namespace) -> str:
    default = next((row for row in rows if row["numerics"] == "default"), None)
    lines = [
        f"| numerics | step B=1 (ms) | step B=8 (ms) | target-only decode (ms/token) | prefill {args.prefill_len} "
        f"x 1 (ms) | spec == target-only ({args.prompts} prompts x {args.new_tokens}) | self-draft B=1: accepted "
        "/ all-K steps | B=8 |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for row in rows:
        ratio = ""
        if default is not None and row is not default:
            ratio = " ({:.2f}x / {:.2f}x)".format(*(row["step_ms"][b] / default["step_ms"][b] for b in BUCKETS))
        outputs = row["outputs"]
        decode = sum(outputs["decode_ms"]) / len(outputs["decode_ms"])
        cells = [
            row["numerics"],
            f"{row['step_ms'][1]:.2f}",
            f"{row['step_ms'][8]:.2f}{ratio}",
            f"{decode:.2f}",
            f"{row['prefill_ms']:.1f}",
            f"{outputs['equal']} / {outputs['prompts']}",
        ]
        for bucket in BUCKETS:
            accepted = row.get("self_draft", {}).get(bucket)
            cells.append(f"{accepted['acceptance_rate']:.1%} / {accepted['all_accepted']:.1%}" if accepted else "-")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    target_shape, draft_shape = bench_step.PRESETS[args.preset]
    base = common.checkpoint_dir(0, args.checkpoint_dir)
    target = bench_step.write_checkpoint(base / "target", target_shape, args.device, seed=0)
    draft = bench_step.write_checkpoint(base / "draft", draft_shape, args.device, seed=1)
    print(f"[bench] {args.preset} on {common.device_name(args.device)}, K={args.k}, checkpoints in {base}", flush=True)
    rows = [measure(target, draft, numerics, args) for numerics in args.numerics]
    print(table(rows, args))
    if args.json:
        common.write_json(args.json, {"args": vars(args), "rows": rows}, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
