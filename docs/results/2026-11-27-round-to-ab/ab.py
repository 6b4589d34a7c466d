# ruff: noqa  (the script as run, kept with its results; 4cac85a's kernels now taken from git by before.py)
"""round_to through the hardware conversion (now) against the bit arithmetic (4cac85a): the
kernels that round most, side by side on one GPU, per launch in CUDA graphs, bf16, at a 4096-token
prefill's shapes (8B: hidden 4096, 32/8 heads x 128, MLP 14336) and a batch-4 K=4 verify's (20 rows).
Each pair's outputs are compared bit for bit, and round_to itself against torch's conversion on 16M
random fp32 bit patterns.

    python docs/results/2026-11-27-round-to-ab/ab.py
"""

import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parents[2])]
import before as before_at  # noqa: E402
from graphspec.kernels import add_rms_norm, rotary, silu_mul  # noqa: E402
from graphspec.kernels.common import round_to  # noqa: E402

from benchmarks import common  # noqa: E402


@triton.jit
def round_probe(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n)
    tl.store(out_ptr + offs, round_to(x, tl.bfloat16).to(tl.bfloat16), mask=offs < n)


def randn(*shape):
    return torch.randn(*shape, device="cuda", dtype=torch.bfloat16)


def cases(rows):
    gate_up = randn(rows, 2 * 14336) * 4
    x, residual, weight = randn(rows, 4096), randn(rows, 4096), randn(4096)
    q = randn(1, rows, 32, 128).transpose(1, 2)
    k = randn(1, rows, 8, 128).transpose(1, 2)
    cos, sin = torch.rand(1, rows, 128, device="cuda"), torch.rand(1, rows, 128, device="cuda")
    many = rows >= silu_mul.MANY_ROWS
    silu_row = silu_mul.CONFIGS[(90, "many_rows") if many else 90]
    return {
        "silu_mul": lambda m: m.silu_mul(gate_up, *silu_row.values()),
        "add_rms_norm": lambda m: m.add_rms_norm(x, residual, weight, 1e-5, *add_rms_norm.CONFIGS[90].values()),
        "rotary": lambda m: m.rotary(q, k, cos, sin, *rotary.CONFIGS[90].values()),
    }


def flat(out):
    return torch.cat([t.reshape(-1) for t in out]) if isinstance(out, (tuple, list)) else out.reshape(-1)


def main():
    old = before_at.load("4cac85a", ["common", "rms_norm", "silu_mul", "rotary", "add_rms_norm"])
    print(torch.cuda.get_device_name(), torch.__version__, triton.__version__)
    modules = {
        "silu_mul": (old["silu_mul"], silu_mul),
        "add_rms_norm": (old["add_rms_norm"], add_rms_norm),
        "rotary": (old["rotary"], rotary),
    }
    print("\nms per launch: before (bit arithmetic) / now (cvt.rn), best of two alternating rounds")
    for rows in (4096, 20):
        for name, fn in cases(rows).items():
            old, new = modules[name]
            same = torch.equal(flat(fn(old)).view(torch.int16), flat(fn(new)).view(torch.int16))
            times = [common.time_fn(lambda m=m: fn(m), "cuda", reps=30)["ms"] for m in (old, new, old, new)]
            print(
                f"  {name:13} {rows:5} rows: {min(times[0::2]):.4f} / {min(times[1::2]):.4f}  "
                f"{min(times[0::2]) / min(times[1::2]):.2f}x  bit-identical {same}"
            )
    bits = torch.randint(-(2**31), 2**31 - 1, (1 << 24,), device="cuda", dtype=torch.int32)
    x = bits.view(torch.float32)
    out = torch.empty(x.shape, device="cuda", dtype=torch.bfloat16)
    round_probe[(triton.cdiv(x.numel(), 1024),)](x, out, x.numel(), BLOCK=1024)
    hw = x.to(torch.bfloat16)
    same = (out.view(torch.int16) == hw.view(torch.int16)) | (out.isnan() & hw.isnan())
    print(f"\nround_to vs torch's fp32 -> bf16 on {x.numel()} random bit patterns: {int((~same).sum())} differ")
    return 0


if __name__ == "__main__":
    sys.exit(main())
