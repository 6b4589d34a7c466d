"""A small aten-level graph with every hot graphspec op, traced by make_fx like the real step (the KV write
in place, as defunctionalize_kv leaves it: traced calls mutate the `cache` input)."""

from __future__ import annotations

import torch
from torch.fx.experimental.proxy_tensor import make_fx

from graphspec import ops

LAYER, SCALE, EPS = 1, 0.125, 1e-5


def hot_step(x, residual, weight, q, k, cos, sin, cache, slot_ids, start_pos, target_logits, draft_logits,
             draft_tokens, temperature, top_k, top_p, seed, counter):  # fmt: skip
    hidden = ops.rms_norm(x, weight, EPS)
    normed, total = ops.add_rms_norm(hidden, residual, weight, EPS)
    act = ops.silu_mul(total[..., 8:])  # a column slice: rows strided wider than 2I, as a fused projection's
    q_rot, k_rot = ops.rotary(q, k, cos, sin)
    # In place, with no users, as after defunctionalize_kv; v is the unrotated k (a transposed view).
    ops.kv_write(cache, LAYER, slot_ids, start_pos, k_rot, k)
    attn = ops.attention(q_rot, cache, LAYER, slot_ids, start_pos, SCALE)
    greedy_tokens, greedy_accepted = ops.verify_greedy(target_logits, draft_tokens)
    proposals = ops.argmax(draft_logits[:, -1])  # a slice of a wider tensor, as the draft's last logits
    tokens, accepted = ops.verify_rejection(
        target_logits, draft_logits, draft_tokens, temperature, top_k, top_p, seed, counter
    )
    drawn = ops.sample(draft_logits[:, -1], temperature, top_k, top_p, seed, counter, ops.DRAFT_LANE + 1)
    return normed, total, act, k_rot, attn, greedy_tokens, greedy_accepted, proposals, tokens, accepted, drawn


def hot_inputs(head_dim: int = 64, batch: int = 2, t: int = 3, vocab: int = 40, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    hidden, q_heads, kv_heads, seq = 32, 4, 2, 24
    target_logits = torch.randn(batch, t, vocab, generator=g)
    draft_logits = target_logits[:, :-1] + torch.randn(batch, t - 1, vocab, generator=g)
    return [
        torch.randn(batch, t, hidden, generator=g),
        torch.randn(batch, t, hidden, generator=g),
        1 + 0.1 * torch.randn(hidden, generator=g),
        torch.randn(batch, t, q_heads, head_dim, generator=g).transpose(1, 2),
        torch.randn(batch, t, kv_heads, head_dim, generator=g).transpose(1, 2),
        torch.randn(batch, t, head_dim, generator=g),
        torch.randn(batch, t, head_dim, generator=g),
        torch.randn(2, 2, batch + 1, kv_heads, seq, head_dim, generator=g),
        torch.tensor([2, 0])[:batch],
        torch.tensor([4, 17])[:batch],
        target_logits,
        draft_logits,
        target_logits[:, :-1].argmax(-1),
        torch.tensor([0.0, 0.9])[:batch],
        torch.tensor([0, 5])[:batch],
        torch.tensor([1.0, 0.8])[:batch],
        torch.tensor([3, 4])[:batch],
        torch.tensor([7, 7])[:batch],
    ]


def traced(inputs: list[torch.Tensor]) -> torch.fx.GraphModule:
    """make_fx graph; every node carries meta["val"] (fake tensors), as traced steps do."""
    return make_fx(hot_step, tracing_mode="fake")(*inputs)
