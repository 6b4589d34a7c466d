# ruff: noqa  (a probe, prepared for the next device call)
"""Probe (issue 16, prepared 2026-11-30, not yet run on a GPU): decode/verify attention whose warps each own whole key
sub-blocks, against graphspec's kernel.

graphspec's attention_kernel (4 warps) splits every 64-key block across its warps: in its sm_90 build (specialized as
the step launches it) each pass of the key loop has 7 BAR.SYNC (cp.async stages, the cross-warp row max and row sum,
P's layout for the second dot), and at batch 1 a long cache runs at ~62% of the copy rate (8B, 16000 keys: 23.4 us a
launch for 65.5 MB; docs/results/2026-11-30-long-context-splits). Here each program's tiles carry a warp axis W:
every step loads W sub-blocks of SUB_N keys, and batched dots give each warp its own scores, running max, sum and
accumulator ([W, M, ...]); the W states are combined once, after the loop. Same partials and the same reduce
(graphspec's attention_reduce_kernel, reduce_launch's chunk), same splits; no rotary and no row scale here, so it is
compared against graphspec's kernel without them (attention.attention, rotary=None).

    python docs/results/2026-11-30-attention-warp-blocks/probe.py          # on a GPU: us per launch, a table
    TRITON_INTERPRET=1 python docs/results/2026-11-30-attention-warp-blocks/probe.py --check   # CPU: vs the reference
"""

from __future__ import annotations

import argparse
import sys

import torch
import triton
import triton.language as tl

sys.path.insert(0, "benchmarks")
from graphspec.kernels import attention as kernel  # noqa: E402
from graphspec.kernels.common import cdiv, next_power_of_2, sm_count  # noqa: E402

LOG2E = 1.4426950408889634


