# ruff: noqa  (a probe, kept with its results)
"""Probe (issue 16): can a one-row decode layer's attention, which streams almost nothing, be used to pull the o
projection's weights into L2 from a second stream, so the o GEMV that follows reads L2 instead of HBM?

The persistent-layers probe (docs/results/2026-11-29-persistent-layers-probe/run) closed the other way of removing
kernel boundaries: its barriers alone cost 0.9-1.6 us each and its phases ran far slower than the launches. What
is left per layer is the time the launches do not stream: attention + its reduce take ~6-7 us for 1-2 MB of keys
and values (the unsplit kernel does not do better: docs/results/2026-11-29-attention-unsplit). Weights do not
depend on the activations, so a kernel on a forked stream can ask L2 for the o projection's rows (8.4 MB at the
1B, 33.5 MB at the 8B; L2 holds 50 MB) while the attention runs; the o GEMV joins both.

The chain is the persistent probe's (its `Chain` and graphspec's six launches a layer with their sm_90 rows, in one
CUDA graph), with, per layer, after the q/k/v GEMV: fork; on the side stream `l2_prefetch_kernel` over the first
FRACTION of the layer's o weight; join before the o GEMV. Modes: "prefetch" (PTX prefetch.global.L2, a request per
128-byte line, nothing waited for), "evict_last" (the same with the L2::evict_last hint), "load" (every line loaded
with .cg, summed, stored only if the sum is NaN: a real read that waits). Also the prefetch kernel alone (us to
pull the bytes), and "gu" variants that also ask for the first MB of gate/up.

    python docs/results/2026-11-29-l2-prefetch-probe/probe.py
"""

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

LINE = 64  # bf16 elements a 128-byte line
MODES = {"prefetch": 0, "evict_last": 1, "load": 2}


@triton.jit
def l2_prefetch_kernel(w_ptr, sink_ptr, n_lines, LINES: tl.constexpr, MODE: tl.constexpr):
    lines = tl.program_id(0) * LINES + tl.arange(0, LINES)
    lines = tl.minimum(lines, n_lines - 1)
    if MODE == 2:
        cols = tl.arange(0, 64)
        w = tl.load(w_ptr + lines.to(tl.int64)[:, None] * 64 + cols[None, :], cache_modifier=".cg")
        total = tl.sum(tl.sum(w.to(tl.float32), axis=1), axis=0)
        if total != total:
            tl.store(sink_ptr, total)
    else:
        ptrs = w_ptr + lines.to(tl.int64) * 64
        if MODE == 0:
            tl.inline_asm_elementwise(
                "prefetch.global.L2 [$1];\n\tmov.u32 $0, 0;", "=r,l", [ptrs], dtype=tl.int32, is_pure=False, pack=1
            )
        else:
            tl.inline_asm_elementwise(
                "prefetch.global.L2::evict_last [$1];\n\tmov.u32 $0, 0;",
                "=r,l",
                [ptrs],
                dtype=tl.int32,
                is_pure=False,
                pack=1,
            )


