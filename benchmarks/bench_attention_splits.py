"""Attention at decode lengths, as the step runs it: one call per layer of a 32-layer stack, captured in a
CUDA graph, for several lengths and `min_split_keys` values (and, with --baseline, another version of
kernels/attention.py side by side, e.g. the one before a change: `git show REV:kernels/attention.py`).

    python benchmarks/bench_attention_splits.py
    python benchmarks/bench_attention_splits.py --baseline /path/to/attention_before.py

8B heads (32 q, 8 kv, D 128), bf16, K=4 (T=5 queries per row). The cache capacity is the step's static
max_seq_len (1024 for the short lengths, 32768 for the long), so the split count the grid allows is the
one a compiled step would use; the length is what the rows actually hold. Time = median per call.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from graphspec.kernels import attention as current
from graphspec.kernels.common import config_for

from benchmarks import common

LAYERS, Q_HEADS, KV_HEADS, HEAD_DIM, T = 32, 32, 8, 128, 5
CASES = [  # (batch, capacity, length)
    (1, 1024, 56),
    (1, 1024, 300),
    (1, 1024, 600),
    (1, 1024, 1000),
    (1, 32768, 4096),
    (1, 32768, 32000),
    (8, 1024, 600),
    (8, 32768, 16000),
]
MIN_SPLIT_KEYS = (64, 128, 256, 512)


def load_baseline(path: str):
    """Load another attention.py under a private op name (the current one owns graphspec::attention_triton)."""
    source = Path(path).read_text().replace("graphspec::attention_triton", "graphspec::attention_baseline_triton")
    module_path = Path("/tmp/graphspec_attention_baseline.py")
    module_path.write_text(source)
    spec = importlib.util.spec_from_file_location("graphspec_attention_baseline", module_path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def time_case(batch: int, capacity: int, length: int, names: list[str], config: dict, baseline) -> list[float]:
    """us per call of each version in `names` for one shape, each output checked against fp32."""
    cache = torch.randn(LAYERS, 2, batch + 1, KV_HEADS, capacity, HEAD_DIM, dtype=torch.bfloat16, device="cuda")
    q = torch.randn(batch, T, Q_HEADS, HEAD_DIM, dtype=torch.bfloat16, device="cuda").transpose(1, 2)
    slot_ids = torch.arange(batch, device="cuda")
    start_pos = torch.full((batch,), length - T, device="cuda")
    scale = HEAD_DIM**-0.5
    exact = current.attention_reference(q.float(), cache[:1].float(), 0, slot_ids, start_pos, scale)

    def make_call(name: str):
        if name.startswith("baseline"):
            return lambda layer: baseline.attention(q, cache, layer, slot_ids, start_pos, scale, **config)
        keys = int(name.split("=")[1])
        return lambda layer: current.attention(
            q, cache, layer, slot_ids, start_pos, scale, **config, min_split_keys=keys
        )

    times = []
    for name in names:
        call = make_call(name)
        error = ((call(0).float() - exact).norm() / exact.norm()).item()
        assert error < 1e-2, f"{name} at {batch}/{capacity}/{length}: relative error {error}"
        ms = common.time_fn(lambda call=call: [call(layer) for layer in range(LAYERS)], "cuda", reps=30)["ms"]
        times.append(ms * 1e3 / LAYERS)
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", default=None, help="another kernels/attention.py to time side by side")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("needs a CUDA GPU")
        return 2
    major, minor = torch.cuda.get_device_capability()
    config = config_for(current.CONFIGS, major * 10 + minor)
    baseline = load_baseline(args.baseline) if args.baseline else None
    names = [f"baseline {Path(args.baseline).name}"] if baseline else []
    names += [f"min_split_keys={keys}" for keys in MIN_SPLIT_KEYS]
    print(f"{common.device_name('cuda')}, config {config}, {LAYERS} layers per graph, T={T}")
    rows = []
    for batch, capacity, length in CASES:
        times = time_case(batch, capacity, length, names, config, baseline)
        rows.append((batch, capacity, length, times))
        print(f"B={batch} S={capacity} len={length}: " + ", ".join(f"{t:.1f}" for t in times), flush=True)
    print("\nus per attention call (median of graph replays / layers)")
    print("| B | capacity | length | " + " | ".join(names) + " |")
    print("| ---: | ---: | ---: | " + " | ".join("---:" for _ in names) + " |")
    for batch, capacity, length, times in rows:
        print(f"| {batch} | {capacity} | {length} | " + " | ".join(f"{t:.1f}" for t in times) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