@triton.jit(do_not_specialize=["layer"])
def warp_blocks_kernel(
    q_ptr, cache_ptr, slot_ids_ptr, start_pos_ptr, part_out_ptr, part_lse_ptr, layer, qk_scale, seq_capacity,
    num_kv_heads, num_splits, stride_qb, stride_qh, stride_qt, stride_qd, stride_cl, stride_ckind, stride_cslot,
    stride_ch, stride_cs, stride_cd,
    T: tl.constexpr, GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, W: tl.constexpr,
    SUB_N: tl.constexpr,
    PRECISION: tl.constexpr,
    UPCAST: tl.constexpr,  # the interpreter's bf16 dot is wrong (kernels/attention.py's HACK): fp32 operands there
):  # fmt: skip
    split = tl.program_id(0)
    row_head = tl.program_id(1)
    b = row_head // num_kv_heads
    kv_head = row_head % num_kv_heads
    slot = tl.load(slot_ids_ptr + b).to(tl.int64)
    start = tl.load(start_pos_ptr + b).to(tl.int32)
    rows = tl.arange(0, BLOCK_M)
    row_ok = rows < GROUP * T
    head = kv_head * GROUP + rows // T
    token = rows % T
    out_rows = (b.to(tl.int64) * T + token) * (num_kv_heads * GROUP) + head
    query_pos = start + token
    dims = tl.arange(0, HEAD_DIM)
    q_rows = b.to(tl.int64) * stride_qb + head.to(tl.int64) * stride_qh + token.to(tl.int64) * stride_qt
    q = tl.load(q_ptr + q_rows[:, None] + dims[None, :] * stride_qd, mask=row_ok[:, None], other=0.0)
    kv_len = tl.minimum(start + T, seq_capacity)
    step: tl.constexpr = W * SUB_N
    chunk = tl.cdiv(tl.cdiv(kv_len, num_splits), step) * step
    lo = split * chunk
    hi = tl.minimum(lo + chunk, kv_len)
    if lo >= kv_len:
        kernel.store_partial(part_out_ptr, part_lse_ptr, out_rows, num_splits, split,
                             tl.zeros([BLOCK_M, HEAD_DIM], tl.float32), tl.full([BLOCK_M], float("-inf"), tl.float32),
                             dims, row_ok)  # fmt: skip
        return
    key_base = cache_ptr + layer.to(tl.int64) * stride_cl + slot * stride_cslot + kv_head.to(tl.int64) * stride_ch
    value_base = key_base + stride_ckind
    q3 = tl.broadcast_to(q[None, :, :], [W, BLOCK_M, HEAD_DIM])
    if UPCAST:
        q3 = q3.to(tl.float32)
    warps = tl.arange(0, W)
    offs = tl.arange(0, SUB_N)
    m_i = tl.full([W, BLOCK_M], -1.0e30, tl.float32)
    l_i = tl.zeros([W, BLOCK_M], tl.float32)
    acc = tl.zeros([W, BLOCK_M, HEAD_DIM], tl.float32)
    for block_start in range(lo, hi, step):
        pos = block_start + warps[:, None] * SUB_N + offs[None, :]  # [W, SUB_N]
        in_range = pos < hi
        offsets = pos[:, :, None] * stride_cs + dims[None, None, :] * stride_cd  # [W, SUB_N, D]
        k = tl.load(key_base + offsets, mask=in_range[:, :, None], other=0.0)
        if UPCAST:
            k = k.to(tl.float32)
        scores = tl.dot(q3, tl.permute(k, (0, 2, 1)), input_precision=PRECISION) * qk_scale  # [W, M, SUB_N]
        visible = (pos[:, None, :] <= query_pos[None, :, None]) & in_range[:, None, :]
        scores = tl.where(visible, scores, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(scores, 2))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(scores - m_new[:, :, None])
        l_i = l_i * alpha + tl.sum(p, 2)
        v = tl.load(value_base + offsets, mask=in_range[:, :, None], other=0.0)
        if UPCAST:  # P rounded to the cache's dtype all the same, as graphspec's kernel does
            p = p.to(cache_ptr.dtype.element_ty).to(tl.float32)
            v = v.to(tl.float32)
        else:
            p = p.to(v.dtype)
        acc = acc * alpha[:, :, None] + tl.dot(p, v, input_precision=PRECISION)  # [W, M, D]
        m_i = m_new
    # The W warps' states, combined once.
    top = tl.max(m_i, 0)  # [M]
    weight = tl.exp2(m_i - top[None, :])  # [W, M]
    total = tl.sum(l_i * weight, 0)
    out = tl.sum(acc * weight[:, :, None], 0)
    has_keys = total > 0
    norm = tl.where(has_keys, total, 1.0)
    lse = tl.where(has_keys, top + tl.log2(norm), float("-inf"))
    kernel.store_partial(
        part_out_ptr, part_lse_ptr, out_rows, num_splits, split, out / norm[:, None], lse, dims, row_ok
    )


def warp_blocks_attention(q, cache, layer, slot_ids, start_pos, scale, warps=4, sub_n=16, programs_per_sm=2, stages=3):
    batch, q_heads, t, head_dim = q.shape
    kv_heads, seq_capacity = cache.shape[3], cache.shape[4]
    group = q_heads // kv_heads
    block_m = max(16, next_power_of_2(group * t))
    splits = kernel.num_splits(batch, kv_heads, 1, seq_capacity, warps * sub_n, programs_per_sm, sm_count(q.device))
    upcast = q.device.type != "cuda"
    out = torch.empty((batch, t, q_heads, head_dim), dtype=q.dtype, device=q.device)
    part_out = torch.empty((batch, t, q_heads, splits, head_dim), dtype=torch.float32, device=q.device)
    part_lse = torch.empty((batch, t, q_heads, splits), dtype=torch.float32, device=q.device)
    warp_blocks_kernel[(splits, batch * kv_heads)](
        q, cache, slot_ids, start_pos, part_out, part_lse, layer, scale * LOG2E, seq_capacity, kv_heads, splits,
        *q.stride(), *cache.stride(), T=t, GROUP=group, HEAD_DIM=head_dim, BLOCK_M=block_m, W=warps, SUB_N=sub_n,
        PRECISION="ieee" if upcast else "tf32", UPCAST=upcast, num_warps=warps, num_stages=stages,
    )  # fmt: skip
    chunk, reduce_warps = kernel.reduce_launch(splits, head_dim, fixed_splits=False)
    kernel.attention_reduce_kernel[(batch * q_heads * t,)](
        part_out, part_lse, out, splits, HEAD_DIM=head_dim, BLOCK_SPLITS=next_power_of_2(splits), CHUNK=chunk,
        num_warps=reduce_warps,
    )  # fmt: skip
    return out


