"""graphspec::gated_delta_rule as a Triton kernel: the Gated DeltaNet recurrence of prefill chunks (and
plain decode), from the slot's state (zeros for a row at position 0) to the state after position
length - 1 (right padding never advances it). The kernel also serves graphspec::gated_delta_rule_snapshots
(kernels/gated_delta_rule_snapshots.py), which stores the state after every position instead.

One program per (row, value head, block of value columns): it holds that block of the head's state
[Dk, BLOCK_V] in fp32 registers, reads it once from slot slot_ids[b], and for each position decays it,
applies the delta rule with the L2-normalized key and writes the output. Token by token (a recurrent
kernel, not the chunked algorithm): fine for decode and verify, slower than a chunked kernel for long
prompts. Same arithmetic as graphspec.ops.gated_delta_rule_scan (transformers'
torch_recurrent_gated_delta_rule) in a different summation order: fp32 agrees to ~1e-6 relative.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from graphspec.kernels.common import cdiv, check_config_table, check_device, next_power_of_2
from torch import Tensor

from graphspec import library
from graphspec.ops import gated_delta_rule_reference

__all__ = ["CONFIGS", "gated_delta_rule", "gated_delta_rule_kernel", "gated_delta_rule_reference"]

# block_v: value columns per program. The state block [Dk, block_v] lives in registers: 128 x 32 fp32
# over 4 warps is 32 registers a thread. Untuned (no GPU timing yet).
CONFIGS: dict[int | str, dict[str, int]] = {
    80: {"block_v": 32, "num_warps": 4},
    90: {"block_v": 32, "num_warps": 4},
    "default": {"block_v": 32, "num_warps": 4},
}
CONFIG_FIELDS = check_config_table(CONFIGS)
MAX_HEAD_DIM = 256  # Dk: one program holds a whole key dimension


@triton.jit
def gated_delta_rule_kernel(
    q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, state_ptr, slot_ptr, start_ptr, length_ptr, out_ptr, snap_ptr,
    T, HV, GROUP, scale,
    sq_b, sq_t, sq_h, sq_d,
    sk_b, sk_t, sk_h, sk_d,
    sv_b, sv_t, sv_h, sv_d,
    sg_b, sg_t, sg_h,
    sb_b, sb_t, sb_h,
    ss_s, ss_h, ss_k, ss_v,
    DK: tl.constexpr,
    DV: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_V: tl.constexpr,
    SNAPSHOTS: tl.constexpr,  # True: store the state after every position; False: after position length - 1
):  # fmt: skip
    row_head = tl.program_id(0)  # b * HV + value head
    b = (row_head // HV).to(tl.int64)
    head = row_head % HV
    key_head = head // GROUP  # grouped value attention: GROUP value heads share a q/k head
    offs_k = tl.arange(0, BLOCK_K)
    offs_v = tl.program_id(1) * BLOCK_V + tl.arange(0, BLOCK_V)
    mask_k = offs_k < DK
    mask_v = offs_v < DV
    mask_kv = mask_k[:, None] & mask_v[None, :]
    slot = tl.load(slot_ptr + b).to(tl.int64)
    state_base = state_ptr + slot * ss_s + head * ss_h  # state_ptr: the layer's [SLOTS, Hv, Dk, Dv]
    state = tl.load(state_base + offs_k[:, None] * ss_k + offs_v[None, :] * ss_v, mask=mask_kv, other=0.0)
    state = state.to(tl.float32)  # [BLOCK_K, BLOCK_V]
    length = T
    if not SNAPSHOTS:  # prefill: a row at position 0 starts from zeros (where: NaN in the slot stays out)
        state = tl.where(tl.load(start_ptr + b) == 0, 0.0, state)
        length = tl.load(length_ptr + b)
    for t in range(T):
        q = tl.load(q_ptr + b * sq_b + t * sq_t + key_head * sq_h + offs_k * sq_d, mask=mask_k, other=0.0)
        k = tl.load(k_ptr + b * sk_b + t * sk_t + key_head * sk_h + offs_k * sk_d, mask=mask_k, other=0.0)
        q, k = q.to(tl.float32), k.to(tl.float32)
        # L2 norms over the whole key dim (masked lanes are 0), eps 1e-6 as in the reference; q scaled.
        q = q * tl.math.rsqrt(tl.sum(q * q, axis=0) + 1e-6) * scale
        k = k * tl.math.rsqrt(tl.sum(k * k, axis=0) + 1e-6)
        v = tl.load(v_ptr + b * sv_b + t * sv_t + head * sv_h + offs_v * sv_d, mask=mask_v, other=0.0)
        v = v.to(tl.float32)
        decay = tl.exp(tl.load(g_ptr + b * sg_b + t * sg_t + head * sg_h).to(tl.float32))
        beta = tl.load(beta_ptr + b * sb_b + t * sb_t + head * sb_h).to(tl.float32)
        decayed = state * decay
        memory = tl.sum(decayed * k[:, None], axis=0)  # [BLOCK_V]: what the state recalls for k
        delta = (v - memory) * beta
        # Positions at or past the row's length are right padding: the state stays as it was.
        state = tl.where(t < length, decayed + k[:, None] * delta[None, :], state)
        out = tl.sum(state * q[:, None], axis=0)
        position = (b * T + t) * HV + head  # [B, T, Hv] index, int64
        tl.store(out_ptr + position * DV + offs_v, out.to(out_ptr.dtype.element_ty), mask=mask_v)
        if SNAPSHOTS:
            snap = snap_ptr + position * DK * DV + offs_k[:, None] * DV + offs_v[None, :]
            tl.store(snap, state.to(snap_ptr.dtype.element_ty), mask=mask_kv)
    if not SNAPSHOTS:  # the final state [B, Hv, Dk, Dv]
        final = snap_ptr + (b * HV + head) * DK * DV + offs_k[:, None] * DV + offs_v[None, :]
        tl.store(final, state.to(snap_ptr.dtype.element_ty), mask=mask_kv)


def gated_delta_rule(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    beta: Tensor,
    state: Tensor,
    layer: int,
    slot_ids: Tensor,
    start_pos: Tensor,
    lengths: Tensor,
    block_v: int = CONFIGS["default"]["block_v"],
    num_warps: int = CONFIGS["default"]["num_warps"],
) -> tuple[Tensor, Tensor]:
    """(out [B, T, Hv, Dv] in q's dtype, the state after position lengths[b] - 1 [B, Hv, Dk, Dv] in the
    state's dtype); shapes as graphspec.ops.gated_delta_rule, inputs of any strides."""
    check_device(q, k, v, g, beta, state, slot_ids, start_pos, lengths)
    batch, t, _, key_dim = q.shape
    final = torch.empty((batch, v.shape[2], key_dim, v.shape[3]), dtype=state.dtype, device=q.device)
    if batch and t == 0:  # no position: the slot's state, as the reference
        final.copy_(gated_delta_rule_reference(q, k, v, g, beta, state, layer, slot_ids, start_pos, lengths)[1])
    out = launch("gated_delta_rule", q, k, v, g, beta, state, layer, slot_ids, start_pos, lengths.clamp(0, t),
                 final, block_v, num_warps)  # fmt: skip
    return out, final


def launch(
    name: str,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    beta: Tensor,
    state: Tensor,
    layer: int,
    slot_ids: Tensor,
    start_pos: Tensor | None,
    lengths: Tensor | None,
    dest: Tensor,
    block_v: int,
    num_warps: int,
) -> Tensor:
    """Run gated_delta_rule_kernel and return the output [B, T, Hv, Dv] in q's dtype. start_pos/lengths
    None: the verify form (SNAPSHOTS): dest [B, T, Hv, Dk, Dv] takes the state after every position; else
    dest [B, Hv, Dk, Dv] takes the state after position lengths[b] - 1. An empty batch or T = 0 launches
    nothing."""
    batch, t, key_heads, key_dim = q.shape
    value_heads, value_dim = v.shape[2], v.shape[3]
    if value_heads % key_heads or key_dim > MAX_HEAD_DIM:
        raise ValueError(f"{name} kernel: Hv={value_heads} over Hk={key_heads}, Dk={key_dim}")
    out = torch.empty((batch, t, value_heads, value_dim), dtype=q.dtype, device=q.device)
    if batch == 0 or t == 0:
        return out
    snapshots = start_pos is None
    if snapshots:  # the kernel reads neither in this form: slot_ids fills their places
        start_pos = lengths = slot_ids
    block_v = min(next_power_of_2(block_v), next_power_of_2(value_dim))
    grid = (batch * value_heads, cdiv(value_dim, block_v))
    layer_state = state[layer]  # a view: its offset is computed here in 64 bits, not in the kernel
    gated_delta_rule_kernel[grid](
        q, k, v, g, beta, layer_state, slot_ids, start_pos, lengths, out, dest,
        t, value_heads, value_heads // key_heads, key_dim**-0.5,
        *q.stride(), *k.stride(), *v.stride(), *g.stride(), *beta.stride(),
        *layer_state.stride(),
        DK=key_dim, DV=value_dim, BLOCK_K=next_power_of_2(key_dim), BLOCK_V=block_v, SNAPSHOTS=snapshots,
        num_warps=num_warps,
    )  # fmt: skip
    return out


@library.op("graphspec::gated_delta_rule_triton", mutates_args=())
def gated_delta_rule_triton(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    beta: Tensor,
    state: Tensor,
    layer: int,
    slot_ids: Tensor,
    start_pos: Tensor,
    lengths: Tensor,
    block_v: int,
    num_warps: int,
) -> tuple[Tensor, Tensor]:
    """graphspec::gated_delta_rule lowered to gated_delta_rule_kernel; the trailing ints are CONFIG_FIELDS."""
    return gated_delta_rule(q, k, v, g, beta, state, layer, slot_ids, start_pos, lengths, block_v, num_warps)


@torch.library.register_fake("graphspec::gated_delta_rule_triton")
def _(q, k, v, g, beta, state, layer, slot_ids, start_pos, lengths, block_v, num_warps):
    return v.new_empty(v.shape), state.new_empty((q.shape[0], *state.shape[2:]))
