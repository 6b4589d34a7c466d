# ruff: noqa  (a probe, prepared for the next device call)
"""Probe (issue 16, prepared 2026-11-30, not yet run on a GPU): the sampling candidates (each stat row's 128 largest
logits) by Triton sorts instead of torch.topk.

torch.topk's radix select is ~40 launches a call whatever the rows (201 us of the H200 sampling step's 8.10 ms at
batch 1, docs/results/2026-11-30-one-topk), and the draft's four one-row draws each make a call on the draft chain's
critical path (36.5 us a call for one row, docs/results/2026-11-30-topk). Here:
  level 1: one program per (row, chunk of CHUNK logits): order keys (NaN as the largest, as torch.topk ranks it)
    packed with the index, (key << 32) | index, sorted descending (tl.sort), the first CAP kept: [R, chunks, CAP];
  then merges: one program per (row, GROUP lists): their GROUP x CAP packed values sorted, the first CAP kept, until
    one list is left; the last writes the values (the key's float, in the logits' dtype) and the indices.
Any top-CAP set serves kernels/candidates.py (its checks hold for whichever of tied logits are kept).

    TRITON_INTERPRET=1 python docs/results/2026-11-30-triton-topk-probe/probe.py --check   # CPU: vs torch.topk
    python docs/results/2026-11-30-triton-topk-probe/probe.py                            # GPU: us per call, a table
"""

from __future__ import annotations

import argparse
import sys

import torch
import triton
import triton.language as tl

NO_ENTRY = tl.constexpr(-(2**63))  # below every packed (key, index): padding lanes sort last
CAP = 128


@triton.jit
def first_lists(packed, CAP: tl.constexpr):
    """The first CAP entries of a sorted 1-D tensor."""
    rows: tl.constexpr = packed.shape[0] // CAP
    table = tl.reshape(packed, [rows, CAP])
    return tl.sum(tl.where(tl.arange(0, rows)[:, None] == 0, table, 0), 0)


@triton.jit
def store_top(top, row, slot, lists_out, out_ptr, values_ptr, index_ptr, CAP: tl.constexpr, LAST: tl.constexpr):
    lanes = tl.arange(0, CAP)
    if LAST:  # the values (exact: the keys came from fp32 of the logits' dtype) and the indices
        key = (top >> 32).to(tl.int32)
        value = (key ^ ((key >> 31) & 0x7FFFFFFF)).to(tl.float32, bitcast=True)
        tl.store(values_ptr + row.to(tl.int64) * CAP + lanes, value.to(values_ptr.dtype.element_ty))
        tl.store(index_ptr + row.to(tl.int64) * CAP + lanes, top & 0xFFFFFFFF)
    else:
        tl.store(out_ptr + (row.to(tl.int64) * lists_out + slot) * CAP + lanes, top)


@triton.jit
def chunk_top_kernel(logits_ptr, out_ptr, values_ptr, index_ptr, vocab, stride_row, lists_out,
                     CHUNK: tl.constexpr, CAP: tl.constexpr, LAST: tl.constexpr):  # fmt: skip
    row = tl.program_id(0)
    chunk = tl.program_id(1)
    offs = chunk * CHUNK + tl.arange(0, CHUNK)
    ok = offs < vocab
    x = tl.load(logits_ptr + row.to(tl.int64) * stride_row + offs, mask=ok, other=0.0).to(tl.float32)
    bits = x.to(tl.int32, bitcast=True)
    key = tl.where(x != x, 2147483647, bits ^ ((bits >> 31) & 0x7FFFFFFF))  # NaN ranks first, as in torch.topk
    packed = tl.where(ok, (key.to(tl.int64) << 32) | offs.to(tl.int64), NO_ENTRY)
    top = first_lists(tl.sort(packed, 0, descending=True), CAP)
    store_top(top, row, chunk, lists_out, out_ptr, values_ptr, index_ptr, CAP, LAST)


@triton.jit
def merge_top_kernel(in_ptr, out_ptr, values_ptr, index_ptr, lists_in, lists_out,
                     GROUP: tl.constexpr, CAP: tl.constexpr, LAST: tl.constexpr):  # fmt: skip
    row = tl.program_id(0)
    slot = tl.program_id(1)
    lists = slot * GROUP + tl.arange(0, GROUP)
    lanes = tl.arange(0, CAP)
    ptrs = in_ptr + (row.to(tl.int64) * lists_in + lists[:, None]) * CAP + lanes[None, :]
    packed = tl.load(ptrs, mask=(lists < lists_in)[:, None], other=NO_ENTRY)
    top = first_lists(tl.sort(tl.reshape(packed, [GROUP * CAP]), 0, descending=True), CAP)
    store_top(top, row, slot, lists_out, out_ptr, values_ptr, index_ptr, CAP, LAST)


