"""graphspec::attention on the CPU: reads each row's committed prefix of the cache, not all of it.

The reference (graphspec.ops.attention_reference) gathers and scores the whole max_seq_len cache of
every row each call, so a CUDA graph sees the same shapes every step. On the CPU nothing is captured,
so this op reads each row's start position on the host and attends over exactly the positions that
row's queries can see, [0, start_pos[b] + T), with torch's fused CPU attention
(scaled_dot_product_attention). Positions past a row's last query (rejected drafts, other rows'
lengths, the NaN of the poisoning tests) are never read, so they cannot reach an output.

The host read is the op's own business: the step graph holds one graphspec::attention_cpu node and
no host-sync op (checks.no_host_sync_ops). Never capture it: lowering picks it only where nothing is
captured (lowering/registry.py, CPU_KERNELS). Imports torch only (no Triton), so choosing it never
creates Triton functions.

Registered through graphspec/library.py (torch.library.Library: no custom_op wrappers per call).
"""

from __future__ import annotations

import torch
from graphspec.kernels import attention_cpu_native, cpu_library
from torch import Tensor
from torch.nn.functional import scaled_dot_product_attention

from graphspec.ops import attention_reference

__all__ = ["CONFIGS", "attend_rows", "attention", "attention_cpu", "attention_reference"]

# No tunables: one row of the table so the CPU entry has the same shape as the Triton ones.
CONFIGS: dict[str, dict[str, int]] = {"cpu": {}}


def attend_rows(q: Tensor, cache: Tensor, layer: int, slots: list[int], starts: list[int], scale: float) -> Tensor:
    """Attention of q [B, Hq, T, D] for rows whose slots and start positions the host already has;
    returns [B, T, Hq, D] contiguous. Row b reads cache positions [0, starts[b] + T) only.
    At decode sizes each torch call here costs more than its arithmetic, so the loop makes few."""
    batch, q_heads, t, _ = q.shape
    kv_heads, max_len = cache.shape[3], cache.shape[4]
    gqa = q_heads != kv_heads
    query = q if q.dtype == torch.float32 else q.float()  # the reference computes in fp32
    keys_all, values_all = cache[layer]  # [SLOTS, Hkv, S, D] each
    if cache.dtype != torch.float32:
        keys_all, values_all = keys_all.float(), values_all.float()  # 16-bit caches (not the CPU's usual case)
    outputs = []
    for row, (slot, start) in enumerate(zip(slots, starts, strict=True)):
        length = min(start + t, max_len)  # the row's last query sees positions < start + T
        # Query t sees key j iff j <= start + t: the lower triangle shifted right by start. One query
        # (every draft forward) sees the whole prefix, so it needs no mask.
        mask = None if t == 1 else torch.ones(t, length, dtype=torch.bool).tril(start)
        outputs.append(
            scaled_dot_product_attention(
                query[row : row + 1],
                keys_all[slot : slot + 1, :, :length],  # [1, Hkv, length, D]: a view
                values_all[slot : slot + 1, :, :length],
                attn_mask=mask,
                scale=scale,
                enable_gqa=gqa,
            )
        )  # [1, Hq, T, D]
    out = outputs[0] if batch == 1 else torch.cat(outputs)
    return out.transpose(1, 2).to(q.dtype).contiguous()  # [B, T, Hq, D]


def attention(q: Tensor, cache: Tensor, layer: int, slot_ids: Tensor, start_pos: Tensor, scale: float) -> Tensor:
    """Same result as attention_reference (to fp32 rounding): q [B, Hq, T, D] with query t of row b at
    position start_pos[b] + t, against cache slot slot_ids[b] -> [B, T, Hq, D] contiguous. The row loop
    runs in C++ where it applies (kernels/attention_cpu_native.py), else through torch's attention."""
    # One host read each for the whole batch; on the CPU there is no device to wait for.
    slots, starts = slot_ids.tolist(), start_pos.tolist()
    out = attention_cpu_native.attend(q, cache, layer, slots, starts, slot_ids, start_pos, scale)
    return out if out is not None else attend_rows(q, cache, layer, slots, starts, scale)


def _fake(q: Tensor, cache: Tensor, layer: int, slot_ids: Tensor, start_pos: Tensor, scale: float) -> Tensor:
    batch, heads, t, head_dim = q.shape
    return q.new_empty((batch, t, heads, head_dim))


attention_cpu = cpu_library.define("attention", attention, _fake)
