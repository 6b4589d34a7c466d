# ruff: noqa  (the script as run, kept with its results)
"""Probe: what folding each rms_norm into the next projection buys a B = 1 decode layer chain (issue 16).

rms_norm(h) @ W.T = r(h) * (h @ (W * g).T) with r(h) = rsqrt(mean(h^2) + eps): the norm's weight g can live in
the projection's weight, and the row scale r in the kernel that consumes the projection (attention for qkv,
silu_mul for gate_up), each of which reads h's row again to compute it. The residual add then needs no kernel of
its own: cuBLAS adds the o and down projections into the residual in place (addmm_, beta = 1). A layer drops
from 8 launches to 6:
    base  add_norm -> qkv -> attention -> o -> add_norm -> gate_up -> silu_mul -> down
    fold           qkv -> attention(r) -> o += -> gate_up -> silu_mul(r) -> down +=
32 Llama-3.1-8B-shaped layers in one CUDA graph, stand-in Triton kernels (attention over a 512-key cache, one
program per q head), cuBLAS projections, no workspace; ms per chain, interleaved rounds in one process. The
fold's output differs from base's by rounding only (the folded weights and the unrounded residual sums).

    python docs/results/2026-11-29-fold-norm/probe.py
"""

from __future__ import annotations

import os

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":0:0")

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

H, QKV, I, KV_HEADS, HEADS, D, CTX, LAYERS = 4096, 6144, 14336, 8, 32, 128, 512, 32
DEVICE = os.environ.get("PROBE_DEVICE", "cuda")  # cpu: TRITON_INTERPRET=1, a check of the arithmetic only


@triton.jit
def row_scale(h_ptr, N: tl.constexpr):
    """rsqrt(mean(h^2) + eps) of the hidden row h [N]."""
    h = tl.load(h_ptr + tl.arange(0, N)).to(tl.float32)
    return tl.rsqrt(tl.sum(h * h) / N + 1e-5)


@triton.jit
def add_norm_kernel(x_ptr, res_ptr, w_ptr, out_ptr, total_ptr, N: tl.constexpr):
    cols = tl.arange(0, N)
    total = tl.load(x_ptr + cols).to(tl.float32) + tl.load(res_ptr + cols).to(tl.float32)
    total = total.to(tl.bfloat16).to(tl.float32)
    tl.store(total_ptr + cols, total.to(tl.bfloat16))
    r = tl.rsqrt(tl.sum(total * total) / N + 1e-5)
    tl.store(out_ptr + cols, (total * r * tl.load(w_ptr + cols).to(tl.float32)).to(tl.bfloat16))


@triton.jit
def silu_mul_kernel(gu_ptr, h_ptr, out_ptr, N: tl.constexpr, H: tl.constexpr, BLOCK: tl.constexpr,
                    SCALE: tl.constexpr):  # fmt: skip
    cols = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    g = tl.load(gu_ptr + cols).to(tl.float32)
    u = tl.load(gu_ptr + N + cols).to(tl.float32)
    if SCALE:
        r = row_scale(h_ptr, H)
        g, u = g * r, u * r
    tl.store(out_ptr + cols, (g / (1 + tl.exp(-g)) * u).to(tl.bfloat16))


@triton.jit
def attention_kernel(qkv_ptr, h_ptr, k_ptr, v_ptr, out_ptr, CTX: tl.constexpr, D: tl.constexpr, GROUP: tl.constexpr,
                     H: tl.constexpr, BLOCK: tl.constexpr, SCALE: tl.constexpr):  # fmt: skip
    head = tl.program_id(0)
    kv = head // GROUP
    dims = tl.arange(0, D)
    q = tl.load(qkv_ptr + head * D + dims).to(tl.float32)
    if SCALE:
        q = q * row_scale(h_ptr, H)
    m = tl.full([], -1.0e30, tl.float32)
    l = tl.zeros([], tl.float32)
    acc = tl.zeros([D], tl.float32)
    for start in range(0, CTX, BLOCK):
        keys = start + tl.arange(0, BLOCK)
        k = tl.load(k_ptr + kv * CTX * D + keys[:, None] * D + dims[None, :]).to(tl.float32)
        v = tl.load(v_ptr + kv * CTX * D + keys[:, None] * D + dims[None, :]).to(tl.float32)
        s = tl.sum(k * q[None, :], axis=1) * 0.088
        m_new = tl.maximum(m, tl.max(s, axis=0))
        p = tl.exp(s - m_new)
        alpha = tl.exp(m - m_new)
        l = l * alpha + tl.sum(p, axis=0)
        acc = acc * alpha + tl.sum(v * p[:, None], axis=0)
        m = m_new
    tl.store(out_ptr + head * D + dims, (acc / l).to(tl.bfloat16))


