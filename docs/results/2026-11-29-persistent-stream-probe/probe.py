# ruff: noqa  (a probe, kept with its results)
"""Probe (issue 16): what does a kernel boundary cost when the persistent kernel streams its weights well?

The persistent-layers probe (docs/results/2026-11-29-persistent-layers-probe/run) lost to the launches by 15-300 us
a layer, and two things were mixed in that: its grid barriers (0.9-1.6 us each, six a layer) and its phases, which
streamed far below the copy rate (each program walks its tiles one after another, and Triton pipelines only the
innermost loop: every tile's K loop, 4-16 steps, starts cold). This probe takes attention out and asks the
question the megakernel direction hangs on, on GEMV phases alone:
- "flat": each phase one flattened loop over (tile, K step) of the program's tiles, software-pipelined across tile
  boundaries (the epilogue, sum + rounding + store, under `if` at a tile's last step, as Triton's persistent matmul
  tutorial does), so the loads of a program's next tile are in flight while it finishes the last one;
- "flat, no barriers": the same phases without synchronization (wrong results: timing of the streaming alone);
- "flat + prefetch": before each barrier, the program asks L2 for its first tile of the next phase;
- "launches": graphspec's gemv_kernel per phase (8 x 512 tiles, 4 warps, 3 stages, as every phase of "flat"
  takes), captured in one CUDA graph; "flat" is bitwise equal to it (same tiles, same summation order);
- the floor: the weights / the copy rate measured in the same run.

The chain, per layer, is a one-row decoder layer's four GEMVs with attention and SwiGLU left out (a phase's input
is the previous output's first K values): y = x Wqkv^T; x += y[:H] Wo^T; g = x Wgu^T; x += g[:I] Wd^T. For the
Llama-3.2-1B (16 layers) and Llama-3.1-8B (32) shapes, bf16.

If "flat" streams near the launches' phases and "flat" with barriers beats the launches by a few us a layer, a
dependency-driven megakernel is worth building; if "flat, no barriers" itself is slow, Triton's persistent GEMV
is not the tool.

    timeout 300 python docs/results/2026-11-29-persistent-stream-probe/probe.py
    (--call 1: the first call's configs, run/probe_h200_call1.log; 2: the second's; 3: prepared, not run yet)
    TRITON_INTERPRET=1 python docs/results/2026-11-29-persistent-stream-probe/probe.py --check-cpu   # one program
"""

import argparse
import importlib.util
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))
spec = importlib.util.spec_from_file_location(
    "persistent", ROOT / "docs/results/2026-11-29-persistent-layers-probe/probe.py"
)
persistent = importlib.util.module_from_spec(spec)
spec.loader.exec_module(persistent)
grid_barrier, prefetch_rows, resident_programs_per_sm = (
    persistent.grid_barrier,
    persistent.prefetch_rows,
    persistent.resident_programs_per_sm,
)

from graphspec.kernels.common import round_to

DTYPE = torch.bfloat16
BN, BK, WARPS = 8, 512, 4  # gemv.CONFIGS[90]'s tile (the launches'; a row's sum does not depend on BN)
# (programs a SM, weight rows a tile, stages of the flattened loop, barriers, prefetch lines (0: none)). Call 1 ran
# the 8-row ones; call 2 the 4-row ones and p3 (4-row tiles: the 1B q/k/v's 384 8-row tiles leave half of 264
# programs with two and half with one, a phase of two tile-times for 1.45 of work).
CONFIGS = [
    (1, 8, 3, True, 0),
    (2, 8, 3, True, 0),
    (4, 8, 3, True, 0),
    (2, 8, 4, True, 0),
    (4, 8, 4, True, 0),
    (2, 8, 3, True, 16),
    (4, 8, 3, True, 16),
    (2, 8, 3, False, 0),
    (4, 8, 3, False, 0),
    (4, 8, 4, False, 0),
]
CONFIGS_CALL_2 = [(2, 4, 4, True, 0), (3, 4, 3, True, 0), (2, 4, 4, True, 8), (2, 4, 5, True, 0), (3, 8, 3, True, 0),
                  (2, 4, 4, False, 0)]  # fmt: skip
