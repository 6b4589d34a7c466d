"""Kernel benchmark: each graphspec Triton kernel against the best stock torch path at real shapes, with
achieved bandwidth against a device-to-device copy measured in the same run.

    python benchmarks/bench_kernels.py                 # the table (about a minute on an H200)
    python benchmarks/bench_kernels.py --sweep         # also sweep attention configs at two shapes
    python benchmarks/bench_kernels.py --json out.json
    python benchmarks/bench_kernels.py --only bench_sample,bench_verify   # the sampling rows alone

Shapes are 8B-class (32 q heads, 8 kv heads, head dim 128, hidden 4096, MLP 14336, Qwen vocab 151936),
bf16.
Every kernel runs through its graphspec::<op>_triton op with the config of this GPU's SM, captured
in a CUDA graph and timed over replays (benchmarks/common.time_fn, median), as the runtime runs it.
Attention reads whole caches (start_pos = S - T) and rotates over ROTATE disjoint sets of slots per
replay so no byte is still in L2 when it is read again. Bandwidth = the fewest bytes the op must move
(each input read once, each output written once) / time; "% copy" compares it with the copy rate,
which counts bytes read plus bytes written. The torch column: SDPA (flash or whatever torch picks,
enable_gqa) on K/V already gathered per row and contiguous, so its gather is not timed and its
mask-free attention does less than ours; for the other ops, the graphspec reference op (pure torch).
"""

from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from graphspec.kernels import attention as attention_kernel
from graphspec.kernels import common as kernel_common

from benchmarks import common
from graphspec import ops
from graphspec.lowering import registry

Q_HEADS, KV_HEADS, HEAD_DIM, HIDDEN, INTERMEDIATE, VOCAB = 32, 8, 128, 4096, 14336, 151936
ROTATE = 4
DTYPE = torch.bfloat16
ATTENTION_SHAPES = [  # (batch, cache tokens, K)
    (1, 32768, 1),
    (1, 32768, 4),
    (1, 32768, 8),
    (1, 4096, 4),
    (8, 32768, 4),
    (32, 8192, 4),
    (64, 4096, 8),
]


def config(op: str, sm: int) -> dict[str, int]:
    entry = registry.resolve(op, sm)
    assert entry is not None, f"no {op} kernel for sm {sm}"
    return entry.config


def timed(fn, reps: int = 30) -> float:
    """Median ms of fn() replayed in a CUDA graph."""
    return common.time_fn(fn, "cuda", reps=reps, warmup=3)["ms"]


def row(name: str, shape: str, ms: float, nbytes: int, copy_gb_s: float, torch_ms: float | None, **extra) -> dict:
    gb_s = nbytes / (ms * 1e-3) / 1e9
    torch_us = "-" if torch_ms is None else f"{torch_ms * 1e3:.1f}"
    pct = 100 * gb_s / copy_gb_s
    print(f"{name} {shape}: {ms * 1e3:.1f} us, {gb_s:.0f} GB/s ({pct:.1f}% copy), torch {torch_us} us")
    return {
        "kernel": name,
        "shape": shape,
        "us": ms * 1e3,
        "gb_s": gb_s,
        "pct_copy": 100 * gb_s / copy_gb_s,
        "torch_us": None if torch_ms is None else torch_ms * 1e3,
        "speedup": None if torch_ms is None else torch_ms / ms,
        **extra,
    }


def attention_inputs(batch: int, seq: int, k: int):
    t = k + 1
    cache = torch.empty(1, 2, batch * ROTATE, KV_HEADS, seq, HEAD_DIM, dtype=DTYPE, device="cuda").normal_()
    q = torch.randn(batch, Q_HEADS, t, HEAD_DIM, dtype=DTYPE, device="cuda")
    slot_sets = [torch.arange(i * batch, (i + 1) * batch, device="cuda") for i in range(ROTATE)]
    start_pos = torch.full((batch,), seq - t, device="cuda")  # whole windows: every key is read
    nbytes = 2 * batch * KV_HEADS * seq * HEAD_DIM * cache.element_size() + 2 * q.numel() * q.element_size()
    return cache, q, slot_sets, start_pos, nbytes


