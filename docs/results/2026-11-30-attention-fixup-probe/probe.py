# ruff: noqa  (a probe: measures one idea, not part of the package)
"""Probe (issue 16, 2026-11-30): a batch-1 split attention whose last split combines the partials, against the
split + reduce launch graphspec runs, each followed by the o projection (graphspec's GEMV, its sm_90 row).

The step's attention is latency, not bandwidth: 192 attention + reduce launches a K = 4 draft-model step, ~6.9 us a
layer-forward against a floor near zero (docs/BENCHMARKS.md). The 2026-11-28 fixup (the last split of a tile to
arrive combines its partials, no reduce launch) combined them one split after another, a chain of L2 round trips:
slower at B = 1 (16 tokens: 10.1 -> 14.4 us on an H100), and at B = 1 the reduce was kept. Here the last split
loads its tile's partials a [splits, rows, D] block at a time (.cg; every split at once at T = 1, up to
COMBINE_ELEMENTS) and combines them in one pass, rescaling as flash attention's online softmax does.

Chains timed as one CUDA graph of L layers (each layer its own KV cache region, so nothing stays in L2), with PDL
as graphspec launches them (GRAPHSPEC_PDL=0 for plain stream order):
  graphspec  kernels/attention.py's attention (its sm_90 row: split + reduce) -> o GEMV
  reduce     this probe's split kernel storing partials -> graphspec's attention_reduce_kernel -> o GEMV
  fixup      this probe's split kernel, the last split of each KV head combining -> o GEMV
Outputs are checked against torch (fp32 softmax of the bf16 cache) and between the chains.

    python docs/results/2026-11-30-attention-fixup-probe/probe.py          # H200: 1B and 8B heads, T = 1, 2, 5
    TRITON_INTERPRET=1 python docs/results/2026-11-30-attention-fixup-probe/probe.py --check-cpu
    TRITON_INTERPRET=1 python docs/results/2026-11-30-attention-fixup-probe/probe.py --dry-cpu   # main's flow, tiny
"""

import argparse
import math
import os
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from graphspec.kernels import attention as graphspec_attention  # noqa: E402
from graphspec.kernels.common import (  # noqa: E402
    let_later_kernels_launch,
    next_power_of_2,
    pdl_launch,
    round_to,
    wait_for_earlier_kernels,
)

LOG2E = 1.4426950408889634
MODELS = {"llama-1b": (32, 8, 64, 2048, 16), "llama-8b": (32, 8, 128, 4096, 32)}  # Hq, Hkv, D, hidden, layers
COMBINE_ELEMENTS = 8192  # the most partial elements the last split holds at once (splits x rows x D)