# Call 3 (prepared 2026-11-29 18:45, not run yet): call 1's best (2 a SM, 8 x 512, 4 stages) with, before each
# barrier, whole weight rows of the program's first 1, 2 or 4 tiles of the next phase asked of L2 (prefetch_tiles; the
# 16 lines of call 1's prefetch are half a 1B row). A barrier waits ~1.5 us, 6 MB of HBM time: the 1B's o weight is
# 8 MB, one 8-row tile a program 32 KB. If the prefetched chain beats the launches by > 1 us a phase, a persistent
# forward is back on the table. Entries: (programs a SM, rows a tile, stages, barriers, prefetch lines, prefetch tiles)
CONFIGS_CALL_3 = [(2, 8, 4, True, 0, 0), (2, 8, 4, True, 0, 1), (2, 8, 4, True, 0, 2), (2, 8, 4, True, 0, 4),
                  (2, 8, 3, True, 0, 2)]  # fmt: skip


@triton.jit
def stream_phase(
    x_ptr, w_ptr, out_ptr, N, K, pid, P, ACCUMULATE: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
    STAGES: tl.constexpr,
):  # fmt: skip
    """out[n] (+)= sum_k x[k] W[n, k] for this program's tiles of BN rows (tiles pid, pid + P, ...), gemv_kernel's
    arithmetic (fp32 products accumulated in [BN, BK], summed once, one rounding; ACCUMULATE: + out[n] first rounded
    as the in-place addmm does). One loop over (tile, K step): pipelined across tiles. x is read past L1 (.cg):
    other programs wrote it. N % BN == 0, K % BK == 0."""
    k_steps = K // BK
    tiles = tl.cdiv(N // BN - pid, P)
    acc = tl.zeros((BN, BK), dtype=tl.float32)
    for i in tl.range(0, tiles * k_steps, num_stages=STAGES):
        tile = pid + (i // k_steps) * P
        step = i % k_steps
        rows = tile * BN + tl.arange(0, BN)
        cols = step * BK + tl.arange(0, BK)
        x = tl.load(x_ptr + cols, cache_modifier=".cg").to(tl.float32)
        w = tl.load(w_ptr + rows.to(tl.int64)[:, None] * K + cols[None, :])
        acc += w.to(tl.float32) * x[None, :]
        if step == k_steps - 1:
            total = tl.sum(acc, 1)
            if ACCUMULATE:
                total += tl.load(out_ptr + rows, cache_modifier=".cg").to(tl.float32)
            dtype = out_ptr.dtype.element_ty
            tl.store(out_ptr + rows, round_to(total, dtype).to(dtype))
            acc = tl.zeros((BN, BK), dtype=tl.float32)


@triton.jit
def prefetch_tiles(w_ptr, pid, P, N, K, BN: tl.constexpr, TILES: tl.constexpr):
    """Ask L2 for the whole rows of this program's first TILES tiles of a phase (tiles pid, pid + P, ...; 128-byte
    lines, 64 a row a step; columns past K clamped to the row's last line): issued before a barrier, the next phase's
    weights stream while the program waits (the weights do not depend on what it waits for)."""
    for t in tl.static_range(TILES):
        tile = tl.minimum(pid + t * P, N // BN - 1)
        rows = tile * BN + tl.arange(0, BN)
        for c0 in range(0, K, 64 * 64):
            cols = tl.minimum(c0 + tl.arange(0, 64) * 64, K - 64)
            lines = w_ptr + rows.to(tl.int64)[:, None] * K + cols[None, :]
            tl.inline_asm_elementwise(
                "prefetch.global.L2 [$1];\n\tmov.u32 $0, 0;", "=r,l", [lines], dtype=tl.int32, is_pure=False, pack=1
            )


@triton.jit
def stream_layers_kernel(
    x_ptr, y_ptr, g_ptr, wqkv_ptr, wo_ptr, wgu_ptr, wd_ptr, counter_ptr, LAYERS, H, QKV, GU, I,
    BN: tl.constexpr, BK: tl.constexpr, STAGES: tl.constexpr, BARRIERS: tl.constexpr, PREFETCH: tl.constexpr,
    PREFETCH_TILES: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    P = tl.num_programs(0)
    phase = 0
    wqkv, wo, wgu, wd = wqkv_ptr, wo_ptr, wgu_ptr, wd_ptr
    for layer in range(LAYERS):
        stream_phase(x_ptr, wqkv, y_ptr, QKV, H, pid, P, False, BN, BK, STAGES)
        if PREFETCH:
            prefetch_rows(wo, pid * BN, H, H, BN, PREFETCH)
        if PREFETCH_TILES:
            prefetch_tiles(wo, pid, P, H, H, BN, PREFETCH_TILES)
        if BARRIERS:
            phase += 1
            grid_barrier(counter_ptr, phase * P)
        stream_phase(y_ptr, wo, x_ptr, H, H, pid, P, True, BN, BK, STAGES)
        if PREFETCH:
            prefetch_rows(wgu, pid * BN, GU, H, BN, PREFETCH)
        if PREFETCH_TILES:
            prefetch_tiles(wgu, pid, P, GU, H, BN, PREFETCH_TILES)
        if BARRIERS:
            phase += 1
            grid_barrier(counter_ptr, phase * P)
        stream_phase(x_ptr, wgu, g_ptr, GU, H, pid, P, False, BN, BK, STAGES)
        if PREFETCH:
            prefetch_rows(wd, pid * BN, H, I, BN, PREFETCH)
        if PREFETCH_TILES:
            prefetch_tiles(wd, pid, P, H, I, BN, PREFETCH_TILES)
        if BARRIERS:
            phase += 1
            grid_barrier(counter_ptr, phase * P)
        stream_phase(g_ptr, wd, x_ptr, H, I, pid, P, True, BN, BK, STAGES)
        wqkv += QKV * H
        wo += H * H
        wgu += GU * H
        wd += H * I
        if PREFETCH:
            if layer + 1 < LAYERS:
                prefetch_rows(wqkv, pid * BN, QKV, H, BN, PREFETCH)
        if PREFETCH_TILES:
            if layer + 1 < LAYERS:
                prefetch_tiles(wqkv, pid, P, QKV, H, BN, PREFETCH_TILES)
        if BARRIERS:
            phase += 1
            grid_barrier(counter_ptr, phase * P)


class Chain:
    def __init__(self, layers: int, h: int, qkv: int, inter: int, device: str, seed: int = 0) -> None:
        g = torch.Generator(device=device).manual_seed(seed)
        make = lambda *shape: (torch.randn(*shape, generator=g, device=device) / shape[-1] ** 0.5).to(DTYPE)
        self.layers, self.h, self.qkv, self.gu, self.inter = layers, h, qkv, 2 * inter, inter
        self.wqkv, self.wo, self.wgu, self.wd = (
            make(layers, qkv, h),
            make(layers, h, h),
            make(layers, 2 * inter, h),
            make(layers, h, inter),
        )
        self.x0 = torch.randn(1, h, generator=g, device=device).to(DTYPE)
        self.bytes = sum(w.numel() * w.element_size() for w in (self.wqkv, self.wo, self.wgu, self.wd))


def launches(chain: Chain):
    from graphspec.kernels import gemv

    tile = dict(block_n=BN, block_k=BK, num_warps=WARPS, num_stages=3)
    x = chain.x0.clone()

    def run() -> torch.Tensor:
        x.copy_(chain.x0)
        for layer in range(chain.layers):
            y = gemv.gemv(x, chain.wqkv[layer].t(), None, None, **tile)
            gemv.gemv(y[:, : chain.h], chain.wo[layer].t(), x, x, **tile)
            g = gemv.gemv(x, chain.wgu[layer].t(), None, None, **tile)
            gemv.gemv(g[:, : chain.inter], chain.wd[layer].t(), x, x, **tile)
        return x

    return run


class Stream:
    def __init__(
        self, chain: Chain, programs: int, bn: int, stages: int, barriers: bool, prefetch: int, prefetch_tiles: int = 0
    ) -> None:
        self.chain, self.programs = chain, programs
        device = chain.x0.device
        self.x = chain.x0.clone()
        self.y = torch.empty(1, chain.qkv, dtype=DTYPE, device=device)
        self.g = torch.empty(1, chain.gu, dtype=DTYPE, device=device)
        self.counter = torch.zeros(1, dtype=torch.int32, device=device)
        self.meta = dict(
            BN=bn,
            BK=BK,
            STAGES=stages,
            BARRIERS=barriers,
            PREFETCH=prefetch,
            PREFETCH_TILES=prefetch_tiles,
            num_warps=WARPS,
        )

    def args(self) -> tuple:
        c = self.chain
        return (self.x, self.y, self.g, c.wqkv, c.wo, c.wgu, c.wd, self.counter, c.layers, c.h, c.qkv, c.gu, c.inter)

    def compiled(self):
        return stream_layers_kernel.warmup(*self.args(), grid=(self.programs,), **self.meta)

    def __call__(self) -> torch.Tensor:
        self.counter.zero_()
        self.x.copy_(self.chain.x0)
        stream_layers_kernel[(self.programs,)](*self.args(), **self.meta)
        return self.x


def check_cpu() -> None:
    for layers, h, qkv, inter in ((2, 1024, 1536, 2048), (3, 512, 1024, 1024)):
        chain = Chain(layers, h, qkv, inter, "cpu", seed=layers)
        expected = launches(chain)().clone()
        for bn in (8, 4):
            out = Stream(chain, 1, bn, 3, True, 0)().clone()
            assert torch.equal(out, expected), (out - expected).abs().max()
        print(f"L={layers} H={h}: one program, bitwise equal to the launches")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--check-cpu", action="store_true")
    parser.add_argument(
        "--call", type=int, default=3, help="1: the first call's configs; 2: the second's; 3: the third's"
    )
    args = parser.parse_args()
    if args.check_cpu:
        check_cpu()
        return
    from benchmarks import common

    copy_gb_s = common.measure_copy_bandwidth("cuda")["gb_s"]
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    print(
        f"{common.device_name('cuda')}, {sms} SMs, triton {triton.__version__}, copy {copy_gb_s:.0f} GB/s", flush=True
    )
    time_us = lambda fn: common.time_fn(fn, "cuda", reps=20, warmup=2)["ms"] * 1e3
    for model in ("llama-1b", "llama-8b"):
        s = common.SHAPES[model]
        h, inter, layers = s["hidden_size"], s["intermediate_size"], s["num_hidden_layers"]
        qkv = h + 2 * s["num_key_value_heads"] * (h // s["num_attention_heads"])
        chain = Chain(layers, h, qkv, inter, "cuda")
        floor = chain.bytes / (copy_gb_s * 1e3)
        run = launches(chain)
        expected = run().clone()
        base = time_us(run)
        print(
            f"{model}: {layers} layers x 4 GEMVs, weights {chain.bytes / 1e9:.2f} GB, floor {floor:.0f} us; launches {base:.0f} us "
            f"({base / floor:.2f}x, {(base - floor) / (4 * layers):.2f} us a phase over the floor)",
            flush=True,
        )
        configs = {1: [c + (0,) for c in CONFIGS], 2: [c + (0,) for c in CONFIGS_CALL_2], 3: CONFIGS_CALL_3}[args.call]
        for per_sm, bn, stages, barriers, prefetch, prefetch_tiles in configs:
            name = f"p{per_sm}xSM bn{bn} s{stages}{'' if barriers else ' NO BARRIERS'}{f' prefetch{prefetch}' if prefetch else ''}{f' prefetch {prefetch_tiles} tiles' if prefetch_tiles else ''}"
            try:
                stream = Stream(chain, per_sm * sms, bn, stages, barriers, prefetch, prefetch_tiles)
                fits = resident_programs_per_sm(stream.compiled(), WARPS)
                if barriers and fits < per_sm:
                    print(f"  {name}: skipped, {fits} programs a SM resident at most", flush=True)
                    continue
                out = stream().clone()
                same = torch.equal(out, expected)
                us = time_us(stream)
                print(
                    f"  {name}: {us:.0f} us ({us / floor:.2f}x the floor, {(us - base) / (4 * layers):+.2f} us a phase "
                    f"against launches){'; bitwise equal' if same else '; differs' + (' (expected: no barriers)' if not barriers else '')}",
                    flush=True,
                )
            except Exception as failure:
                print(f"  {name}: {type(failure).__name__}: {str(failure)[:200]}", flush=True)
        del chain


if __name__ == "__main__":
    main()