def triton_topk(logits: torch.Tensor, chunk: int = 1024, group: int = 8, warps: int = 4, merge_warps: int = 4):
    """(values [R, CAP] in logits' dtype, indices [R, CAP] int64) of logits [R, V] (unit stride along V)."""
    rows, vocab = logits.shape
    values = torch.empty((rows, CAP), dtype=logits.dtype, device=logits.device)
    index = torch.empty((rows, CAP), dtype=torch.int64, device=logits.device)
    lists = triton.cdiv(vocab, chunk)
    buffer = torch.empty((rows, lists, CAP), dtype=torch.int64, device=logits.device)
    chunk_top_kernel[(rows, lists)](
        logits, buffer, values, index, vocab, logits.stride(0), lists, CHUNK=chunk, CAP=CAP, LAST=lists == 1,
        num_warps=warps,
    )  # fmt: skip
    while lists > 1:
        out_lists = triton.cdiv(lists, group)
        out = torch.empty((rows, out_lists, CAP), dtype=torch.int64, device=logits.device)
        merge_top_kernel[(rows, out_lists)](
            buffer, out, values, index, lists, out_lists, GROUP=group, CAP=CAP, LAST=out_lists == 1,
            num_warps=merge_warps,
        )  # fmt: skip
        buffer, lists = out, out_lists
    return values, index


def same_selection(logits, values, index, ref_values) -> bool:
    """A valid top-CAP of each row: the values sorted equal torch.topk's (NaN as NaN), each index holds its value,
    no index twice."""
    got = values.float().sort(-1, descending=True).values
    want = ref_values.float().sort(-1, descending=True).values
    equal = (got == want) | (got.isnan() & want.isnan())
    at = logits.gather(-1, index).float()
    held = (at == values.float()) | (at.isnan() & values.float().isnan())
    unique = all(len(set(r.tolist())) == CAP for r in index)
    return bool(equal.all()) and bool(held.all()) and unique


def check() -> None:
    """CPU (interpreter): against torch.topk on rows with ties, signed zeros, infinities and NaN, at a vocab that
    takes two merge levels (chunk 64, group 4: 40 lists -> 10 -> 3 -> 1) and one that takes none."""
    g = torch.Generator().manual_seed(0)
    for vocab, chunk, group in ((2500, 256, 4), (2500, 128, 4), (200, 256, 4)):
        logits = (torch.randn(6, vocab, generator=g) * 3).bfloat16()  # bf16: many ties
        logits[1, :300] = 7.0  # a tie across the cut
        logits[2, torch.randperm(vocab, generator=g)[:5]] = float("inf")
        logits[3, 10] = float("nan")
        logits[4] = -logits[4].abs()
        logits[4, :40] = 0.0
        logits[4, 40:80] = -0.0
        logits[5] = float("-inf")
        values, index = triton_topk(logits, chunk=chunk, group=group)
        ref = torch.topk(logits, CAP, dim=-1).values
        ok = same_selection(logits, values, index, ref)
        print(f"vocab {vocab} chunk {chunk} group {group}:", "ok" if ok else "WRONG")


def main() -> None:
    sys.path.insert(0, "benchmarks")
    import common

    print(torch.cuda.get_device_name(), torch.__version__, triton.__version__, flush=True)
    variants = [(1024, 8, 4, 4), (1024, 16, 4, 8), (2048, 8, 4, 4), (2048, 16, 8, 8), (4096, 8, 8, 4), (512, 8, 4, 4)]
    print("| rows | torch.topk | " + " | ".join("chunk %d group %d w%d/%d" % v for v in variants) + " |")
    for rows in (1, 9, 36, 144):
        logits = torch.randn(rows, 128256, device="cuda").bfloat16()
        ref = torch.topk(logits, CAP, dim=-1, sorted=False).values

        def eight(fn):  # common.time_fn captures these 8 calls into one CUDA graph
            return lambda: [fn() for _ in range(8)]

        base = common.time_fn(eight(lambda: torch.topk(logits, CAP, dim=-1, sorted=False)), "cuda", reps=30)
        cells = []
        for chunk, group, warps, merge_warps in variants:
            try:
                run = lambda: triton_topk(logits, chunk, group, warps, merge_warps)
                values, index = run()
                ok = same_selection(logits, values, index, ref)
                us = common.time_fn(eight(run), "cuda", reps=30)["ms"] * 1e3 / 8
                cells.append(f"{us:.1f}" + ("" if ok else " WRONG"))
            except Exception as error:
                cells.append(type(error).__name__)
        print(f"| {rows} | {base['ms'] * 1e3 / 8:.1f} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--check", action="store_true")
    check() if parser.parse_args().check else main()