def time_attention(cache, q, slot_sets, start_pos, values: tuple[int, ...]) -> float:
    scale = HEAD_DIM**-0.5
    op = torch.ops.graphspec.attention_triton

    def run() -> None:
        for slots in slot_sets:
            op(q, cache, 0, slots, start_pos, scale, *values)

    return timed(run) / ROTATE


def bench_attention(batch: int, seq: int, k: int, sm: int, copy_gb_s: float) -> dict:
    cache, q, slot_sets, start_pos, nbytes = attention_inputs(batch, seq, k)
    values = tuple(config("attention", sm).values())
    ms = time_attention(cache, q, slot_sets, start_pos, values)
    out = torch.ops.graphspec.attention_triton(q, cache, 0, slot_sets[0], start_pos, HEAD_DIM**-0.5, *values)
    error = None
    if batch * seq <= 2**17:  # the reference's fp32 gathers stay small
        exact = ops.attention_reference(q, cache, 0, slot_sets[0], start_pos, HEAD_DIM**-0.5).float()
        error = ((out.float() - exact).norm() / exact.norm()).item()
    gathered = [(cache[0, 0][s].contiguous(), cache[0, 1][s].contiguous()) for s in slot_sets]
    del cache

    def sdpa() -> None:
        for keys, values_ in gathered:
            F.scaled_dot_product_attention(q, keys, values_, enable_gqa=True)

    try:
        torch_ms = timed(sdpa) / ROTATE
    except RuntimeError as error_:  # a torch without GQA SDPA: leave the column empty
        print(f"sdpa failed: {error_}", file=sys.stderr)
        torch_ms = None
    splits = attention_kernel.num_splits(
        batch, KV_HEADS, 1, seq, values[0], values[3], kernel_common.sm_count(q.device)
    )
    shape = f"B={batch} S={seq} K={k}"
    return row("attention", shape, ms, nbytes, copy_gb_s, torch_ms, splits=splits, rel_err_vs_ref=error)


def bench_rms_norm(rows: int, sm: int, copy_gb_s: float) -> list[dict]:
    x = torch.randn(rows, HIDDEN, dtype=DTYPE, device="cuda")
    residual = torch.randn_like(x)
    weight = torch.randn(HIDDEN, dtype=DTYPE, device="cuda")
    norm_values = tuple(config("rms_norm", sm).values())
    add_values = tuple(config("add_rms_norm", sm).values())
    size = x.numel() * x.element_size()
    return [
        row(
            "rms_norm", f"rows={rows} D={HIDDEN}",
            timed(lambda: torch.ops.graphspec.rms_norm_triton(x, weight, 1e-5, *norm_values)),
            2 * size, copy_gb_s, timed(lambda: ops.rms_norm_reference(x, weight, 1e-5)),
        ),
        row(
            "add_rms_norm", f"rows={rows} D={HIDDEN}",
            timed(lambda: torch.ops.graphspec.add_rms_norm_triton(x, residual, weight, 1e-5, *add_values)),
            4 * size, copy_gb_s, timed(lambda: ops.add_rms_norm_reference(x, residual, weight, 1e-5)),
        ),
    ]  # fmt: skip


def bench_rotary(batch: int, t: int, sm: int, copy_gb_s: float) -> dict:
    q = torch.randn(batch, t, Q_HEADS, HEAD_DIM, dtype=DTYPE, device="cuda").transpose(1, 2)
    k = torch.randn(batch, t, KV_HEADS, HEAD_DIM, dtype=DTYPE, device="cuda").transpose(1, 2)
    cos, sin = torch.rand(batch, t, HEAD_DIM, device="cuda"), torch.rand(batch, t, HEAD_DIM, device="cuda")
    values = tuple(config("rotary", sm).values())
    nbytes = 2 * (q.numel() + k.numel()) * q.element_size() + 2 * cos.numel() * cos.element_size()
    return row(
        "rotary", f"B={batch} T={t}",
        timed(lambda: torch.ops.graphspec.rotary_triton(q, k, cos, sin, *values)),
        nbytes, copy_gb_s, timed(lambda: ops.rotary_reference(q, k, cos, sin)),
    )  # fmt: skip