@triton.jit(do_not_specialize=["layer", "num_splits"])
def split_attention_kernel(
    q_ptr, cache_ptr, len_ptr, out_ptr, part_out_ptr, part_lse_ptr, counter_ptr,
    layer, num_splits, seq_capacity, qk_scale,
    T: tl.constexpr, GROUP: tl.constexpr, HKV: tl.constexpr, D: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, FIXUP: tl.constexpr, COMBINE_M: tl.constexpr, SPLIT_CHUNK: tl.constexpr,
    UPCAST: tl.constexpr, USE_PDL: tl.constexpr,
):  # fmt: skip
    # Batch 1. q [T, Hq, D]; cache [L, 2, Hkv, S, D]; the row's keys are positions [0, kv_len), its T queries the
    # last T of them. Partials [T, Hq, splits, (D)] as graphspec's (attention_reduce_kernel reads them).
    wait_for_earlier_kernels(USE_PDL)
    split = tl.program_id(0)
    kvh = tl.program_id(1)
    rows = tl.arange(0, BLOCK_M)
    row_ok = rows < GROUP * T
    head = kvh * GROUP + rows // T
    token = rows % T
    out_rows = token * (HKV * GROUP) + head
    kv_len = tl.load(len_ptr)
    query_pos = kv_len - T + token
    dims = tl.arange(0, D)
    q = tl.load(q_ptr + out_rows[:, None] * D + dims[None, :], mask=row_ok[:, None], other=0.0)
    chunk = tl.cdiv(tl.cdiv(kv_len, num_splits), BLOCK_N) * BLOCK_N
    lo = split * chunk
    hi = tl.minimum(lo + chunk, kv_len)
    parts = tl.cdiv(kv_len, chunk)  # splits holding keys
    if lo >= kv_len:
        if not FIXUP:  # the reduce reads every split: an empty partial
            tl.store(
                part_lse_ptr + out_rows * num_splits + split, tl.full([BLOCK_M], float("-inf"), tl.float32), mask=row_ok
            )
            tl.store(part_out_ptr + (out_rows * num_splits + split)[:, None] * D + dims[None, :],
                     tl.zeros([BLOCK_M, D], tl.float32), mask=row_ok[:, None])  # fmt: skip
        return
    if UPCAST:
        q = q.to(tl.float32)
    key_base = cache_ptr + layer.to(tl.int64) * 2 * HKV * seq_capacity * D + kvh.to(tl.int64) * seq_capacity * D
    value_base = key_base + HKV * seq_capacity * D
    m_i = tl.full([BLOCK_M], -1.0e30, tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    offs_n = tl.arange(0, BLOCK_N)
    for start in range(lo, hi, BLOCK_N):
        pos = start + offs_n
        in_range = pos < hi
        k = tl.load(key_base + pos[:, None] * D + dims[None, :], mask=in_range[:, None], other=0.0)
        if UPCAST:
            k = k.to(tl.float32)
        scores = tl.dot(q, tl.trans(k), input_precision="ieee" if UPCAST else "tf32") * qk_scale
        scores = tl.where((pos[None, :] <= query_pos[:, None]) & in_range[None, :], scores, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(scores, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(scores - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(value_base + pos[:, None] * D + dims[None, :], mask=in_range[:, None], other=0.0)
        if UPCAST:
            p, v = round_to(p, v.dtype), v.to(tl.float32)
        else:
            p = p.to(v.dtype)
        acc = acc * alpha[:, None] + tl.dot(p, v, input_precision="ieee" if UPCAST else "tf32")
        m_i = m_new
    let_later_kernels_launch(USE_PDL)
    norm = tl.where(l_i > 0, l_i, 1.0)
    lse = tl.where(l_i > 0, m_i + tl.log2(norm), float("-inf"))
    dtype = out_ptr.dtype.element_ty
    if FIXUP and parts == 1:  # the whole row in one split: the output directly
        tl.store(out_ptr + out_rows[:, None] * D + dims[None, :], round_to(acc / norm[:, None], dtype).to(dtype),
                 mask=row_ok[:, None])  # fmt: skip
        return
    tl.store(part_lse_ptr + out_rows * num_splits + split, lse, mask=row_ok)
    tl.store(part_out_ptr + (out_rows * num_splits + split)[:, None] * D + dims[None, :], acc / norm[:, None],
             mask=row_ok[:, None])  # fmt: skip
    if FIXUP:
        tl.debug_barrier()  # every thread's stores before the arrival, published by its release
        arrived = tl.atomic_add(counter_ptr + kvh, 1, sem="acq_rel", scope="gpu")
        if arrived == parts - 1:
            # The last to arrive: every partial of the tile, SPLIT_CHUNK splits x COMBINE_M rows x D at a time,
            # loaded past L1 (.cg; other SMs wrote them).
            c_rows = tl.arange(0, COMBINE_M)
            c_ok = c_rows < GROUP * T
            c_out = (c_rows % T) * (HKV * GROUP) + kvh * GROUP + c_rows // T
            # One pass, rescaling as the running maximum grows (flash's online softmax over the splits): a chunk's
            # log-sum-exps and partials are asked for together, one L2 round trip a chunk.
            top = tl.full([COMBINE_M], -1.0e30, tl.float32)
            total = tl.zeros([COMBINE_M], tl.float32)
            out = tl.zeros([COMBINE_M, D], tl.float32)
            for s0 in range(0, parts, SPLIT_CHUNK):
                s = s0 + tl.arange(0, SPLIT_CHUNK)
                ok = (s < parts)[:, None] & c_ok[None, :]
                idx = c_out[None, :] * num_splits + s[:, None]
                part_lse = tl.load(part_lse_ptr + idx, mask=ok, other=float("-inf"), cache_modifier=".cg")
                part = tl.load(part_out_ptr + idx[:, :, None] * D + dims[None, None, :], mask=ok[:, :, None],
                               other=0.0, cache_modifier=".cg")  # fmt: skip
                new_top = tl.maximum(top, tl.max(part_lse, 0))
                rescale = tl.exp2(top - new_top)
                weight = tl.exp2(part_lse - new_top[None, :])
                out = out * rescale[:, None] + tl.sum(part * weight[:, :, None], 0)
                total = total * rescale + tl.sum(weight, 0)
                top = new_top
            total = tl.where(c_ok, total, 1.0)
            tl.store(out_ptr + c_out[:, None] * D + dims[None, :], round_to(out / total[:, None], dtype).to(dtype),
                     mask=c_ok[:, None])  # fmt: skip
            tl.atomic_xchg(counter_ptr + kvh, 0, sem="relaxed", scope="gpu")  # zero for the next launch


def probe_attention(
    q, cache, layer, kv_len, out, part_out, part_lse, counters, fixup, splits, block_n=64, warps=4, stages=3
):
    t, hq, d = q.shape
    hkv, capacity = cache.shape[2], cache.shape[3]
    group = hq // hkv
    combine_m = next_power_of_2(group * t)
    upcast = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0") and q.dtype != torch.float32
    pdl = pdl_launch(q.device)
    split_attention_kernel[(splits, hkv)](
        q, cache, kv_len, out, part_out, part_lse, counters, layer, splits, capacity, d**-0.5 * LOG2E,
        T=t, GROUP=group, HKV=hkv, D=d, BLOCK_M=max(16, next_power_of_2(group * t)), BLOCK_N=block_n, FIXUP=fixup,
        COMBINE_M=combine_m, SPLIT_CHUNK=max(1, min(next_power_of_2(splits), COMBINE_ELEMENTS // (combine_m * d))),
        UPCAST=upcast or q.dtype == torch.float32, num_warps=warps, num_stages=stages, **pdl,
    )  # fmt: skip
    if not fixup:
        graphspec_attention.attention_reduce_kernel[(hq * t,)](
            part_out, part_lse, out, splits, HEAD_DIM=d, BLOCK_SPLITS=next_power_of_2(splits),
            CHUNK=graphspec_attention.REDUCE_CHUNK, num_warps=graphspec_attention.REDUCE_WARPS, **pdl,
        )  # fmt: skip
    return out


def reference(q, cache, layer, kv_len):
    t, hq, d = q.shape
    hkv = cache.shape[2]
    k = cache[layer, 0, :, :kv_len].float().repeat_interleave(hq // hkv, 0)  # [Hq, L, D]
    v = cache[layer, 1, :, :kv_len].float().repeat_interleave(hq // hkv, 0)
    scores = torch.einsum("thd,hld->thl", q.float(), k) * d**-0.5
    pos = torch.arange(kv_len, device=q.device)
    query = kv_len - t + torch.arange(t, device=q.device)
    scores = scores.masked_fill(pos[None, None, :] > query[:, None, None], float("-inf"))
    return torch.einsum("thl,hld->thd", scores.softmax(-1), v)


def make_case(device, dtype, hq, hkv, d, layers, capacity, t, seed=0):
    g = torch.Generator(device=device).manual_seed(seed)
    cache = torch.randn(layers, 2, hkv, capacity, d, generator=g, device=device).to(dtype)
    q = torch.randn(layers, t, hq, d, generator=g, device=device).to(dtype)
    return q, cache


def check_cpu() -> None:
    """Both variants against torch under the interpreter: split rows, one-split rows, a tile of padded rows."""
    for dtype in (torch.float32, torch.bfloat16):
        for t, kv_len, splits in ((1, 40, 4), (2, 37, 3), (5, 130, 4), (1, 9, 4), (3, 70, 2)):
            hq, hkv, d = 4, 2, 32
            q, cache = make_case("cpu", dtype, hq, hkv, d, 2, 160, t)
            length = torch.tensor([kv_len])
            want = reference(q[1], cache, 1, kv_len)
            counters = torch.zeros(hkv, dtype=torch.int32)
            for fixup in (False, True):
                out = torch.empty(t, hq, d, dtype=dtype)
                part_out = torch.full((t, hq, splits, d), float("nan"))
                part_lse = torch.full((t, hq, splits), float("nan"))
                got = probe_attention(
                    q[1], cache, 1, length, out, part_out, part_lse, counters, fixup, splits, block_n=16
                )
                diff = (got.float() - want).abs().max().item()
                tol = 1e-4 if dtype == torch.float32 else 3e-2
                print(f"{dtype} T={t} keys={kv_len} splits={splits} fixup={fixup}: max |diff| {diff:.1e}")
                assert diff <= tol, diff
                assert counters.eq(0).all(), counters  # each launch leaves the counters zero
    print("check-cpu: OK")


def main(
    device: str = "cuda",
    models: dict = MODELS,
    capacities: tuple = ((1024, (100, 512, 1000)), (4096, (2000, 4000))),
    dtype: torch.dtype = torch.bfloat16,
    block_n: int | None = None,
    reps: int = 30,
) -> None:
    from benchmarks import common
    from graphspec.kernels import gemv

    print(f"{common.device_name(device)}, copy {common.measure_copy_bandwidth(device)['gb_s']:.0f} GB/s, "
          f"PDL {'on' if pdl_launch(torch.device(device))['USE_PDL'] else 'off'}")  # fmt: skip
    config = {key: value for key, value in graphspec_attention.CONFIGS[90].items()}
    if block_n:
        config["block_n"] = block_n
    sms = graphspec_attention.sm_count(torch.device(device))

    def o_proj(x, w, residual):
        klass = gemv.shape_class(x, w.t(), residual)
        fields = {
            key: gemv.CLASS_CONFIGS[klass][90][key]
            for key in ("block_m", "block_n", "block_k", "num_warps", "num_stages")
        }
        return gemv.gemv(x, w.t(), residual, residual, **fields)

    for model, (hq, hkv, d, hidden, layers) in models.items():
        for capacity, lengths in capacities:
            q, cache = make_case(device, dtype, hq, hkv, d, layers, capacity, 5)
            g = torch.Generator(device=device).manual_seed(1)
            w_o = [(torch.randn(hidden, hq * d, generator=g, device=device) / (hq * d) ** 0.5).to(dtype)
                   for _ in range(layers)]  # fmt: skip
            cache6 = cache.view(layers, 2, 1, hkv, capacity, d)  # graphspec's [L, 2, SLOTS, Hkv, S, D]
            slot_ids = torch.zeros(1, dtype=torch.int64, device=device)
            counters = torch.zeros(hkv, dtype=torch.int32, device=device)
            splits = graphspec_attention.num_splits(
                1, hkv, 1, capacity, config["block_n"], config["programs_per_sm"], sms
            )
            for t in (1, 2) if model == "llama-1b" else (1, 2, 5):
                for kv_len in lengths:
                    length = torch.tensor([kv_len], device=device)
                    start_pos = length - t
                    residual = torch.zeros(1, hidden, dtype=dtype, device=device)
                    part_out = torch.empty(t, hq, splits, d, device=device)
                    part_lse = torch.empty(t, hq, splits, device=device)
                    outs = [torch.empty(t, hq, d, dtype=dtype, device=device) for _ in range(layers)]

                    def chain(variant):
                        for layer in range(layers):
                            ql = q[layer, :t]
                            if variant == "graphspec":
                                fields = {k: v for k, v in config.items()}
                                a = graphspec_attention.attention(ql.transpose(0, 1)[None], cache6, layer, slot_ids,
                                                                  start_pos, d**-0.5, **fields)  # fmt: skip
                                x = a.view(t, hq * d)
                            else:
                                a = probe_attention(ql, cache, layer, length, outs[layer], part_out, part_lse, counters,
                                                    variant == "fixup", splits, config["block_n"], config["num_warps"],
                                                    config["num_stages"])  # fmt: skip
                                x = a.view(t, hq * d)
                            o_proj(x[-1:], w_o[layer], residual)
                        return residual

                    line = []
                    want = reference(q[layers - 1, :t], cache, layers - 1, kv_len)
                    for variant in ("graphspec", "reduce", "fixup"):
                        residual.zero_()
                        chain(variant)
                        if variant == "graphspec":
                            got = graphspec_attention.attention(q[layers - 1, :t].transpose(0, 1)[None], cache6, layers - 1,
                                                                slot_ids, start_pos, d**-0.5, **config)[0]  # fmt: skip
                        else:
                            got = outs[layers - 1]
                        diff = (got.float() - want).abs().max().item()
                        timed = common.time_fn(lambda: chain(variant), device, reps=reps, warmup=min(3, reps))
                        us = timed["ms"] * 1e3 / layers
                        mode = "" if timed.get("mode") == "cuda_graph" else f" [{timed.get('mode')}]"
                        line.append(f"{variant} {us:6.2f}{mode} (diff {diff:.0e})")
                    print(f"{model} T={t} keys={kv_len:5d}/{capacity} splits={splits}: " + "; ".join(line), flush=True)
            if device == "cuda":
                torch.cuda.empty_cache()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--check-cpu", action="store_true")
    parser.add_argument("--dry-cpu", action="store_true", help="main's chains at tiny shapes (interpreter)")
    args = parser.parse_args()
    if args.check_cpu:
        check_cpu()
    elif args.dry_cpu:
        main("cpu", {"tiny": (4, 2, 32, 64, 2)}, ((128, (40, 100)),), torch.float32, block_n=16, reps=1)
    else:
        main()