class Chain:
    def __init__(self, layers):
        g = torch.Generator(device=DEVICE).manual_seed(0)

        def rand(*shape, scale):
            return (torch.randn(*shape, device=DEVICE, generator=g) * scale).to(torch.bfloat16)

        self.layers = []
        for _ in range(layers):
            L = dict(
                n1=rand(H, scale=0.1) + 1,
                n2=rand(H, scale=0.1) + 1,
                qkv=rand(QKV, H, scale=H**-0.5),
                o=rand(H, H, scale=H**-0.5 / 4),
                gu=rand(2 * I, H, scale=H**-0.5),
                down=rand(H, I, scale=I**-0.5 / 4),
                k=rand(KV_HEADS, CTX, D, scale=1.0),
                v=rand(KV_HEADS, CTX, D, scale=1.0),
            )  # fmt: skip
            L["qkv_folded"] = (L["qkv"].float() * L["n1"].float()[None, :]).to(torch.bfloat16)
            L["gu_folded"] = (L["gu"].float() * L["n2"].float()[None, :]).to(torch.bfloat16)
            self.layers.append(L)
        self.h0 = rand(H, scale=1.0)

    def attention(self, qkv, h, L, scale):
        a = torch.empty(H, dtype=qkv.dtype, device=qkv.device)
        attention_kernel[(HEADS,)](qkv, h, L["k"], L["v"], a, CTX=CTX, D=D, GROUP=HEADS // KV_HEADS, H=H, BLOCK=64,
                                   SCALE=scale, num_warps=4)  # fmt: skip
        return a

    def silu_mul(self, gu, h, scale):
        s = torch.empty(I, dtype=gu.dtype, device=gu.device)
        silu_mul_kernel[(I // 1024,)](gu, h, s, N=I, H=H, BLOCK=1024, SCALE=scale, num_warps=4)
        return s

    def base(self):
        d, res = torch.zeros_like(self.h0), self.h0.clone()
        for L in self.layers:
            x, res2 = torch.empty_like(d), torch.empty_like(d)
            add_norm_kernel[(1,)](d, res, L["n1"], x, res2, N=H, num_warps=4)
            a = self.attention(F.linear(x[None], L["qkv"])[0], x, L, False)
            o = F.linear(a[None], L["o"])[0]
            x2, res = torch.empty_like(d), torch.empty_like(d)
            add_norm_kernel[(1,)](o, res2, L["n2"], x2, res, N=H, num_warps=4)
            s = self.silu_mul(F.linear(x2[None], L["gu"])[0], x2, False)
            d = F.linear(s[None], L["down"])[0]
        return res + d

    def fold(self):
        h = self.h0.clone()[None]  # the residual row, updated in place by the o and down projections
        for L in self.layers:
            a = self.attention(F.linear(h, L["qkv_folded"])[0], h, L, True)
            h.addmm_(a[None], L["o"].t())
            s = self.silu_mul(F.linear(h, L["gu_folded"])[0], h, True)
            h.addmm_(s[None], L["down"].t())
        return h[0]


def capture(fn):
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
    return graph, out


def main():
    print(torch.cuda.get_device_name(), torch.__version__, triton.__version__, flush=True)
    chain = Chain(LAYERS)
    graphs = {name: capture(getattr(chain, name)) for name in ("base", "fold")}
    kernels = {}
    for name, (graph, _) in graphs.items():
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            graph.replay()
            torch.cuda.synchronize()
        kernels[name] = sum(e.count for e in prof.key_averages() if e.device_type.name == "CUDA")
    times = {name: [] for name in graphs}
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(7):  # interleaved rounds
        for name, (graph, _) in graphs.items():
            torch.cuda.synchronize()
            start.record()
            for _ in range(50):
                graph.replay()
            end.record()
            torch.cuda.synchronize()
            times[name].append(start.elapsed_time(end) / 50)
    base_out = graphs["base"][1].float()
    print(
        "\n| variant | kernels per chain | ms per 32 layers (median of 7 rounds x 50 replays) | min | vs base | output vs base |"
    )
    print("| --- | ---: | ---: | ---: | ---: | --- |")
    b = sorted(times["base"])[3]
    for name, (_, out) in graphs.items():
        ts = sorted(times[name])
        rel = ((out.float() - base_out).norm() / base_out.norm()).item()
        print(f"| {name} | {kernels[name]} | {ts[3]:.4f} | {ts[0]:.4f} | {ts[3] / b:.3f} | relative L2 {rel:.2e} |")


if __name__ == "__main__":
    main()