def bench_kv_write(batch: int, t: int, sm: int, copy_gb_s: float) -> dict:
    """One layer's K and V of a step into a 4096-token cache: one launch against the reference's two
    index_put launches. v is a transposed slice of a fused qkv output, as the decoder passes it."""
    cache = torch.zeros(1, 2, batch, KV_HEADS, 4096, HEAD_DIM, dtype=DTYPE, device="cuda")
    k = torch.randn(batch, KV_HEADS, t, HEAD_DIM, dtype=DTYPE, device="cuda")
    qkv = torch.randn(batch, t, (Q_HEADS + 2 * KV_HEADS) * HEAD_DIM, dtype=DTYPE, device="cuda")
    v = qkv[..., (Q_HEADS + KV_HEADS) * HEAD_DIM :].view(batch, t, KV_HEADS, HEAD_DIM).transpose(1, 2)
    slots = torch.randperm(batch, device="cuda")
    start = torch.randint(0, 4096 - t + 1, (batch,), device="cuda")
    values = tuple(config("kv_write", sm).values())
    nbytes = 4 * k.numel() * k.element_size()  # k and v read once, written once
    return row(
        "kv_write", f"B={batch} T={t}",
        timed(lambda: torch.ops.graphspec.kv_write_triton(cache, 0, slots, start, k, v, *values)),
        nbytes, copy_gb_s, timed(lambda: ops.kv_write(cache, 0, slots, start, k, v)),
    )  # fmt: skip


def bench_rotary_kv_write(batch: int, t: int, sm: int, copy_gb_s: float) -> dict:
    """rotary + kv_write of one layer as the fused kernel, against the reference op; pair_us is the two
    unfused kernels it replaces (rotary_triton then kv_write_triton) in one captured graph."""
    qkv = torch.randn(batch, t, (Q_HEADS + 2 * KV_HEADS) * HEAD_DIM, dtype=DTYPE, device="cuda")
    q, k, v = qkv.split([Q_HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM], dim=-1)
    q, k, v = (x.view(batch, t, -1, HEAD_DIM).transpose(1, 2) for x in (q, k, v))
    cos, sin = torch.rand(batch, t, HEAD_DIM, device="cuda"), torch.rand(batch, t, HEAD_DIM, device="cuda")
    cache = torch.zeros(1, 2, batch, KV_HEADS, 4096, HEAD_DIM, dtype=DTYPE, device="cuda")
    slots = torch.randperm(batch, device="cuda")
    start = torch.randint(0, 4096 - t + 1, (batch,), device="cuda")
    values = tuple(config("rotary_kv_write", sm).values())
    rotary_values, kv_values = tuple(config("rotary", sm).values()), tuple(config("kv_write", sm).values())

    def pair() -> None:
        _, k_rot = torch.ops.graphspec.rotary_triton(q, k, cos, sin, *rotary_values)
        torch.ops.graphspec.kv_write_triton(cache, 0, slots, start, k_rot, v, *kv_values)

    # q, k, v read once; q_out, K and V written once; cos/sin read once.
    nbytes = 2 * (q.numel() + 2 * k.numel()) * q.element_size() + 2 * cos.numel() * cos.element_size()
    pair_us = timed(pair) * 1e3
    print(f"rotary_kv_write B={batch} T={t}: the unfused rotary + kv_write kernels take {pair_us:.1f} us")
    return row(
        "rotary_kv_write", f"B={batch} T={t}",
        timed(lambda: torch.ops.graphspec.rotary_kv_write_triton(q, k, v, cos, sin, cache, 0, slots, start, *values)),
        nbytes, copy_gb_s, timed(lambda: ops.rotary_kv_write(q, k, v, cos, sin, cache, 0, slots, start)),
        pair_us=pair_us,
    )  # fmt: skip


