# ruff: noqa  (the script as run, kept with its results)
"""Prefill attention main-loop variants, one 4096-token chunk with no cached prefix, on an H200.

A probe (not the package's kernel): the chunk part of kernels/prefill_attention.py with three switches,
timed next to the package's op (which also writes the cache) and SDPA (cuDNN), per layer, CUDA graphs.
    TMA   the chunk's K/V loads through on-device tensor descriptors (the copy engine)
    WS    Triton's loop warp specialization over the unmasked key blocks (needs TMA on sm_90)
    FOLD  the scale folded into the exp2 argument (one FMA per score), as Triton's tutorial does

    python docs/results/2026-11-27-attn-probe/probe.py          # GPU: the table
    python docs/results/2026-11-27-attn-probe/probe.py --build  # CPU: build every variant for sm_90
"""

from __future__ import annotations

import itertools
import sys

import torch
import triton
import triton.language as tl


@triton.jit
def probe_kernel(
    q_ptr, k_ptr, v_ptr, out_ptr, qk_scale, q_heads, T,
    stride_qb, stride_qh, stride_qt, stride_kb, stride_kh, stride_kt, stride_vb, stride_vh, stride_vt,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    TMA: tl.constexpr, WS: tl.constexpr, FOLD: tl.constexpr,
):  # fmt: skip
    row_head = tl.program_id(0)
    m_block = tl.num_programs(1) - 1 - tl.program_id(1)
    b = row_head // q_heads
    head = row_head % q_heads
    kv_head = head // GROUP
    dims = tl.arange(0, HEAD_DIM)
    offs_n = tl.arange(0, BLOCK_N)
    tokens = m_block * BLOCK_M + tl.arange(0, BLOCK_M)
    q_rows = b.to(tl.int64) * stride_qb + head.to(tl.int64) * stride_qh + tokens.to(tl.int64) * stride_qt
    q = tl.load(q_ptr + q_rows[:, None] + dims[None, :], mask=(tokens < T)[:, None], other=0.0)
    k_base = k_ptr + b.to(tl.int64) * stride_kb + kv_head.to(tl.int64) * stride_kh
    v_base = v_ptr + b.to(tl.int64) * stride_vb + kv_head.to(tl.int64) * stride_vh
    if TMA:
        k_desc = tl.make_tensor_descriptor(k_base, [T, HEAD_DIM], [stride_kt, 1], [BLOCK_N, HEAD_DIM])
        v_desc = tl.make_tensor_descriptor(v_base, [T, HEAD_DIM], [stride_vt, 1], [BLOCK_N, HEAD_DIM])
    m_i = tl.full([BLOCK_M], -1.0e30, tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    block_first = m_block * BLOCK_M
    for start_n in tl.range(0, block_first, BLOCK_N, warp_specialize=WS):
        if TMA:
            k = k_desc.load([start_n, 0])
        else:
            k = tl.load(k_base + (start_n + offs_n).to(tl.int64)[:, None] * stride_kt + dims[None, :])
        qk = tl.dot(q, tl.trans(k))
        if FOLD:
            m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
            p = tl.math.exp2(qk * qk_scale - m_new[:, None])
        else:
            s = qk * qk_scale
            m_new = tl.maximum(m_i, tl.max(s, 1))
            p = tl.math.exp2(s - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        if TMA:
            v = v_desc.load([start_n, 0])
        else:
            v = tl.load(v_base + (start_n + offs_n).to(tl.int64)[:, None] * stride_vt + dims[None, :])
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
        m_i = m_new
    for start_n in range(block_first, tl.minimum(block_first + BLOCK_M, T), BLOCK_N):
        keys = start_n + offs_n
        in_range = keys < T
        k = tl.load(k_base + keys.to(tl.int64)[:, None] * stride_kt + dims[None, :], mask=in_range[:, None], other=0.0)
        v = tl.load(v_base + keys.to(tl.int64)[:, None] * stride_vt + dims[None, :], mask=in_range[:, None], other=0.0)
        s = tl.dot(q, tl.trans(k)) * qk_scale
        s = tl.where((keys[None, :] <= tokens[:, None]) & in_range[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.math.exp2(s - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
        m_i = m_new
    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    out_rows = (b.to(tl.int64) * T + tokens) * q_heads + head
    tl.store(out_ptr + out_rows[:, None] * HEAD_DIM + dims[None, :], out.to(out_ptr.dtype.element_ty),
             mask=(tokens < T)[:, None])  # fmt: skip


VARIANTS = [
    dict(TMA=t, WS=w, FOLD=f)
    for t, w, f in itertools.product((False, True), (False, True), (False, True))
    if t or not w
]
CONFIGS = [(64, 64, 4, 3), (128, 64, 8, 2), (128, 64, 8, 3), (128, 128, 8, 2), (128, 128, 8, 3)]


def launch(q, k, v, out, variant, config):
    batch, q_heads, t, head_dim = q.shape
    block_m, block_n, warps, stages = config
    probe_kernel[(batch * q_heads, triton.cdiv(t, block_m))](
        q, k, v, out, head_dim**-0.5 * 1.4426950408889634, q_heads, t,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2), v.stride(0), v.stride(1),
        v.stride(2), GROUP=q_heads // k.shape[1], HEAD_DIM=head_dim, BLOCK_M=block_m, BLOCK_N=block_n,
        num_warps=warps, num_stages=stages, **variant,
    )  # fmt: skip


def build() -> int:
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    signature = {name: "*bf16" for name in ("q_ptr", "k_ptr", "v_ptr", "out_ptr")}
    signature |= {"qk_scale": "fp32"} | {name: "i32" for name in probe_kernel.arg_names[5:16]}
    failed = 0
    for variant, config in itertools.product(VARIANTS, CONFIGS):
        block_m, block_n, warps, stages = config
        constexprs = dict(GROUP=4, HEAD_DIM=128, BLOCK_M=block_m, BLOCK_N=block_n, **variant)
        try:
            source = ASTSource(probe_kernel, signature | dict.fromkeys(constexprs, "constexpr"), constexprs)
            triton.compile(source, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=warps, num_stages=stages))
            print("ok  ", variant, config)
        except Exception as failure:
            failed += 1
            print("FAIL", variant, config, str(failure).splitlines()[-1][:200])
    return 1 if failed else 0


def main() -> int:
    if "--build" in sys.argv:
        return build()
    sys.path.insert(0, ".")
    import torch.nn.functional as F
    from graphspec.kernels import prefill_attention

    from benchmarks import common

    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device="cuda"))
    print(torch.cuda.get_device_name(), torch.__version__, triton.__version__)
    for name, hq, hkv, d, t in (
        ("8B 4096", 32, 8, 128, 4096),
        ("8B 2048", 32, 8, 128, 2048),
        ("1B 4096", 32, 8, 64, 4096),
    ):
        qkv = torch.randn(1, t, (hq + 2 * hkv) * d, device="cuda", dtype=torch.bfloat16)
        q, k, v = qkv.view(1, t, hq + 2 * hkv, d).transpose(1, 2).split((hq, hkv, hkv), dim=1)
        flops = 4.0 * d * hq * t * (t + 1) / 2
        exact = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=True, enable_gqa=True)
        exact = exact.transpose(1, 2)
        cache = torch.zeros(1, 2, 1, hkv, t, d, device="cuda", dtype=torch.bfloat16)
        zeros = torch.zeros(1, dtype=torch.int64, device="cuda")
        package = prefill_attention.CONFIGS[90] if d != 256 else prefill_attention.CONFIGS[(90, "head_dim_256")]
        rows = {
            "package op (+cache write)": lambda: torch.ops.graphspec.prefill_attention_triton(
                q, k, v, cache, 0, zeros, zeros, d**-0.5, *package.values()
            ),
            "SDPA (cuDNN), contiguous": lambda qc=q.contiguous(), kc=k.contiguous(), vc=v.contiguous(): (
                F.scaled_dot_product_attention(qc, kc, vc, is_causal=True, enable_gqa=True)
            ),
        }
        print(f"\n{name}: heads {hq}/{hkv} x {d}")
        for label, fn in rows.items():
            ms = common.time_fn(fn, "cuda", reps=30)["ms"]
            print(f"  {label:44} {ms:7.3f} ms {flops / ms / 1e9:5.0f} TFLOP/s")
        for variant, config in itertools.product(VARIANTS, CONFIGS):
            out = torch.empty(1, t, hq, d, device="cuda", dtype=torch.bfloat16)
            label = f"{''.join(k for k, on in variant.items() if on) or 'plain':12} {config}"
            try:
                launch(q, k, v, out, variant, config)
                torch.cuda.synchronize()
                err = ((out.float() - exact).norm() / exact.norm()).item()
                ms = common.time_fn(lambda: launch(q, k, v, out, variant, config), "cuda", reps=30)["ms"]
            except Exception as failure:
                print(f"  {label:44} failed: {str(failure).splitlines()[-1][:120] if str(failure) else type(failure)}")
                continue
            print(f"  {label:44} {ms:7.3f} ms {flops / ms / 1e9:5.0f} TFLOP/s  rel err {err:.1e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
