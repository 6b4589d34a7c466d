# ruff: noqa  (the script as run, kept with its results)
"""The decode/verify attention (rotary + KV write fused, 8B heads) with its split count forced to S, at
short and long contexts: how much of a split launch is the reduce, and which S is best per (B, keys).
Each timing is one CUDA graph of many launches on different (slot set, layer) pairs, per launch.

    python docs/results/2026-11-28-attention-fixup/splits_probe.py
"""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "2026-11-27-attention-splits"))
from probe import inputs, run, QH, KVH
from graphspec.kernels import attention as new
from graphspec.kernels.common import config_for, sm_count

original = new.num_splits


def main():
    major, minor = torch.cuda.get_device_capability()
    base = dict(config_for(new.CONFIGS, major * 10 + minor))
    sms = sm_count(torch.device("cuda"))
    print(torch.cuda.get_device_name(), "config", base, flush=True)
    forced = (1, 2, 4, 8, 16, 33)
    print(f"{'shape':>18} {'default S':>9} {'default':>8} " + " ".join(f"{'S=' + str(s):>8}" for s in forced))
    shapes = [(b, t, 1024, 512) for b in (1, 4, 16) for t in (1, 5, 16)]
    shapes += [
        (64, 1, 1024, 512),
        (64, 5, 1024, 512),
        (1, 1, 4096, 512),
        (1, 5, 4096, 512),
        (16, 5, 4096, 512),
        (1, 1, 4096, 2048),
        (4, 5, 4096, 2048),
        (16, 1, 4096, 2048),
        (16, 5, 4096, 2048),
        (1, 5, 32768, 32768),
        (4, 5, 8192, 8192),
        (16, 5, 8192, 8192),
    ]
    for batch, t, capacity, context in shapes:
        row_bytes = 2 * KVH * capacity * 128 * 2
        layers = max(2, min(32, (64 << 20) // (batch * row_bytes) or 2))
        rotate = max(1, min(4, (256 << 20) // (layers * batch * row_bytes)))
        case = inputs(batch, t, capacity, context, layers, rotate, False)
        new.num_splits = original
        default_s = original(
            batch, KVH, max(1, -(-(QH // KVH * t) // 128)), capacity, base["block_n"], base["programs_per_sm"], sms
        )
        d_us, d_out = run(new, case, base, True)
        cells = []
        for s in forced:
            if s > -(-capacity // base["block_n"]):
                cells.append(f"{'-':>8}")
                continue
            new.num_splits = lambda *a, s=s: s
            us, out = run(new, case, base, True)
            cells.append(f"{us:8.2f}")
        new.num_splits = original
        print(f"{f'B{batch} T{t} {context}/{capacity}':>18} {default_s:9d} {d_us:8.2f} " + " ".join(cells), flush=True)
        del case
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