def bench_silu_mul(rows: int, sm: int, copy_gb_s: float) -> dict:
    gate_up = torch.randn(rows, 2 * INTERMEDIATE, dtype=DTYPE, device="cuda")
    values = tuple(config("silu_mul", sm).values())
    nbytes = 3 * rows * INTERMEDIATE * gate_up.element_size()  # gate and up read, the product written
    return row(
        "silu_mul", f"rows={rows} I={INTERMEDIATE}",
        timed(lambda: torch.ops.graphspec.silu_mul_triton(gate_up, *values)),
        nbytes, copy_gb_s, timed(lambda: ops.silu_mul_reference(gate_up)),
    )  # fmt: skip


# Sampling settings (top_k, top_p, logits) each benchmarked: "flat" logits are randn * 3 (top-p keeps
# thousands of tokens: its cut is past any candidate list), "peaked" ones add 16 tokens near 22 the way a
# trained model's few likely tokens stand out (top-p's cut lies among them).
SAMPLING_SETTINGS = ((0, 1.0, "flat"), (50, 0.9, "flat"), (0, 0.95, "peaked"), (0, 0.95, "flat"))


def sampling_logits(batch: int, positions: int, kind: str) -> torch.Tensor:
    """[batch, positions, VOCAB] bf16 logits, a slice of a wider tensor as lm_head output padded to a
    multiple of 64 would be."""
    wide = torch.randn(batch, positions, VOCAB + 64, device="cuda") * 3
    if kind == "peaked":
        top = torch.randint(0, VOCAB, (batch, positions, 16), device="cuda")
        wide.scatter_(-1, top, 22 + torch.randn(top.shape, device="cuda"))
    return wide.to(DTYPE)[..., :VOCAB]


def candidates_note(target: torch.Tensor, draft: torch.Tensor, params: tuple, values: dict[str, int]) -> str:
    """The config's candidate count and the share of stat rows the candidates decide for these inputs."""
    from graphspec.kernels import verify_rejection
    from graphspec.kernels.candidates import DONE

    stats = verify_rejection.distribution_stats(target, draft, *params, *values.values())
    decided = ((stats.cand[:, 0] & DONE.value) != 0).float().mean().item()
    return f"cand {values['candidates']}: {decided:.0%} decided"


def bench_verify(batch: int, k: int, sm: int, copy_gb_s: float) -> list[dict]:
    target = sampling_logits(batch, k + 1, "flat")
    drafts = torch.randint(0, VOCAB, (batch, k), device="cuda")
    greedy_values = tuple(config("verify_greedy", sm).values())
    rows = [
        row(
            "verify_greedy", f"B={batch} K={k} V={VOCAB}",
            timed(lambda: torch.ops.graphspec.verify_greedy_triton(target, drafts, *greedy_values)),
            target.numel() * target.element_size(), copy_gb_s, timed(lambda: ops.verify_greedy(target, drafts)),
        )
    ]  # fmt: skip
    rejection = config("verify_rejection", sm)
    for top_k, top_p, kind in SAMPLING_SETTINGS:
        target, draft = sampling_logits(batch, k + 1, kind), sampling_logits(batch, k, kind)
        nbytes = (target.numel() + draft.numel()) * target.element_size()
        params = (
            torch.full((batch,), 0.8, device="cuda"), torch.full((batch,), top_k, device="cuda"),
            torch.full((batch,), top_p, device="cuda"),
        )  # fmt: skip
        args = (
            target, draft, drafts, *params,
            torch.arange(batch, device="cuda"), torch.zeros(batch, dtype=torch.int64, device="cuda"),
        )  # fmt: skip
        reference_ms = timed(lambda args=args: ops.verify_rejection_reference(*args), reps=10)
        # The config's row, then the same without candidates (every row through the full-vocab passes).
        for values in (rejection, {**rejection, "candidates": 0}):
            op_args = (*args, *values.values())
            entry = row(
                "verify_rejection", f"B={batch} K={k} top_k={top_k} top_p={top_p} {kind}",
                timed(lambda op_args=op_args: torch.ops.graphspec.verify_rejection_triton(*op_args), reps=10),
                nbytes, copy_gb_s, reference_ms,
            )  # fmt: skip
            entry["config"] = candidates_note(target, draft, params, values)
            rows.append(entry)
    return rows


