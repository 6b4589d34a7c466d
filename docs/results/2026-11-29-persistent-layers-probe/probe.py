# ruff: noqa  (a probe, kept with its results)
"""Probe (issue 16; written 2026-11-29 after the step's profile at ce9d936; run on the H200 at 0dc9eab: run/probe.log,
docs/BENCHMARKS.md 2026-11-29 17:33, every variant slower than the launches): would one persistent kernel for a
one-row forward's layers (grid barriers between its phases instead of kernel boundaries) beat the launches it
replaces?

Where the B = 1 draft-model step stands (docs/BENCHMARKS.md, 2026-11-29 15:45 entry): 7.88 ms = 1.29x its floor;
the draft's four 1B forwards take 3.82 ms against 4 x 0.58 ms of weight reads. Their GEMVs are each near the
copy rate where the weight is large (gate/up + SwiGLU 18.4 us, 86%) and far from it where it is small (q/k/v 5.3 us,
56%; o 4.5 us, 44%; down 10.9 us, 72%): about 2-3 us a launch that streams nothing (grid ramp-up, the tail wave,
the gap between graph nodes), 10.5 us a 1B layer, 0.67 ms a step. Programmatic dependent launch was tried twice
and bought nothing (docs/BENCHMARKS.md, 2026-11-24 and 2026-11-28). A persistent kernel keeps every program
resident across phases: a phase's tail overlaps the next phase's first loads on other SMs, and a grid barrier
(an atomic counter) replaces the launch boundary. What it costs is the barrier itself.

The chain timed, per layer, as a folded one-row decode layer runs it (no rotary, no KV write: the cache holds CTX
keys already, the query sits after them):
    qkv = x @ Wqkv.T;  attn = attention(q = qkv[:H], the layer's cache);  x += attn @ Wo.T;
    act = scaled_silu_mul(x @ Wgu.T, x);  x += act @ Wd.T
- "launches": graphspec's kernels with their sm_90 rows (kernels/gemv.py, kernels/attention.py and its split
  reduce, kernels/scaled_silu_mul_linear.py), six launches a layer, captured in one CUDA graph (as a step replays
  them);
- "persistent": one kernel, P programs (a multiple of the SM count, all resident: checked from the compiled
  kernel's registers before launching, since a barrier with a program not yet resident would never open), each
  phase's work items dealt round-robin, a grid barrier after each phase: q/k/v; attention partials (a KV head's
  1024 / D keys an item, its GQA group's queries); their combine (a query head an item); o; gate/up + SwiGLU; down. The
  GEMV phases keep the launches' tiles and summation order, attention its own split; with "prefetch", each program asks L2 for the start of its next phase's first
  weight tile before it waits (the weights do not depend on what it waits for), so the phase after a barrier
  does not start cold;
- "barriers": the persistent kernel's barriers alone (6 a layer, no work): their cost;
- the floor: the chain's weight and KV bytes / the copy rate measured in the same run.

    python docs/results/2026-11-29-persistent-layers-probe/probe.py [--models llama-1b,llama-8b] [--context 512]
    TRITON_INTERPRET=1 python docs/results/2026-11-29-persistent-layers-probe/probe.py --check-cpu   # one program
    python docs/results/2026-11-29-persistent-layers-probe/probe.py --build 90     # every config for sm_90, offline

What would count: if "persistent" is well below "launches" for the 1B (the GEMVs' 10.5 us a layer over their
floor above, and attention + reduce at ~6 us for ~1 MB of keys and values), a persistent draft forward is worth
building; if the barriers cost about what the launch boundaries do, it is not.
"""

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from graphspec.kernels.common import round_to