HEADS = {"8B": (32, 8, 128), "1B": (32, 8, 64)}
VARIANTS = [
    (4, 16, 2, 3),
    (4, 16, 2, 2),
    (4, 32, 2, 2),
    (2, 32, 2, 3),
    (4, 16, 4, 2),
    (8, 16, 2, 2),
]  # W/SUB_N/pps/stages
SHAPES = [
    (h, t, keys, cap) for h in ("8B", "1B") for t in (1, 5) for keys, cap in ((512, 1024), (4000, 8192), (16000, 32768))
]


def inputs(heads, t, length, capacity, device, rotate=4):
    q_heads, kv_heads, d = HEADS[heads]
    cache = torch.empty(1, 2, rotate, kv_heads, capacity, d, dtype=torch.bfloat16, device=device).normal_()
    q = torch.randn(1, q_heads, t, d, dtype=torch.bfloat16, device=device)
    slot_sets = [torch.tensor([i], device=device) for i in range(rotate)]
    start = torch.full((1,), length - t, device=device)
    return cache, q, slot_sets, start, d


def check() -> None:
    """CPU (interpreter): the probe kernel equals graphspec's reference at small shapes."""
    torch.manual_seed(0)
    for t, group, d, cap, length, (w, n, pps, st) in (
        (1, 4, 64, 256, 200, (4, 16, 8, 2)),
        (5, 4, 128, 512, 300, (2, 16, 4, 2)),
    ):
        cache = torch.randn(1, 2, 2, 2, cap, d).to(torch.bfloat16)
        q = torch.randn(1, 2 * group, t, d).to(torch.bfloat16)
        slots, start = torch.tensor([1]), torch.tensor([length - t])
        out = warp_blocks_attention(q, cache, 0, slots, start, d**-0.5, w, n, pps, st)
        ref = kernel.attention_reference(q.float(), cache.float(), 0, slots, start, d**-0.5)
        err = ((out.float() - ref).norm() / ref.norm()).item()
        print(f"T={t} D={d} keys={length}: relative error {err:.2e}", "ok" if err < 1e-2 else "WRONG")


def main() -> None:
    sys.path.insert(0, "benchmarks")
    import common

    print(torch.cuda.get_device_name(), torch.__version__, "variants W/SUB_N/programs_per_sm/stages", flush=True)
    config = kernel.CONFIGS[90]
    print("| heads | T | keys (cache) | graphspec | " + " | ".join("/".join(map(str, v)) for v in VARIANTS) + " |")
    for shape in SHAPES:
        cache, q, slot_sets, start, d = inputs(*shape, "cuda")
        ref = kernel.attention(q, cache, 0, slot_sets[0], start, d**-0.5, **config).float()
        base = (
            common.time_fn(
                lambda: [kernel.attention(q, cache, 0, s, start, d**-0.5, **config) for s in slot_sets], "cuda", reps=30
            )["ms"]
            * 1e3
            / len(slot_sets)
        )
        cells = []
        for w, n, pps, st in VARIANTS:
            try:
                run = lambda: [warp_blocks_attention(q, cache, 0, s, start, d**-0.5, w, n, pps, st) for s in slot_sets]
                us = common.time_fn(run, "cuda", reps=30)["ms"] * 1e3 / len(slot_sets)
                out = warp_blocks_attention(q, cache, 0, slot_sets[0], start, d**-0.5, w, n, pps, st).float()
                err = ((out - ref).norm() / ref.norm()).item()
                cells.append(f"{us:.1f}" + ("" if err < 1e-2 else " WRONG"))
            except Exception as error:
                cells.append(type(error).__name__)
        print(
            f"| {shape[0]} | {shape[1]} | {shape[2]} ({shape[3]}) | {base:.1f} | " + " | ".join(cells) + " |",
            flush=True,
        )
        del cache


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--check", action="store_true")
    check() if parser.parse_args().check else main()
