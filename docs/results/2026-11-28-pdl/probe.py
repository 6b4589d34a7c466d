# ruff: noqa  (the script as run, kept with its results)
"""Probe: what programmatic dependent launch (PDL) and a weight-prefetching GEMV buy a decode layer chain.

A B = 1 decode of 32 Llama-3.1-8B-shaped layers, captured in one CUDA graph, with stand-in kernels for
graphspec's own (norm, attention over a 512-key cache, add+norm, silu*mul) and cuBLAS for the projections:
    add_norm -> qkv (cuBLAS) -> attention -> o -> add_norm -> gate_up (cuBLAS) -> silu_mul -> down (cuBLAS)
Variants (ms per 32-layer chain, one process, interleaved rounds):
    base          no PDL
    pdl           the Triton kernels launched with PDL; each waits (griddepcontrol.wait) before reading
                  anything an earlier kernel wrote (its weights are loaded before the wait)
    pdl_trigger   pdl, and each Triton kernel lets its dependents launch right after its wait
    gemv_o        base, o projection by a Triton GEMV instead of cuBLAS
    pdl_gemv_o    pdl_trigger, o by the GEMV launched with PDL, which prefetches its weight rows into L2
                  before its wait (the attention before it runs while o's weights stream in)
Every variant's output is compared with base's (bitwise for the PDL variants, which change no arithmetic).

    python docs/results/2026-11-28-pdl/probe.py
"""

from __future__ import annotations

import os

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":0:0")

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

H, QKV, I, KV_HEADS, HEADS, D, CTX, LAYERS = 4096, 6144, 14336, 8, 32, 128, 512, 32


@triton.jit
def wait_inputs(PDL: tl.constexpr, TRIGGER: tl.constexpr):
    if PDL:
        tl.extra.cuda.gdc_wait()
    if TRIGGER:
        tl.extra.cuda.gdc_launch_dependents()


@triton.jit
def add_norm_kernel(
    x_ptr, res_ptr, w_ptr, out_ptr, total_ptr, N: tl.constexpr, PDL: tl.constexpr, TRIGGER: tl.constexpr
):
    cols = tl.arange(0, N)
    w = tl.load(w_ptr + cols).to(tl.float32)
    wait_inputs(PDL, TRIGGER)
    total = tl.load(x_ptr + cols).to(tl.float32) + tl.load(res_ptr + cols).to(tl.float32)
    total = total.to(tl.bfloat16).to(tl.float32)
    tl.store(total_ptr + cols, total.to(tl.bfloat16))
    r = tl.rsqrt(tl.sum(total * total) / N + 1e-6)
    tl.store(out_ptr + cols, (total * r * w).to(tl.bfloat16))


@triton.jit
def silu_mul_kernel(gu_ptr, out_ptr, N: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr, TRIGGER: tl.constexpr):
    cols = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    wait_inputs(PDL, TRIGGER)
    g = tl.load(gu_ptr + cols).to(tl.float32)
    u = tl.load(gu_ptr + N + cols).to(tl.float32)
    tl.store(out_ptr + cols, (g / (1 + tl.exp(-g)) * u).to(tl.bfloat16))


@triton.jit
def attention_kernel(qkv_ptr, k_ptr, v_ptr, out_ptr, CTX: tl.constexpr, D: tl.constexpr, GROUP: tl.constexpr,
                     PDL: tl.constexpr, TRIGGER: tl.constexpr):  # fmt: skip
    head = tl.program_id(0)
    kv = head // GROUP
    keys = tl.arange(0, CTX)
    dims = tl.arange(0, D)
    # The cache's keys and values: written by earlier steps, never by the kernels of this one.
    k = tl.load(k_ptr + kv * CTX * D + keys[:, None] * D + dims[None, :]).to(tl.float32)
    v = tl.load(v_ptr + kv * CTX * D + keys[:, None] * D + dims[None, :]).to(tl.float32)
    wait_inputs(PDL, TRIGGER)
    q = tl.load(qkv_ptr + head * D + dims).to(tl.float32)
    s = tl.sum(k * q[None, :], axis=1) * 0.088
    p = tl.exp(s - tl.max(s, axis=0))
    o = tl.sum(v * p[:, None], axis=0) / tl.sum(p, axis=0)
    tl.store(out_ptr + head * D + dims, o.to(tl.bfloat16))