DTYPE = torch.bfloat16
EPS = 1e-5
ATTENTION_ELEMS = 1024  # an attention item takes CH = this / D keys (its [G, CH, D] products: 32 registers a thread)
# (programs per SM, block_n of the plain GEMV phases, block_n of the gate/up phase (gate rows; as many up rows),
# block_k, num_warps, prefetch lines: 128-byte lines of each weight row of its next phase's first tile a program asks
# L2 for before it waits at a barrier (weights do not depend on the phase being waited for); 0: none)
CONFIGS = [
    (1, 8, 4, 512, 4, 0),
    (2, 8, 4, 512, 4, 0),
    (4, 8, 4, 512, 4, 0),
    (1, 16, 8, 512, 8, 0),
    (2, 8, 4, 512, 4, 16),
    (4, 8, 4, 512, 4, 16),
    (4, 8, 4, 512, 4, 32),
    (1, 16, 8, 512, 8, 16),
]  # sm_90 builds: 124-128 registers at 4 warps (4 programs a SM fit), 161-195 at 8 (one)


@triton.jit
def grid_barrier(counter_ptr, target):
    """Wait until `target` arrivals: every program adds one (release: its phase's stores before it), then spins
    with acquiring reads (the other programs' stores visible after)."""
    tl.debug_barrier()  # every thread of this program has stored its part of the phase
    tl.atomic_add(counter_ptr, 1, sem="release", scope="gpu")
    arrived = tl.atomic_add(counter_ptr, 0, sem="acquire", scope="gpu")
    while arrived < target:
        arrived = tl.atomic_add(counter_ptr, 0, sem="acquire", scope="gpu")
    tl.debug_barrier()


@triton.jit
def prefetch_rows(w_ptr, first_row, N, K, ROWS: tl.constexpr, LINES: tl.constexpr):
    """Ask L2 for the first LINES x 128 bytes of weight rows first_row .. first_row + ROWS - 1 (rows past N and
    columns past K clamped to the last ones: a prefetch of memory the weight does not hold is not wanted)."""
    rows = tl.minimum(first_row + tl.arange(0, ROWS), N - 1)
    cols = tl.minimum(tl.arange(0, LINES) * 64, K - 64)  # 64 bf16 a line
    lines = w_ptr + rows.to(tl.int64)[:, None] * K + cols[None, :]
    tl.inline_asm_elementwise(
        "prefetch.global.L2 [$1];\n\tmov.u32 $0, 0;", "=r,l", [lines], dtype=tl.int32, is_pure=False, pack=1
    )


