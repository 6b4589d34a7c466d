# ruff: noqa  (a probe, kept with its results)
"""Probe (issue 16; written 2026-11-30 00:00 UTC, run 2026-11-30 00:30: docs/results/2026-11-30-row-scale, where its
tables are): what the batch-1 attention's prologue costs. Result: fused - plain 1.05-1.17 us a launch at one token
(not worth the projection epilogue), 4.9 at five tokens, 3.6 of it the row scale's per-step cross-warp sums (fixed).

A one-token forward's attention (graphspec::rotary_kv_attention as the decode and the draft forwards run it) first
scales q, k and v by the folded input norm's row scale (each program re-reads the row's source row and sums it across
warps), rotates q and this step's k, writes k and v into the cache and synchronizes, and only then asks for its key
blocks: ~6-7 us a layer for 1-2 MB of keys and values (docs/BENCHMARKS.md). If the q/k/v projection's epilogue did
the row scale, the rotation and the KV write (the one-row GEMV streams x anyway; a program owning both halves of a
rotation pair can rotate), the attention would be the plain kernel. This times, per launch (attention + its reduce,
32 launches a CUDA graph, slots rotated so keys come from HBM), the three forms at the step's shapes:

  fused   rotary + KV write + row scale (what the step runs today)
  rotary  rotary + KV write (the row scale done elsewhere)
  plain   attention over the cache alone (everything done elsewhere)

fused - plain bounds what moving the prologue into the projection could save a layer (before the GEMV epilogue's own
cost); if it is under ~1.5 us a launch, the projection epilogue is not worth building.

    python docs/results/2026-11-30-attention-prologue-probe/probe.py
    TRITON_INTERPRET=1 python docs/results/2026-11-30-attention-prologue-probe/probe.py --check-cpu
"""

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

HEADS = {"8B": (32, 8, 128, 4096), "1B": (32, 8, 64, 2048)}  # q heads, kv heads, head dim, hidden
SHAPES = [("8B", 1, 512, 1024), ("8B", 5, 512, 1024), ("1B", 1, 512, 1024), ("1B", 2, 512, 1024), ("8B", 1, 2000, 4096)]
ROTATE = 4  # slot sets, so keys and values come from HBM
REPEAT = 8


def inputs(heads: str, t: int, length: int, capacity: int, device: str):
    q_heads, kv_heads, d, hidden = HEADS[heads]
    cache = torch.empty(1, 2, ROTATE, kv_heads, capacity, d, dtype=torch.bfloat16, device=device).normal_()
    q = torch.randn(1, q_heads, t, d, dtype=torch.bfloat16, device=device)
    k = torch.randn(1, kv_heads, t, d, dtype=torch.bfloat16, device=device)
    v = torch.randn_like(k)
    cos = torch.randn(1, t, d, device=device).to(torch.bfloat16)
    sin = torch.randn_like(cos)
    src = torch.randn(1, t, hidden, dtype=torch.bfloat16, device=device)
    slot_sets = [torch.tensor([i], device=device) for i in range(ROTATE)]
    start = torch.full((1,), length - t, device=device)
    return d, cache, q, (k, v, cos, sin), (src, 1e-5), slot_sets, start


def launcher(form: str, d: int, cache, q, rotary, row_scale, start, config):
    from graphspec.kernels import attention

    options = {"fused": dict(rotary=rotary, row_scale=row_scale), "rotary": dict(rotary=rotary), "plain": {}}[form]
    return lambda slots: attention.attention(q, cache, 0, slots, start, d**-0.5, *config, **options)


def check_cpu() -> None:
    """The three forms run (tiny shapes, interpreter); rotary and fused write this step's keys, plain reads them."""
    from graphspec.kernels import attention

    d, cache, q, rotary, row_scale, slot_sets, start = inputs("1B", 2, 40, 64, "cpu")
    config = tuple(attention.CONFIGS["default"].values())
    outs = {}
    for form in ("fused", "rotary", "plain"):
        work = cache.clone()
        outs[form] = launcher(form, d, work, q, rotary, row_scale, start, config)(slot_sets[0])
        assert torch.isfinite(outs[form].float()).all(), form
    assert not torch.equal(outs["fused"], outs["rotary"])  # the row scale changes q, k and v
    print("forms run:", {form: tuple(out.shape) for form, out in outs.items()})


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--check-cpu", action="store_true")
    parser.add_argument("--row-tile", type=int, default=0, help="attention.ROW_TILE for this run (0: as it is)")
    args = parser.parse_args()
    if args.check_cpu:
        check_cpu()
        return
    from benchmarks import common
    from graphspec.kernels import attention

    attention.ROW_TILE = args.row_tile or attention.ROW_TILE
    print("ROW_TILE", attention.ROW_TILE)

    config = tuple(attention.CONFIGS[90].values())
    print(torch.cuda.get_device_name(), torch.__version__, "config", attention.CONFIGS[90], flush=True)
    print("| heads, T, keys (cache) | fused us | rotary us | plain us | fused - plain |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for heads, t, length, capacity in SHAPES:
        d, cache, q, rotary, row_scale, slot_sets, start = inputs(heads, t, length, capacity, "cuda")
        clean = cache.clone()
        us = {}
        for form in ("fused", "rotary", "plain", "fused", "rotary", "plain"):  # twice, interleaved: the lower
            run_one = launcher(form, d, cache, q, rotary, row_scale, start, config)
            run = lambda: [run_one(s) for _ in range(REPEAT) for s in slot_sets]
            value = common.time_fn(run, "cuda", reps=50, warmup=3)["ms"] * 1e3 / (ROTATE * REPEAT)
            us[form] = min(us.get(form, value), value)
            cache.copy_(clean)
        print(
            f"| {heads}, {t}, {length} ({capacity}) | {us['fused']:.2f} | {us['rotary']:.2f} | {us['plain']:.2f} "
            f"| {us['fused'] - us['plain']:+.2f} |",
            flush=True,
        )
        del cache, clean


if __name__ == "__main__":
    main()