@triton.jit
def gemv_kernel(x_ptr, w_ptr, y_ptr, K: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                PDL: tl.constexpr, PREFETCH: tl.constexpr, TRIGGER: tl.constexpr):  # fmt: skip
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    if PREFETCH:  # one prefetch per 128-byte line of this program's rows of W
        lines = tl.arange(0, K // 64)
        ptrs = w_ptr + rows[:, None] * K + lines[None, :] * 64
        tl.inline_asm_elementwise(
            "prefetch.global.L2 [$1]; mov.u32 $0, 0;", "=r,l", [ptrs], dtype=tl.int32, is_pure=False, pack=1
        )
    wait_inputs(PDL, TRIGGER)
    acc = tl.zeros([BLOCK_N, BLOCK_K], tl.float32)
    for k in range(0, K, BLOCK_K):
        cols = k + tl.arange(0, BLOCK_K)
        w = tl.load(w_ptr + rows[:, None] * K + cols[None, :])
        x = tl.load(x_ptr + cols)
        acc += w.to(tl.float32) * x.to(tl.float32)[None, :]
    tl.store(y_ptr + rows, tl.sum(acc, axis=1).to(tl.bfloat16))


def gemv(x, w, pdl, prefetch, trigger, block_n=16, block_k=512, warps=4):
    y = torch.empty(w.shape[0], dtype=x.dtype, device=x.device)
    gemv_kernel[(w.shape[0] // block_n,)](
        x, w, y, K=w.shape[1], BLOCK_N=block_n, BLOCK_K=block_k, PDL=pdl, PREFETCH=prefetch, TRIGGER=trigger,
        num_warps=warps, launch_pdl=pdl,
    )  # fmt: skip
    return y


class Chain:
    def __init__(self, layers):
        g = torch.Generator(device="cuda").manual_seed(0)

        def rand(*shape, scale):
            return (torch.randn(*shape, device="cuda", generator=g) * scale).to(torch.bfloat16)

        self.layers = [
            dict(
                n1=rand(H, scale=1.0) + 1,
                n2=rand(H, scale=1.0) + 1,
                qkv=rand(QKV, H, scale=H**-0.5),
                o=rand(H, H, scale=H**-0.5),
                gu=rand(2 * I, H, scale=H**-0.5),
                down=rand(H, I, scale=I**-0.5),
                k=rand(KV_HEADS, CTX, D, scale=1.0),
                v=rand(KV_HEADS, CTX, D, scale=1.0),
            )  # fmt: skip
            for _ in range(layers)
        ]
        self.h0 = rand(H, scale=1.0)
        self.d0 = rand(H, scale=1.0)

    def run(self, pdl, trigger, o_mode):
        kw = dict(PDL=pdl, TRIGGER=trigger, launch_pdl=pdl)
        d, res = self.d0, self.h0
        for L in self.layers:
            x, res2 = torch.empty_like(d), torch.empty_like(d)
            add_norm_kernel[(1,)](d, res, L["n1"], x, res2, N=H, num_warps=4, **kw)
            qkv = F.linear(x[None], L["qkv"])[0]
            a = torch.empty(H, dtype=d.dtype, device=d.device)
            attention_kernel[(HEADS,)](qkv, L["k"], L["v"], a, CTX=CTX, D=D, GROUP=HEADS // KV_HEADS, num_warps=4, **kw)
            if o_mode == "cublas":
                o = F.linear(a[None], L["o"])[0]
            else:
                o = gemv(a, L["o"], pdl=pdl, prefetch=o_mode == "gemv_prefetch", trigger=trigger)
            x2, res = torch.empty_like(d), torch.empty_like(d)
            add_norm_kernel[(1,)](o, res2, L["n2"], x2, res, N=H, num_warps=4, **kw)
            gu = F.linear(x2[None], L["gu"])[0]
            s = torch.empty(I, dtype=d.dtype, device=d.device)
            silu_mul_kernel[(I // 1024,)](gu, s, N=I, BLOCK=1024, num_warps=4, **kw)
            d = F.linear(s[None], L["down"])[0]
        return d


def time_graph(fn, replays=50):
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / replays, out.clone(), graph


def main():
    print(torch.cuda.get_device_name(), torch.__version__, triton.__version__, flush=True)
    chain = Chain(LAYERS)
    variants = {
        "base": dict(pdl=False, trigger=False, o_mode="cublas"),
        "pdl": dict(pdl=True, trigger=False, o_mode="cublas"),
        "pdl_trigger": dict(pdl=True, trigger=True, o_mode="cublas"),
        "gemv_o": dict(pdl=False, trigger=False, o_mode="gemv"),
        "pdl_gemv_o": dict(pdl=True, trigger=True, o_mode="gemv"),
        "pdl_gemv_o_prefetch": dict(pdl=True, trigger=True, o_mode="gemv_prefetch"),
    }
    graphs, outputs, times = {}, {}, {name: [] for name in variants}
    for name, kw in variants.items():
        try:
            t, out, graph = time_graph(lambda kw=kw: chain.run(**kw))
        except Exception as error:  # noqa: BLE001 - a probe reports what failed and goes on
            print(f"{name}: FAILED {type(error).__name__}: {error}", flush=True)
            continue
        graphs[name], outputs[name] = graph, out
        print(f"{name}: first timing {t:.4f} ms", flush=True)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(5):  # interleaved rounds
        for name, graph in graphs.items():
            torch.cuda.synchronize()
            start.record()
            for _ in range(50):
                graph.replay()
            end.record()
            torch.cuda.synchronize()
            times[name].append(start.elapsed_time(end) / 50)
    base = outputs.get("base")
    print("\n| variant | ms per 32 layers (median of 5 rounds x 50 replays) | min | vs base | output vs base |")
    print("| --- | ---: | ---: | ---: | --- |")
    b = sorted(times["base"])[2] if times["base"] else float("nan")
    for name in graphs:
        ts = sorted(times[name])
        diff = (outputs[name].float() - base.float()).abs().max().item() if base is not None else float("nan")
        same = "bitwise" if torch.equal(outputs[name], base) else f"max diff {diff:.3g}"
        print(f"| {name} | {ts[2]:.4f} | {ts[0]:.4f} | {ts[2] / b:.3f} | {same} |")
    # The GEMV alone against cuBLAS (o projection, M = 1), rotated over the 32 layers' weights.
    a = torch.randn(H, device="cuda").to(torch.bfloat16)
    for label, fn in [
        ("cuBLAS o, 32 calls", lambda: [F.linear(a[None], L["o"]) for L in chain.layers][-1]),
        ("GEMV o, 32 calls", lambda: [gemv(a, L["o"], False, False, False) for L in chain.layers][-1]),
        ("GEMV o bn32, 32 calls", lambda: [gemv(a, L["o"], False, False, False, block_n=32) for L in chain.layers][-1]),
        (
            "GEMV o bk1024 w8, 32 calls",
            lambda: [gemv(a, L["o"], False, False, False, block_k=1024, warps=8) for L in chain.layers][-1],
        ),
    ]:
        t, _, _ = time_graph(fn)
        print(f"{label}: {t * 1000 / 32:.2f} us per call")


if __name__ == "__main__":
    main()