def prefetch(w: torch.Tensor, nbytes: int, mode: int, sink: torch.Tensor, lines_per_program: int) -> None:
    n_lines = max(1, min(w.numel() * w.element_size(), nbytes) // 128)
    grid = (triton.cdiv(n_lines, lines_per_program),)
    l2_prefetch_kernel[grid](w, sink, n_lines, LINES=lines_per_program, MODE=mode, num_warps=4)


def chain_run(chain, variant):
    """graphspec's six launches a layer (the persistent probe's `launches`), with variant = None or (mode,
    fraction of o, MB of gate/up, lines a program): the prefetch forked after q/k/v and joined before o."""
    from graphspec.kernels import attention, gemv, scaled_silu_mul_linear

    one = {k: gemv.CONFIGS[90][k] for k in ("block_n", "block_k", "num_warps", "num_stages")}
    fused = scaled_silu_mul_linear.CONFIGS[90]
    x = chain.x0.clone()
    device = x.device
    slot_ids = torch.zeros(1, dtype=torch.int64, device=device)
    start_pos = torch.full((1,), chain.ctx - 1, dtype=torch.int64, device=device)
    side = torch.cuda.Stream()
    sink = torch.zeros(1, device=device)
    o_bytes = chain.wo[0].numel() * 2

    def run() -> torch.Tensor:
        x.copy_(chain.x0)
        for layer in range(chain.layers):
            qkv = gemv.gemv(x, chain.wqkv[layer].t(), None, None, **one)
            if variant is not None:
                mode, fraction, gu_mb, lines = variant
                main = torch.cuda.current_stream()
                fork = torch.cuda.Event()
                fork.record(main)
                side.wait_event(fork)
                with torch.cuda.stream(side):
                    prefetch(chain.wo[layer], int(fraction * o_bytes), mode, sink, lines)
                    if gu_mb:
                        prefetch(chain.wgu[layer], int(gu_mb * 2**20), mode, sink, lines)
                join = torch.cuda.Event()
                join.record(side)
            q = qkv[:, : chain.h].view(1, chain.heads, 1, chain.d)
            attn = attention.attention(
                q, chain.cache, layer, slot_ids, start_pos, chain.d**-0.5, **attention.CONFIGS[90]
            )
            if variant is not None:
                torch.cuda.current_stream().wait_event(join)
            gemv.gemv(attn.view(1, chain.h), chain.wo[layer].t(), x, x, **one)
            act = scaled_silu_mul_linear.scaled_silu_mul_linear(x, chain.wgu[layer].t(), EPS, **fused)
            gemv.gemv(act, chain.wd[layer].t(), x, x, **one)
        return x

    return run


EPS = persistent.EPS
VARIANTS = [  # (mode, fraction of o, MB of gate/up, lines a program)
    ("prefetch", 1.0, 0, 256),
    ("prefetch", 1.0, 0, 1024),
    ("prefetch", 0.5, 0, 256),
    ("evict_last", 1.0, 0, 256),
    ("evict_last", 0.5, 0, 256),
    ("load", 1.0, 0, 64),
    ("load", 0.5, 0, 64),
    ("prefetch", 1.0, 8, 256),
    ("evict_last", 1.0, 8, 256),
]


def main() -> None:
    from benchmarks import common

    copy_gb_s = common.measure_copy_bandwidth("cuda")["gb_s"]
    print(
        f"{common.device_name('cuda')}, triton {triton.__version__}, torch {torch.__version__}, copy {copy_gb_s:.0f} GB/s"
    )
    time_us = lambda fn: common.time_fn(fn, "cuda", reps=20, warmup=2)["ms"] * 1e3
    for model in ("llama-1b", "llama-8b"):
        shape = common.SHAPES[model]
        h, inter, layers = shape["hidden_size"], shape["intermediate_size"], shape["num_hidden_layers"]
        heads, kv_heads = shape["num_attention_heads"], shape["num_key_value_heads"]
        chain = persistent.Chain(layers, h, heads, kv_heads, inter, 512, 1024, "cuda")
        floor = chain.bytes / (copy_gb_s * 1e3)
        base_run = chain_run(chain, None)
        expected = base_run().clone()
        bases = [time_us(base_run)]
        o_mb = chain.wo[0].numel() * 2 / 2**20
        print(
            f"{model}: {layers} layers, floor {floor:.0f} us, o weight {o_mb:.1f} MB; launches {bases[0]:.0f} us",
            flush=True,
        )
        sink = torch.zeros(1, device="cuda")
        for name, fraction, gu_mb, lines in VARIANTS:
            mode = MODES[name]
            variant = (mode, fraction, gu_mb, lines)
            run = chain_run(chain, variant)
            same = torch.equal(run().clone(), expected)
            us = time_us(run)
            alone = (
                time_us(
                    lambda: [
                        prefetch(chain.wo[l], int(fraction * o_mb * 2**20), mode, sink, lines) for l in range(layers)
                    ]
                )
                / layers
            )
            print(
                f"  {name} o {fraction:.0%}{f' + gate/up {gu_mb} MB' if gu_mb else ''}, {lines} lines a program: {us:.0f} us "
                f"({(us - bases[0]) / layers:+.2f} us a layer; outputs {'equal' if same else 'DIFFER'}); the prefetch alone {alone:.1f} us",
                flush=True,
            )
        bases.append(time_us(base_run))
        print(f"  launches again: {bases[1]:.0f} us", flush=True)
        del chain


if __name__ == "__main__":
    main()
