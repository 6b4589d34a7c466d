"""graphspec::rotary_kv_attention on the CPU: the reference's rotary, the step's keys and values
copied into each row's slot, then kernels/attention_cpu.py's attention over each row's visible prefix
instead of the whole cache.

The op is a composite: the (optional per-head norms and) rotary are the reference's torch ops, so a
compiled CPU step fuses them with the projection around them; the cache write and the attention are
one opaque op, graphspec::kv_attention_cpu, because they read slots and positions on the host.

Every decoder layer of a fused step (fuse_kv_attention) is one of these; see attention_cpu.py for why
reading the prefix is allowed on the CPU (nothing is captured) and how dead positions stay unread.
The slots and start positions are read on the
host once and serve both the cache write (plain slice copies: the same values the reference's
indexed write stores) and the attention.
"""

from __future__ import annotations

from graphspec.kernels import attention_cpu_native, cpu_library
from graphspec.kernels.attention_cpu import attend_rows
from torch import Tensor

from graphspec import library
from graphspec.ops import qk_norm_reference, rotary_kv_attention_reference, rotary_reference, scale_heads

__all__ = [
    "CONFIGS",
    "kv_attention",
    "kv_attention_cpu",
    "kv_attention_fake",
    "rotary_kv_attention",
    "rotary_kv_attention_cpu",
]
__all__ += ["rotary_kv_attention_reference"]

CONFIGS: dict[str, dict[str, int]] = {"cpu": {}}


def kv_attention(
    q: Tensor, k: Tensor, v: Tensor, cache: Tensor, layer: int, slot_ids: Tensor, start_pos: Tensor, scale: float
) -> Tensor:
    """k, v [B, Hkv, T, D] written at positions start_pos[b] + t of slot slot_ids[b] (the values the
    reference's indexed write stores), then attention of q [B, Hq, T, D] -> [B, T, Hq, D]; both in one
    C++ call where it applies (kernels/attention_cpu_native.py)."""
    slots, starts = slot_ids.tolist(), start_pos.tolist()  # one host read each serves write and attention
    out = attention_cpu_native.attend(q, cache, layer, slots, starts, slot_ids, start_pos, scale, k, v)
    if out is not None:
        return out
    t = k.shape[2]
    keys_all, values_all = cache[layer]  # [SLOTS, Hkv, S, D] views
    for row, (slot, start) in enumerate(zip(slots, starts, strict=True)):
        keys_all[slot, :, start : start + t] = k[row]
        values_all[slot, :, start : start + t] = v[row]
    return attend_rows(q, cache, layer, slots, starts, scale)


def kv_attention_fake(q, k, v, cache, layer, slot_ids, start_pos, scale):
    batch, heads, t, head_dim = q.shape
    return q.new_empty((batch, t, heads, head_dim))


kv_attention_cpu = library.define_schema(
    "kv_attention_cpu(Tensor q, Tensor k, Tensor v, Tensor(a!) cache, SymInt layer, Tensor slot_ids, "
    "Tensor start_pos, float scale) -> Tensor",
    kv_attention,
    kv_attention_fake,
)


def rotary_kv_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    cos: Tensor,
    sin: Tensor,
    cache: Tensor,
    layer: int,
    slot_ids: Tensor,
    start_pos: Tensor,
    scale: float,
    q_norm: Tensor | None = None,
    k_norm: Tensor | None = None,
    norm_eps: float = 1e-6,
    causal: bool = True,
    row_src: Tensor | None = None,
    row_eps: float = 0.0,
) -> Tensor:
    """Same result as rotary_kv_attention_reference: the cache gets the same bits, the attention
    output matches to fp32 rounding. The registry lowers causal nodes only; a block (causal=False) runs
    the reference."""
    if not causal:
        return rotary_kv_attention_reference(
            q, k, v, cos, sin, cache, layer, slot_ids, start_pos, scale, q_norm, k_norm, norm_eps, causal, row_src,
            row_eps,
        )  # fmt: skip
    if row_src is not None:
        q, k, v = scale_heads((q, k, v), row_src, row_eps)
    q, k = qk_norm_reference(q, k, q_norm, k_norm, norm_eps)  # the reference's own steps up to the cache write
    q_rot, k_rot = rotary_reference(q, k, cos, sin)  # [B, Hq, T, D], [B, Hkv, T, D]
    return kv_attention_cpu(q_rot, k_rot, v, cache, layer, slot_ids, start_pos, scale)


rotary_kv_attention_cpu = cpu_library.define("rotary_kv_attention", rotary_kv_attention)
