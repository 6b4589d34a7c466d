# ruff: noqa  (a probe, kept with its results)
"""Probe (issue 16): the decode/verify attention with its loads asked for up front, next to the kernel before.

The B = 1 attention pair (split attention + reduce) costs ~7.5 us a layer for 1-2 MB of keys and values: latency,
not bandwidth. In the kernel before (de9a28e's kernels/attention.py, sm_90 SASS) a program waited for start_pos,
branched (empty splits), then loaded the norm's source rows and summed them across warps (a barrier), then loaded
this step's k/v and cos/sin, stored the new keys, synchronized, and only then asked HBM for its first key block;
the reduce waited for the log-sum-exps before asking for the partials. The kernel after asks for everything an
earlier launch wrote (slot, start, q, k, v, cos/sin, source rows) and the chunk's first key block before waiting
for any of it (the rows this step writes are read back after the store), sums the source rows elementwise before
one cross-warp sum, and the reduce asks for its first chunk with the log-sum-exps.

As the step runs it (graphspec::rotary_kv_attention: rotary, the KV write and the folded norm's row scale fused),
bf16, Llama-3.1-8B heads (32 q, 8 kv, D 128, hidden 4096) and Llama-3.2-1B heads (32 q, 8 kv, D 64, hidden 2048),
CONFIGS[90]; slots rotated over 4 sets so K/V come from HBM; 8 x 4 launches in one CUDA graph (median of 50), us
per launch; outputs and caches compared bit for bit.

    python docs/results/2026-11-29-attention-loads/probe.py BEFORE.py    # BEFORE.py: the kernel file before
"""

from __future__ import annotations

import importlib.util
import sys
import types
from pathlib import Path

import torch

sys.path.insert(0, "benchmarks")
import common  # noqa: E402
from graphspec.kernels import attention as after  # noqa: E402

# The unsplit probe's inputs (its shapes' heads, 4 rotated slot sets so K/V come from HBM).
spec = importlib.util.spec_from_file_location(
    "unsplit", Path(__file__).parents[1] / "2026-11-29-attention-unsplit/probe.py"
)
unsplit = importlib.util.module_from_spec(spec)
spec.loader.exec_module(unsplit)
inputs, ROTATE = unsplit.inputs, unsplit.ROTATE
REPEAT = 8
SHAPES = [  # (heads, batch, T, length, capacity)
    ("8B", 1, 1, 512, 1024),
    ("8B", 1, 5, 512, 1024),
    ("8B", 1, 1, 1000, 1024),
    ("8B", 1, 1, 2000, 4096),
    ("8B", 1, 5, 2000, 4096),
    ("1B", 1, 1, 512, 1024),
    ("1B", 1, 2, 512, 1024),
    ("8B", 4, 5, 512, 1024),
    ("8B", 16, 5, 512, 1024),
    ("8B", 64, 1, 512, 1024),
]


def load(path):
    """The kernel module at `path` without its torch.library registrations (the op names are taken)."""
    module = types.ModuleType("attention_before")
    module.__file__ = path
    source = open(path).read()
    exec(compile(source[: source.index("\n@library.op(")], path, "exec"), module.__dict__)
    return module


def launch(module, d, cache, q, rotary, row_scale, slots, start):
    config = tuple(module.CONFIGS[90].values())
    return module.attention(q, cache, 0, slots, start, d**-0.5, *config, rotary=rotary, row_scale=row_scale)


def main():
    before = load(sys.argv[1])
    print(torch.cuda.get_device_name(), torch.__version__, "config", after.CONFIGS[90], flush=True)
    print("| heads, B, T, keys (cache) | before us | after us | after - before | bitwise |")
    print("| --- | ---: | ---: | ---: | --- |")
    for shape in SHAPES:
        d, cache, q, rotary, row_scale, slot_sets, start = inputs(*shape)
        clean = cache.clone()
        results = {}
        for name, module in (("before", before), ("after", after), ("before2", before), ("after2", after)):
            run = lambda: [
                launch(module, d, cache, q, rotary, row_scale, s, start) for _ in range(REPEAT) for s in slot_sets
            ]
            us = common.time_fn(run, "cuda", reps=50, warmup=3)["ms"] * 1e3 / (ROTATE * REPEAT)
            cache.copy_(clean)
            out = launch(module, d, cache, q, rotary, row_scale, slot_sets[0], start)
            results.setdefault(name.rstrip("2"), []).append((us, out, cache.clone()))
            cache.copy_(clean)
        (b1, ob, cb), (b2, _, _) = results["before"]
        (a1, oa, ca), (a2, _, _) = results["after"]
        same = torch.equal(ob.view(torch.int16), oa.view(torch.int16)) and torch.equal(
            cb.view(torch.int16), ca.view(torch.int16)
        )
        diff = "yes" if same else f"no (max |out diff| {(ob.float() - oa.float()).abs().max().item():.3g})"
        b, a = min(b1, b2), min(a1, a2)
        print(
            f"| {shape[0]}, {shape[1]}, {shape[2]}, {shape[3]} ({shape[4]}) | {b:.2f} ({b1:.2f}/{b2:.2f}) | {a:.2f} ({a1:.2f}/{a2:.2f}) | {a - b:+.2f} | {diff} |",
            flush=True,
        )
        del cache, clean


if __name__ == "__main__":
    main()