def bench_sample(batch: int, sm: int, copy_gb_s: float) -> list[dict]:
    """One draft position's token: graphspec::sample (sort-free) next to graphspec::argmax (greedy's),
    for each of SAMPLING_SETTINGS with the config's candidates and without; the torch column is the
    reference (a full-vocabulary sort per row)."""
    logits = sampling_logits(batch, 1, "flat")[:, 0]  # the draft's last-position logits, a slice
    nbytes = logits.numel() * logits.element_size()
    argmax_values = tuple(config("argmax", sm).values())
    rows = [
        row(
            "argmax", f"B={batch} V={VOCAB}",
            timed(lambda: torch.ops.graphspec.argmax_triton(logits, None, *argmax_values)),
            nbytes, copy_gb_s, timed(lambda: ops.argmax(logits)),
        )
    ]  # fmt: skip
    sample = config("sample", sm)
    for top_k, top_p, kind in SAMPLING_SETTINGS:
        logits = sampling_logits(batch, 1, kind)[:, 0]
        params = (
            torch.full((batch,), 0.8, device="cuda"), torch.full((batch,), top_k, device="cuda"),
            torch.full((batch,), top_p, device="cuda"),
        )  # fmt: skip
        args = (
            logits,
            *params,
            torch.arange(batch, device="cuda"),
            torch.zeros(batch, dtype=torch.int64, device="cuda"),
        )
        reference_ms = timed(lambda args=args: ops.sample(*args, 0), reps=10)
        for values in (sample, {**sample, "candidates": 0}):
            op_args = (*args, 0, *values.values())
            entry = row(
                "sample", f"B={batch} top_k={top_k} top_p={top_p} {kind}",
                timed(lambda op_args=op_args: torch.ops.graphspec.sample_triton(*op_args), reps=10),
                nbytes, copy_gb_s, reference_ms,
            )  # fmt: skip
            entry["config"] = candidates_note(logits[:, None], logits[:, None], params, values)
            rows.append(entry)
    return rows


# CONFIG_FIELDS order: block_n, num_warps, num_stages, programs_per_sm (split-K only matters at small B).
SWEEP_GRID = {
    (1, 32768, 4): list(itertools.product((32, 64, 128), (4, 8), (2, 3, 4), (2, 4, 8))),
    (64, 4096, 4): list(itertools.product((32, 64, 128), (4, 8), (2, 3, 4), (2,))),
}


def sweep_attention(copy_gb_s: float, keep: int = 6) -> list[dict]:
    """Each config of SWEEP_GRID at its shape (what CONFIGS[90] is chosen from), each checked against
    the reference (relative error, bf16 rounding level expected); the `keep` fastest per shape."""
    results = []
    scale = HEAD_DIM**-0.5
    for (batch, seq, k), grid in SWEEP_GRID.items():
        cache, q, slot_sets, start_pos, nbytes = attention_inputs(batch, seq, k)
        exact = ops.attention_reference(q, cache, 0, slot_sets[0], start_pos, scale).float()
        shape_rows = []
        for values in grid:
            try:
                ms = time_attention(cache, q, slot_sets, start_pos, values)
                out = torch.ops.graphspec.attention_triton(q, cache, 0, slot_sets[0], start_pos, scale, *values)
            except Exception as error:  # out of shared memory or registers: not a candidate
                print(f"sweep {values}: {type(error).__name__}", file=sys.stderr)
                continue
            error = ((out.float() - exact).norm() / exact.norm()).item()
            entry = row("attention", f"B={batch} S={seq} K={k}", ms, nbytes, copy_gb_s, None, rel_err_vs_ref=error)
            entry["config"] = "/".join(map(str, values)) + ("" if error < 1e-2 else " WRONG")
            print(f"sweep {entry['shape']} {entry['config']}: {entry['us']:.1f} us, rel err {error:.1e}")
            shape_rows.append(entry)
        results += sorted(shape_rows, key=lambda r: r["us"])[:keep]
        del cache
    return results