@triton.jit
def gemv_phase(
    x_ptr, w_ptr, addend_ptr, out_ptr, N, K, pid, P, HAS_ADDEND: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr
):
    """out[n] = sum_k x[k] W[n, k] (+ addend[n]) for this program's tiles of BN rows (tile t for t = pid mod P);
    kernels/gemv.py's arithmetic (fp32 products accumulated in [BN, BK], summed once, one rounding). N % BN == 0,
    K % BK == 0. x is read past L1 (.cg): other programs wrote it in the previous phase."""
    for tile in range(pid, N // BN, P):
        rows = tile * BN + tl.arange(0, BN)
        w_rows = w_ptr + rows.to(tl.int64)[:, None] * K
        acc = tl.zeros((BN, BK), dtype=tl.float32)
        for k0 in range(0, K, BK):
            cols = k0 + tl.arange(0, BK)
            x = tl.load(x_ptr + cols, cache_modifier=".cg").to(tl.float32)
            acc += tl.load(w_rows + cols[None, :]).to(tl.float32) * x[None, :]
        total = tl.sum(acc, 1)
        if HAS_ADDEND:
            total += tl.load(addend_ptr + rows, cache_modifier=".cg").to(tl.float32)
        dtype = out_ptr.dtype.element_ty
        tl.store(out_ptr + rows, round_to(total, dtype).to(dtype))


@triton.jit
def swiglu_phase(x_ptr, w_ptr, out_ptr, I, K, eps, pid, P, BN: tl.constexpr, BK: tl.constexpr):
    """out[n] = silu(r g[n]) (r u[n]) for g, u = x @ W[:I].T, x @ W[I:].T rounded to the dtype, r = rsqrt(mean(x^2)
    + eps): kernels/scaled_silu_mul_linear.py's arithmetic, for this program's tiles of BN gate rows."""
    for tile in range(pid, I // BN, P):
        rows = tile * BN + tl.arange(0, BN)
        gate_rows = w_ptr + rows.to(tl.int64)[:, None] * K
        up_rows = gate_rows + I * K  # < 2**31 at the 8B's 14336 x 4096
        acc_gate = tl.zeros((BN, BK), dtype=tl.float32)
        acc_up = tl.zeros((BN, BK), dtype=tl.float32)
        squares = tl.zeros((BK,), dtype=tl.float32)
        for k0 in range(0, K, BK):
            cols = k0 + tl.arange(0, BK)
            x = tl.load(x_ptr + cols, cache_modifier=".cg").to(tl.float32)
            acc_gate += tl.load(gate_rows + cols[None, :]).to(tl.float32) * x[None, :]
            acc_up += tl.load(up_rows + cols[None, :]).to(tl.float32) * x[None, :]
            squares += x * x
        dtype = out_ptr.dtype.element_ty
        scale = tl.rsqrt(tl.sum(squares, 0) / K + eps)
        gate = round_to(tl.sum(acc_gate, 1), dtype) * scale  # the GEMV's rounded output, as the fused kernel
        up = round_to(tl.sum(acc_up, 1), dtype) * scale
        out = tl.div_rn(gate, 1.0 + tl.exp(-gate)) * up
        tl.store(out_ptr + rows, round_to(out, dtype).to(dtype))


@triton.jit
def attention_phase(
    qkv_ptr,
    k_ptr,
    v_ptr,
    part_o_ptr,
    part_ml_ptr,
    HKV,
    CTX,
    S,
    scale,
    pid,
    P,
    G: tl.constexpr,
    D: tl.constexpr,
    CH: tl.constexpr,
):
    """Partials of one query's attention: item (KV head h, chunk c) takes keys c*CH .. c*CH + CH - 1 < CTX of head h
    for the G query heads of its group; stores the unnormalized sum p v [G, D], the max score m and sum p l [G]."""
    chunks = tl.cdiv(CTX, CH)
    gs, ds = tl.arange(0, G), tl.arange(0, D)
    for item in range(pid, HKV * chunks, P):
        head, chunk = item // chunks, item % chunks
        keys = chunk * CH + tl.arange(0, CH)
        key_ok = keys < CTX
        q = tl.load(qkv_ptr + (head * G + gs)[:, None] * D + ds[None, :], cache_modifier=".cg").to(tl.float32)
        rows = (head * S + keys)[:, None] * D + ds[None, :]
        k = tl.load(k_ptr + rows, mask=key_ok[:, None], other=0.0).to(tl.float32)
        scores = tl.sum(q[:, None, :] * k[None, :, :], 2) * scale  # [G, CH]
        scores = tl.where(key_ok[None, :], scores, float("-inf"))
        m = tl.max(scores, 1)
        p = tl.exp(scores - m[:, None])
        v = tl.load(v_ptr + rows, mask=key_ok[:, None], other=0.0).to(tl.float32)
        o = tl.sum(p[:, :, None] * v[None, :, :], 1)  # [G, D]
        tl.store(part_o_ptr + (item * G + gs)[:, None] * D + ds[None, :], o)
        tl.store(part_ml_ptr + item * 2 * G + gs, m)
        tl.store(part_ml_ptr + item * 2 * G + G + gs, tl.sum(p, 1))


@triton.jit
def combine_phase(
    part_o_ptr,
    part_ml_ptr,
    attn_ptr,
    HKV,
    CTX,
    pid,
    P,
    G: tl.constexpr,
    D: tl.constexpr,
    CH: tl.constexpr,
    MAXCH: tl.constexpr,
    CB: tl.constexpr,
):
    """attn[h] = sum_c e^(m_c - M) o_c / sum_c e^(m_c - M) l_c over query head h's chunks, rounded once; the
    partial outputs summed CB chunks a step (registers)."""
    chunks = tl.cdiv(CTX, CH)
    ds = tl.arange(0, D)
    for h in range(pid, HKV * G, P):
        head, g = h // G, h % G
        cs = tl.arange(0, MAXCH)
        c_ok = cs < chunks
        stats = part_ml_ptr + (head * chunks + cs) * 2 * G + g
        m = tl.load(stats, mask=c_ok, other=float("-inf"), cache_modifier=".cg")
        l = tl.load(stats + G, mask=c_ok, other=0.0, cache_modifier=".cg")
        top = tl.max(m, 0)
        total = tl.sum(tl.where(c_ok, tl.exp(m - top) * l, 0.0), 0)
        acc = tl.zeros((D,), dtype=tl.float32)
        for c0 in range(0, chunks, CB):
            block = c0 + tl.arange(0, CB)
            block_ok = block < chunks
            items = head * chunks + block
            block_m = tl.load(part_ml_ptr + items * 2 * G + g, mask=block_ok, other=float("-inf"), cache_modifier=".cg")
            w = tl.where(block_ok, tl.exp(block_m - top), 0.0)
            o = tl.load(
                part_o_ptr + (items * G + g)[:, None] * D + ds[None, :],
                mask=block_ok[:, None],
                other=0.0,
                cache_modifier=".cg",
            )
            acc += tl.sum(w[:, None] * o, 0)
        dtype = attn_ptr.dtype.element_ty
        tl.store(attn_ptr + h * D + ds, round_to(acc / total, dtype).to(dtype))


@triton.jit
def persistent_layers_kernel(
    x_ptr,
    qkv_ptr,
    attn_ptr,
    act_ptr,
    part_o_ptr,
    part_ml_ptr,
    wqkv_ptr,
    wo_ptr,
    wgu_ptr,
    wd_ptr,
    cache_ptr,
    counter_ptr,
    LAYERS,
    H,
    QKV,
    I,
    HKV,
    CTX,
    S,
    eps,
    scale,
    WORK: tl.constexpr,
    BN: tl.constexpr,
    BN_GU: tl.constexpr,
    BK: tl.constexpr,
    PREFETCH: tl.constexpr,  # lines a weight row (prefetch_rows) of a coming phase's first tile; 0: none
    G: tl.constexpr,
    D: tl.constexpr,
    CH: tl.constexpr,
    MAXCH: tl.constexpr,
):
    """LAYERS x (q/k/v, attention partials, their combine, o + residual, gate/up + SwiGLU, down + residual), a grid
    barrier after each phase; WORK False: the barriers alone. The counter starts at 0 and only grows (phase j
    waits for j x P arrivals). The cache is [LAYERS, 2, HKV, S, D] (keys, values)."""
    pid = tl.program_id(0)
    P = tl.num_programs(0)
    phase = 0
    wqkv, wo, wgu, wd, cache = wqkv_ptr, wo_ptr, wgu_ptr, wd_ptr, cache_ptr  # this layer's: moved on each layer
    for layer in range(LAYERS):
        if WORK:
            gemv_phase(x_ptr, wqkv, x_ptr, qkv_ptr, QKV, H, pid, P, False, BN, BK)
            if PREFETCH:  # o's weight, two phases ahead
                prefetch_rows(wo, pid * BN, H, H, BN, PREFETCH)
        phase += 1
        grid_barrier(counter_ptr, phase * P)
        if WORK:
            attention_phase(
                qkv_ptr, cache, cache + HKV * S * D, part_o_ptr, part_ml_ptr, HKV, CTX, S, scale, pid, P, G, D, CH
            )
        phase += 1
        grid_barrier(counter_ptr, phase * P)
        if WORK:
            combine_phase(part_o_ptr, part_ml_ptr, attn_ptr, HKV, CTX, pid, P, G, D, CH, MAXCH, 16)
        phase += 1
        grid_barrier(counter_ptr, phase * P)
        if WORK:  # x += attn @ Wo.T, in place: each program reads and writes its own rows of x
            gemv_phase(attn_ptr, wo, x_ptr, x_ptr, H, H, pid, P, True, BN, BK)
            if PREFETCH:
                prefetch_rows(wgu, pid * BN_GU, 2 * I, H, BN_GU, PREFETCH)
                prefetch_rows(wgu, I + pid * BN_GU, 2 * I, H, BN_GU, PREFETCH)
        phase += 1
        grid_barrier(counter_ptr, phase * P)
        if WORK:
            swiglu_phase(x_ptr, wgu, act_ptr, I, H, eps, pid, P, BN_GU, BK)
            if PREFETCH:
                prefetch_rows(wd, pid * BN, H, I, BN, PREFETCH)
        phase += 1
        grid_barrier(counter_ptr, phase * P)
        if WORK:
            gemv_phase(act_ptr, wd, x_ptr, x_ptr, H, I, pid, P, True, BN, BK)
            if PREFETCH:
                if layer + 1 < LAYERS:  # the next layer's q/k/v
                    prefetch_rows(wqkv + QKV * H, pid * BN, QKV, H, BN, PREFETCH)
        phase += 1
        grid_barrier(counter_ptr, phase * P)
        wqkv += QKV * H
        wo += H * H
        wgu += 2 * I * H
        wd += H * I
        cache += 2 * HKV * S * D


class Chain:
    """One model's stacked layer weights and KV cache (bf16, scaled so activations stay O(1)) and its first x."""

    def __init__(
        self, layers: int, h: int, heads: int, kv_heads: int, inter: int, ctx: int, seq: int, device: str, seed: int = 0
    ) -> None:
        g = torch.Generator(device=device).manual_seed(seed)  # drawn where they live: the 8B's are 14 GB
        make = lambda *shape: (torch.randn(*shape, generator=g, device=device) / shape[-1] ** 0.5).to(DTYPE)
        self.layers, self.h, self.heads, self.kv_heads, self.inter = layers, h, heads, kv_heads, inter
        self.d = h // heads
        self.qkv = h + 2 * kv_heads * self.d
        self.ctx, self.seq = ctx, seq  # keys attended (positions 0 .. ctx - 1), the cache's length
        self.wqkv, self.wo = make(layers, self.qkv, h), make(layers, h, h)
        self.wgu, self.wd = make(layers, 2 * inter, h), make(layers, h, inter)
        self.cache = (torch.randn(layers, 2, 1, kv_heads, seq, self.d, generator=g, device=device)).to(DTYPE)
        self.x0 = (torch.randn(1, h, generator=g, device=device) * 2).to(DTYPE)
        weights = sum(w.numel() * w.element_size() for w in (self.wqkv, self.wo, self.wgu, self.wd))
        self.bytes = weights + layers * 2 * kv_heads * ctx * self.d * 2  # what a forward must read

    def reference(self) -> torch.Tensor:
        """The chain in fp32 with the kernels' roundings (each phase's output rounded to bf16)."""
        x = self.x0.float()
        r = lambda t: t.to(DTYPE).float()
        group = self.heads // self.kv_heads
        for layer in range(self.layers):
            qkv = r(x @ self.wqkv[layer].float().T)
            q = qkv[0, : self.h].view(self.heads, 1, self.d)
            keys, values = (self.cache[layer, i, 0, :, : self.ctx].float().repeat_interleave(group, 0) for i in (0, 1))
            probs = torch.softmax((q * keys).sum(-1) * self.d**-0.5, dim=-1)  # [heads, ctx]
            attn = r((probs[:, :, None] * values).sum(1).reshape(1, self.h))
            x = r(x + attn @ self.wo[layer].float().T)
            gate_up = r(x @ self.wgu[layer].float().T)
            scale = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS)
            gate, up = gate_up[:, : self.inter] * scale, gate_up[:, self.inter :] * scale
            act = r(torch.nn.functional.silu(gate) * up)
            x = r(x + act @ self.wd[layer].float().T)
        return x


class Persistent:
    def __init__(
        self,
        chain: Chain,
        programs: int,
        bn: int,
        bn_gu: int,
        bk: int,
        warps: int,
        prefetch: int,
        work: bool = True,
        ch: int = 0,
    ) -> None:
        self.chain, self.programs, self.work = chain, programs, work
        ch = ch or ATTENTION_ELEMS // chain.d
        chunks = -(-chain.ctx // ch)
        self.meta = dict(
            WORK=work,
            BN=bn,
            BN_GU=bn_gu,
            BK=bk,
            PREFETCH=prefetch,
            G=chain.heads // chain.kv_heads,
            D=chain.d,
            CH=ch,
            MAXCH=triton.next_power_of_2(chunks),
            num_warps=warps,
        )
        device = chain.x0.device
        self.x = chain.x0.clone()
        self.qkv = torch.empty(1, chain.qkv, dtype=DTYPE, device=device)
        self.attn = torch.empty(1, chain.h, dtype=DTYPE, device=device)
        self.act = torch.empty(1, chain.inter, dtype=DTYPE, device=device)
        self.part_o = torch.empty(
            chain.kv_heads * chunks * chain.h // chain.kv_heads, dtype=torch.float32, device=device
        )
        self.part_ml = torch.empty(chain.kv_heads * chunks * 2 * (chain.heads // chain.kv_heads), device=device)
        self.counter = torch.zeros(1, dtype=torch.int32, device=device)

    def args(self) -> tuple:
        c = self.chain
        return (
            self.x,
            self.qkv,
            self.attn,
            self.act,
            self.part_o,
            self.part_ml,
            c.wqkv,
            c.wo,
            c.wgu,
            c.wd,
            c.cache,
            self.counter,
            c.layers,
            c.h,
            c.qkv,
            c.inter,
            c.kv_heads,
            c.ctx,
            c.seq,
            EPS,
            c.d**-0.5,
        )

    def __call__(self) -> torch.Tensor:
        self.counter.zero_()
        self.x.copy_(self.chain.x0)
        persistent_layers_kernel[(self.programs,)](*self.args(), **self.meta)
        return self.x

    def compiled(self):
        return persistent_layers_kernel.warmup(*self.args(), grid=(self.programs,), **self.meta)


def resident_programs_per_sm(kernel, warps: int) -> int:
    """How many programs of this compiled kernel an sm_90 SM holds at once (registers, warps, shared memory); 1
    where the registers are not known (one program a SM is resident whenever the kernel launches at all)."""
    getattr(kernel, "_init_handles", lambda: None)()  # registers are read when the binary is loaded
    regs = getattr(kernel, "n_regs", None)
    if not regs or regs < 0:
        return 1
    per_warp = -(-regs * 32 // 256) * 256  # allocated in units of 256 registers a warp
    shared = kernel.metadata.shared
    return min(65536 // (per_warp * warps), 64 // warps, 227 * 1024 // shared if shared else 32, 32)


def check_cpu() -> None:
    """One program (the interpreter runs programs one after another: a barrier over several would never open)."""
    # (layers, hidden, heads, KV heads, intermediate, keys attended (not a multiple of CH), cache length, tiles)
    # keys an attention item (ch): 5 chunks; 18, more than the combine's 16 a step
    cases = [(2, 64, 4, 2, 128, 40, 64, (8, 4, 32), 8), (3, 128, 4, 1, 256, 70, 96, (16, 8, 64), 4)]
    for layers, h, heads, kv_heads, inter, ctx, seq, (bn, bn_gu, bk), ch in cases:
        chain = Chain(layers, h, heads, kv_heads, inter, ctx, seq, "cpu", seed=layers)
        out = Persistent(chain, 1, bn, bn_gu, bk, 4, 0, ch=ch)().float()  # no prefetch: inline PTX
        exact = chain.reference()
        error = ((out - exact).norm() / exact.norm()).item()
        assert error < 2e-2, error
        base = launches(chain)().float()  # the launches compute the same chain
        base_error = ((base - exact).norm() / exact.norm()).item()
        assert base_error < 2e-2, base_error
        barriers = Persistent(chain, 1, bn, bn_gu, bk, 4, 0, work=False)
        barriers()
        assert barriers.counter.item() == 6 * layers
        print(
            f"persistent layers L={layers} H={h} heads {heads}/{kv_heads} keys {ctx} ({ch} an item): relative error "
            f"{error:.1e} (the launches: {base_error:.1e}) "
            f"against the rounded fp32 chain; barriers alone: counter {barriers.counter.item()}"
        )


def build(sm: int) -> None:
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    cuobjdump = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    pointers = ("x_ptr", "qkv_ptr", "attn_ptr", "act_ptr", "wqkv_ptr", "wo_ptr", "wgu_ptr", "wd_ptr", "cache_ptr")
    signature = {
        **{name: "*bf16" for name in pointers[:4]},
        "part_o_ptr": "*fp32",
        "part_ml_ptr": "*fp32",
        **{name: "*bf16" for name in pointers[4:]},
        "counter_ptr": "*i32",
        **{name: "i32" for name in ("LAYERS", "H", "QKV", "I", "HKV", "CTX", "S")},
        "eps": "fp32",
        "scale": "fp32",
    }
    # the JIT's specialization at the real shapes: pointers and sizes divisible by 16 (vectorized loads)
    attrs = {
        (index,): [["tt.divisibility", 16]]
        for index, name in enumerate(signature)
        if name not in ("LAYERS", "HKV", "CTX", "eps", "scale")
    }
    heads = {64: "llama-1b", 128: "llama-8b"}  # head dims: D is a constexpr (G = 4 in both)
    for bn, bn_gu, bk, warps, prefetch in sorted({config[1:] for config in CONFIGS}):
        for d, model in heads.items():
            for work in (True, False):
                ch = ATTENTION_ELEMS // d
                constexprs = {
                    "WORK": work,
                    "BN": bn,
                    "BN_GU": bn_gu,
                    "BK": bk,
                    "PREFETCH": prefetch,
                    "G": 4,
                    "D": d,
                    "CH": ch,
                    "MAXCH": triton.next_power_of_2(512 // ch),
                }
                source = ASTSource(
                    persistent_layers_kernel, {**signature, **{k: "constexpr" for k in constexprs}}, constexprs, attrs
                )
                compiled = triton.compile(source, target=GPUTarget("cuda", sm, 32), options={"num_warps": warps})
                with tempfile.NamedTemporaryFile(suffix=".cubin") as cubin:
                    cubin.write(compiled.asm["cubin"])
                    cubin.flush()
                    usage = subprocess.run([str(cuobjdump), "-res-usage", cubin.name], capture_output=True, text=True)
                line = next((l.strip() for l in usage.stdout.splitlines() if "REG:" in l), usage.stdout.strip()[-200:])
                print(
                    f"sm_{sm} {model} (D {d}) bn {bn} bn_gu {bn_gu} bk {bk} warps {warps} prefetch {prefetch} "
                    f"work {work}: {line}",
                    flush=True,
                )


def launches(chain: Chain):
    """The same chain as graphspec's kernels with their sm_90 rows, six launches a layer (the attention split over
    keys and reduced, as at batch 1)."""
    from graphspec.kernels import attention, gemv, scaled_silu_mul_linear

    one = {k: gemv.CONFIGS[90][k] for k in ("block_n", "block_k", "num_warps", "num_stages")}
    fused = scaled_silu_mul_linear.CONFIGS[90]
    x = chain.x0.clone()
    device = x.device
    slot_ids = torch.zeros(1, dtype=torch.int64, device=device)
    start_pos = torch.full((1,), chain.ctx - 1, dtype=torch.int64, device=device)  # sees keys 0 .. ctx - 1

    def run() -> torch.Tensor:
        x.copy_(chain.x0)
        for layer in range(chain.layers):
            qkv = gemv.gemv(x, chain.wqkv[layer].t(), None, None, **one)
            q = qkv[:, : chain.h].view(1, chain.heads, 1, chain.d)
            attn = attention.attention(
                q, chain.cache, layer, slot_ids, start_pos, chain.d**-0.5, **attention.CONFIGS[90]
            )
            gemv.gemv(attn.view(1, chain.h), chain.wo[layer].t(), x, x, **one)
            act = scaled_silu_mul_linear.scaled_silu_mul_linear(x, chain.wgu[layer].t(), EPS, **fused)
            gemv.gemv(act, chain.wd[layer].t(), x, x, **one)
        return x

    return run


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", default="llama-1b,llama-8b")
    parser.add_argument("--context", type=int, default=512, help="keys each layer's attention reads")
    parser.add_argument("--check-cpu", action="store_true")
    parser.add_argument("--build", type=int, default=0, help="compile every config for this SM (no GPU) and stop")
    args = parser.parse_args()
    if args.check_cpu:
        check_cpu()
        return
    if args.build:
        build(args.build)
        return
    from benchmarks import common

    copy_gb_s = common.measure_copy_bandwidth("cuda")["gb_s"]
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    print(
        f"{common.device_name('cuda')}, {sms} SMs, triton {triton.__version__}, torch {torch.__version__}, "
        f"copy {copy_gb_s:.0f} GB/s",
        flush=True,
    )
    time_us = lambda fn: common.time_fn(fn, "cuda", reps=20, warmup=2)["ms"] * 1e3
    for model in args.models.split(","):
        shape = common.SHAPES[model]
        h, inter, layers = shape["hidden_size"], shape["intermediate_size"], shape["num_hidden_layers"]
        heads, kv_heads = shape["num_attention_heads"], shape["num_key_value_heads"]
        chain = Chain(layers, h, heads, kv_heads, inter, args.context, 2 * args.context, "cuda")
        exact = chain.reference()
        error = lambda out: ((out.float() - exact).norm() / exact.norm()).item()
        floor = chain.bytes / (copy_gb_s * 1e3)
        run = launches(chain)
        expected = run().clone()
        base = time_us(run)
        print(
            f"{model}: {layers} layers, {args.context} keys, weights + KV {chain.bytes / 1e9:.2f} GB, floor {floor:.0f} us; launches "
            f"{base:.0f} us ({base / floor:.2f}x the floor, {(base - floor) / layers:.1f} us a layer over it, "
            f"err {error(expected):.1e})",
            flush=True,
        )
        for per_sm, bn, bn_gu, bk, warps, prefetch in CONFIGS:
            name = f"p{per_sm}xSM bn{bn}/{bn_gu} bk{bk} w{warps} prefetch{prefetch}"
            try:
                persistent = Persistent(chain, per_sm * sms, bn, bn_gu, bk, warps, prefetch)
                fits = resident_programs_per_sm(persistent.compiled(), warps)
                if fits < per_sm:
                    print(f"  {name}: skipped, {fits} programs a SM resident at most")
                    continue
                out = persistent().clone()
                same = torch.equal(out, expected)
                us = time_us(persistent)
                barriers = Persistent(chain, per_sm * sms, bn, bn_gu, bk, warps, prefetch, work=False)
                barrier_us = time_us(barriers) / (6 * layers)
                print(
                    f"  {name}: {us:.0f} us ({us / floor:.2f}x the floor, {(base - us) / layers:+.1f} us a layer "
                    f"against launches), err {error(out):.1e}, {'bitwise equal to' if same else 'differs from'} the "
                    f"launches; barrier alone {barrier_us:.2f} us",
                    flush=True,
                )
            except Exception as failure:
                print(f"  {name}: {type(failure).__name__}: {str(failure)[:200]}", flush=True)
        del chain


if __name__ == "__main__":
    main()