def print_table(rows: list[dict], copy_gb_s: float, title: str) -> None:
    print(f"\n{title} (copy bandwidth {copy_gb_s:.0f} GB/s, read + write)")
    header = ("kernel", "shape", "ours us", "GB/s", "% copy", "torch us", "speedup")
    print("| {:<16} | {:<30} | {:>8} | {:>6} | {:>6} | {:>8} | {:>7} |".format(*header))
    print(f"| {'-' * 16} | {'-' * 30} | {'-' * 8}: | {'-' * 6}: | {'-' * 6}: | {'-' * 8}: | {'-' * 7}: |")
    for r in rows:
        torch_us = f"{r['torch_us']:8.1f}" if r["torch_us"] is not None else f"{'-':>8}"
        speedup = f"{r['speedup']:6.2f}x" if r["speedup"] is not None else f"{'-':>7}"
        shape = r["shape"] + (f" {r['config']}" if "config" in r else "")
        print(
            f"| {r['kernel']:<16} | {shape:<30} | {r['us']:8.1f} | {r['gb_s']:6.0f} | {r['pct_copy']:6.1f} "
            f"| {torch_us} | {speedup} |"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sweep", action="store_true", help="also sweep attention configs")
    parser.add_argument("--json", type=Path, help="write every row as JSON here")
    parser.add_argument(
        "--only", help="comma-separated section functions to run, e.g. bench_sample,bench_verify (default: all)"
    )
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("bench_kernels needs a CUDA GPU")
        return 1
    major, minor = torch.cuda.get_device_capability()
    sm = major * 10 + minor
    copy = common.measure_copy_bandwidth("cuda", nbytes=2 << 30)
    copy_gb_s = copy["gb_s"]
    print(f"{torch.cuda.get_device_name()} sm_{sm}, torch {torch.__version__}; copy {copy_gb_s:.0f} GB/s")
    rows: list[dict] = []
    failed = 0
    sections = [(bench_attention, shape) for shape in ATTENTION_SHAPES]
    sections += [(bench_rms_norm, (5,)), (bench_rms_norm, (576,))]  # B * (K+1) rows: B 1 K 4, B 64 K 8
    sections += [(bench_rotary, (1, 5)), (bench_rotary, (64, 9))]
    sections += [(bench_verify, (1, 4)), (bench_verify, (8, 4)), (bench_verify, (64, 4))]
    sections += [(bench_kv_write, (1, 5)), (bench_kv_write, (64, 9)), (bench_silu_mul, (5,)), (bench_silu_mul, (576,))]
    sections += [(bench_rotary_kv_write, (1, 5)), (bench_rotary_kv_write, (64, 9))]
    sections += [(bench_sample, (1,)), (bench_sample, (8,)), (bench_sample, (64,))]
    if args.only:
        sections = [(bench, shape) for bench, shape in sections if bench.__name__ in args.only.split(",")]
    for bench, shape in sections:
        try:  # one failing kernel must not hide the others' numbers
            result = bench(*shape, sm, copy_gb_s)
        except Exception as error:
            print(f"{bench.__name__}{shape} FAILED: {type(error).__name__}: {error}"[:2000], file=sys.stderr)
            failed += 1
            continue
        rows += result if isinstance(result, list) else [result]
    for extra in rows:
        if "splits" in extra:
            print(f"attention {extra['shape']}: splits={extra['splits']} rel_err_vs_ref={extra['rel_err_vs_ref']}")
    print_table(rows, copy_gb_s, f"graphspec kernels, sm_{sm}, each with the registry's config for sm {sm}")
    sweep = sweep_attention(copy_gb_s) if args.sweep else []
    if sweep:
        fields = "/".join(attention_kernel.CONFIG_FIELDS)
        print_table(sweep, copy_gb_s, f"attention config sweep, fastest first per shape (config: {fields})")
    if args.json:
        common.write_json(args.json, {"copy": copy, "sm": sm, "rows": rows, "sweep": sweep}, indent=1)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
