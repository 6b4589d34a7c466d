"""graphspec:: custom ops: one graph node per hot or stateful operation.

Every op has a fake (meta) implementation for tracing and a pure-torch reference implementation that
runs anywhere; the reference is the test oracle and the fallback when no kernel fits. Lowering
(graphspec.lowering) swaps reference nodes for Triton kernel ops with the same signature.

Shapes use the dimension letters of STYLE.md: B batch rows, K draft tokens, T query tokens per row,
S cache length, H heads (Hq query, Hkv key/value), D head dim, V vocab, L layers.

KV cache layout (one tensor per model): [L, 2, SLOTS, Hkv, S, D]; index 0 of dim 1 holds keys, 1
values. Batch row b reads and writes cache slot `slot_ids[b]`. The runtime keeps one spare slot
(the last) that padded rows are redirected to, so they never touch a real row's slot.

Every op returns contiguous tensors and its fake says so: traced code picks view vs copy from the
fake strides, so real and fake layouts must agree.

Randomness is counter based: uniform(seed, counter, lane) is a hash, so sampling needs no RNG
state, is reproducible per row whatever the batch composition, and replays inside CUDA graphs.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from graphspec import library
from graphspec.errors import InputError

# Lanes of the per-row random stream; one step uses lanes DRAFT_LANE + i, ACCEPT_LANE + j, RESAMPLE_LANE,
# and TARGET_LANE where a row's drafts run out before K (its next token then comes from the target alone).
DRAFT_LANE = 0
ACCEPT_LANE = 64
RESAMPLE_LANE = 128
TARGET_LANE = 129

_MASK32 = 0xFFFFFFFF


# --------------------------------------------------------------------------------------------------
# Normalization and rotary embedding
# --------------------------------------------------------------------------------------------------


def rms_norm_reference(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    # Same rounding as transformers' LlamaRMSNorm: normalize in fp32, scale in the model dtype.
    hidden = x.to(torch.float32)
    variance = hidden.pow(2).mean(-1, keepdim=True)
    hidden = hidden * torch.rsqrt(variance + eps)
    return weight * hidden.to(x.dtype)


@library.op("graphspec::rms_norm", mutates_args=())
def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """RMSNorm over the last dim. x [..., D], weight [D]."""
    return rms_norm_reference(x, weight, eps).contiguous()


@torch.library.register_fake("graphspec::rms_norm")
def _(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    return x.new_empty(x.shape)


def add_rms_norm_reference(x: Tensor, residual: Tensor, weight: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    total = residual + x
    return rms_norm_reference(total, weight, eps), total


@library.op("graphspec::add_rms_norm", mutates_args=())
def add_rms_norm(x: Tensor, residual: Tensor, weight: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    """Residual add then RMSNorm: returns (rms_norm(residual + x), residual + x)."""
    normed, total = add_rms_norm_reference(x, residual, weight, eps)
    return normed.contiguous(), total.contiguous()


@torch.library.register_fake("graphspec::add_rms_norm")
def _(x: Tensor, residual: Tensor, weight: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    return x.new_empty(x.shape), x.new_empty(x.shape)


def embed_norm_concat_reference(
    tokens: Tensor, embed_weight: Tensor, embed_norm: Tensor, hidden: Tensor, hidden_norm: Tensor, eps: float
) -> Tensor:
    embedded = torch.nn.functional.embedding(tokens, embed_weight)
    normed = (rms_norm_reference(embedded, embed_norm, eps), rms_norm_reference(hidden, hidden_norm, eps))
    return torch.cat(normed, dim=-1)


@library.op("graphspec::embed_norm_concat", mutates_args=())
def embed_norm_concat(
    tokens: Tensor, embed_weight: Tensor, embed_norm: Tensor, hidden: Tensor, hidden_norm: Tensor, eps: float
) -> Tensor:
    """[rms_norm(embed(tokens), embed_norm), rms_norm(hidden, hidden_norm)] along the last dim: the input of
    an MTP layer's eh_proj and of an EAGLE-3 midlayer's q/k/v. tokens [...], hidden [..., H] -> [..., 2H]."""
    return embed_norm_concat_reference(tokens, embed_weight, embed_norm, hidden, hidden_norm, eps)


@torch.library.register_fake("graphspec::embed_norm_concat")
def _(tokens: Tensor, embed_weight: Tensor, embed_norm: Tensor, hidden: Tensor, hidden_norm: Tensor, eps: float):
    return hidden.new_empty((*hidden.shape[:-1], 2 * hidden.shape[-1]))


def rope_tables_reference(positions: Tensor, inv_freq: Tensor, scale: float) -> tuple[Tensor, Tensor]:
    freqs = positions.to(torch.float32)[..., None] * inv_freq  # [..., D/2]
    angles = torch.cat((freqs, freqs), dim=-1)  # [..., D]
    if scale == 1.0:  # most rope types: no multiply
        return angles.cos(), angles.sin()
    return angles.cos() * scale, angles.sin() * scale


@library.op("graphspec::rope_tables", mutates_args=())
def rope_tables(positions: Tensor, inv_freq: Tensor, scale: float) -> tuple[Tensor, Tensor]:
    """cos and sin [..., D] (fp32) of integer positions [...]: angles position * inv_freq [D/2] (fp32), the
    halves repeated (rotate_half's layout), times scale (a rope type's attention factor), as transformers'
    rotary embeddings compute them. One op so that a GPU computes both tables in one launch (the cast,
    multiply, cat, cos and sin were five in every forward)."""
    return rope_tables_reference(positions, inv_freq, scale)


@torch.library.register_fake("graphspec::rope_tables")
def _(positions: Tensor, inv_freq: Tensor, scale: float) -> tuple[Tensor, Tensor]:
    shape = (*positions.shape, 2 * inv_freq.shape[-1])
    return inv_freq.new_empty(shape, dtype=torch.float32), inv_freq.new_empty(shape, dtype=torch.float32)


def rotate_half(x: Tensor) -> Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rotary_reference(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
    cos = cos.unsqueeze(1).to(q.dtype)  # [B, 1, T, D]
    sin = sin.unsqueeze(1).to(q.dtype)
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


@library.op("graphspec::rotary", mutates_args=())
def rotary(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
    """Rotary embedding (rotate-half convention). q [B, Hq, T, D], k [B, Hkv, T, D], cos/sin [B, T, D]."""
    q_out, k_out = rotary_reference(q, k, cos, sin)
    return q_out.contiguous(), k_out.contiguous()


@torch.library.register_fake("graphspec::rotary")
def _(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
    return q.new_empty(q.shape), k.new_empty(k.shape)


def silu_mul_reference(gate_up: Tensor) -> Tensor:
    gate, up = gate_up.chunk(2, dim=-1)
    return torch.nn.functional.silu(gate) * up


@library.op("graphspec::silu_mul", mutates_args=())
def silu_mul(gate_up: Tensor) -> Tensor:
    """SwiGLU activation of the fused gate/up projection: gate_up [..., 2I] -> silu(gate) * up [..., I]."""
    return silu_mul_reference(gate_up).contiguous()


@torch.library.register_fake("graphspec::silu_mul")
def _(gate_up: Tensor) -> Tensor:
    return gate_up.new_empty((*gate_up.shape[:-1], gate_up.shape[-1] // 2))


def scaled_silu_mul_reference(gate_up: Tensor, x: Tensor, eps: float) -> Tensor:
    # The row scale r = rsqrt(mean(x^2) + eps) of an RMSNorm, applied to a projection of the un-normalized row
    # x (the norm's weight folded into the projection, models/fold_norms.py): r * (x @ (W * g).T) is
    # rms_norm(x, g) @ W.T. One rounding at the end: the scaled gate and up never exist in the dtype.
    gate, up = (gate_up.to(torch.float32) * inverse_rms_reference(x, eps)).chunk(2, dim=-1)
    return (torch.nn.functional.silu(gate) * up).to(gate_up.dtype)


@library.op("graphspec::scaled_silu_mul", mutates_args=())
def scaled_silu_mul(gate_up: Tensor, x: Tensor, eps: float) -> Tensor:
    """silu_mul of gate_up [..., 2I] scaled by the RMSNorm row scale of x [..., H] (the rows gate_up projects):
    silu(r * gate) * (r * up), r = rsqrt(mean(x^2) + eps) per row."""
    return scaled_silu_mul_reference(gate_up, x, eps).contiguous()


@torch.library.register_fake("graphspec::scaled_silu_mul")
def _(gate_up: Tensor, x: Tensor, eps: float) -> Tensor:
    return gate_up.new_empty((*gate_up.shape[:-1], gate_up.shape[-1] // 2))


def scaled_silu_mul_linear_reference(x: Tensor, weight_t: Tensor, eps: float) -> Tensor:
    # scaled_silu_mul of x's own gate/up projection: the product rounded to x's dtype (as the matmul writes it),
    # then scaled by x's RMSNorm row scale, the SwiGLU in fp32 and one rounding.
    return scaled_silu_mul_reference(torch.mm(x, weight_t), x, eps)


@library.op("graphspec::scaled_silu_mul_linear", mutates_args=())
def scaled_silu_mul_linear(x: Tensor, weight_t: Tensor, eps: float) -> Tensor:
    """graphspec::scaled_silu_mul(x @ weight_t, x, eps) as one op, for x [M, H] and a gate/up weight's transposed
    view weight_t [H, 2I]: [M, I]. The decoder emits it for one-row MLPs with a folded norm (models/decoder.py),
    where one kernel streams the weight and takes the row scale from the x it reads anyway
    (kernels/scaled_silu_mul_linear.py)."""
    return scaled_silu_mul_linear_reference(x, weight_t, eps).contiguous()


@torch.library.register_fake("graphspec::scaled_silu_mul_linear")
def _(x: Tensor, weight_t: Tensor, eps: float) -> Tensor:
    return x.new_empty((x.shape[0], weight_t.shape[1] // 2))


def inverse_rms_reference(x: Tensor, eps: float) -> Tensor:
    """An RMSNorm's row scale rsqrt(mean(x^2) + eps) of x [..., H] in fp32, [..., 1]."""
    return torch.rsqrt(x.to(torch.float32).pow(2).mean(-1, keepdim=True) + eps)


def row_scale_reference(x: Tensor, src: Tensor, eps: float) -> Tensor:
    # A projection x of the un-normalized rows src whose RMSNorm weight was folded into the projection's weight
    # (models/fold_norms.py), times the norm's row scale: rms_norm(src, g) @ W.T = r(src) * (src @ (W * g).T).
    # One rounding: the scaled product, in x's dtype.
    return (x.to(torch.float32) * inverse_rms_reference(src, eps)).to(x.dtype)


@library.op("graphspec::row_scale", mutates_args=())
def row_scale(x: Tensor, src: Tensor, eps: float) -> Tensor:
    """x [..., N] times the RMSNorm row scale of src [..., H] (the rows x projects): x * rsqrt(mean(src^2) + eps)
    per row. The fuse_row_scale pass moves it into the rotary_kv_attention that reads it."""
    return row_scale_reference(x, src, eps).contiguous()


@torch.library.register_fake("graphspec::row_scale")
def _(x: Tensor, src: Tensor, eps: float) -> Tensor:
    return x.new_empty(x.shape)


# --------------------------------------------------------------------------------------------------
# KV cache
# --------------------------------------------------------------------------------------------------


def _write_kv_rows(cache: Tensor, layer: int, slot_ids: Tensor, start_pos: Tensor, k: Tensor, v: Tensor) -> None:
    """KV write: k, v [B, Hkv, T, D] land in layer `layer` of the cache [L, 2, SLOTS, Hkv, S, D] at positions
    start_pos[b] + t of slot slot_ids[b]."""
    t = k.shape[2]
    positions = start_pos[:, None] + torch.arange(t, device=k.device)  # [B, T]
    slots = slot_ids[:, None].expand_as(positions)
    for kind, values in ((0, k), (1, v)):
        # [SLOTS, S, Hkv, D] view so both advanced indices are adjacent; writes go to the cache storage.
        view = cache[layer, kind].permute(0, 2, 1, 3)
        view[slots, positions] = values.permute(0, 2, 1, 3).to(cache.dtype)


# kv_update returns a copy of the cache with k/v written (what tracing emits); kv_write writes in place.
kv_update, kv_write = library.state_update_ops("kv", _write_kv_rows)


# --------------------------------------------------------------------------------------------------
# Drafter state: position-indexed rows per cache slot (token history, ...)
# --------------------------------------------------------------------------------------------------


def _write_slot_rows(state: Tensor, slot_ids: Tensor, start_pos: Tensor, values: Tensor) -> None:
    """Drafter state write: values [B, T, ...] land in state [SLOTS, S, ...] at positions start_pos[b] + t
    of slot slot_ids[b]."""
    positions = start_pos[:, None] + torch.arange(values.shape[1], device=values.device)  # [B, T]
    state[slot_ids[:, None].expand_as(positions), positions] = values.to(state.dtype)


slot_update, slot_write = library.state_update_ops("slot", _write_slot_rows)


def qk_norm_reference(
    q: Tensor, k: Tensor, q_norm: Tensor | None, k_norm: Tensor | None, eps: float
) -> tuple[Tensor, Tensor]:
    """Qwen3's per-head rms_norm of q and of k over the head dim, each only where its weight is given."""
    if q_norm is not None:
        q = rms_norm_reference(q, q_norm, eps)
    if k_norm is not None:
        k = rms_norm_reference(k, k_norm, eps)
    return q, k


def rotary_kv_write_reference(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    cos: Tensor,
    sin: Tensor,
    cache: Tensor,
    layer: int,
    slot_ids: Tensor,
    start_pos: Tensor,
    q_norm: Tensor | None = None,
    k_norm: Tensor | None = None,
    norm_eps: float = 1e-6,
) -> Tensor:
    # Exactly [rms_norm of q and k,] rotary then kv_write: the same roundings in the same order, so
    # bit-identical to those ops.
    q, k = qk_norm_reference(q, k, q_norm, k_norm, norm_eps)
    q_out, k_out = rotary_reference(q, k, cos, sin)
    _write_kv_rows(cache, layer, slot_ids, start_pos, k_out, v)
    return q_out.contiguous()


@library.op("graphspec::rotary_kv_write", mutates_args=("cache",))
def rotary_kv_write(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    cos: Tensor,
    sin: Tensor,
    cache: Tensor,
    layer: int,
    slot_ids: Tensor,
    start_pos: Tensor,
    q_norm: Tensor | None = None,
    k_norm: Tensor | None = None,
    norm_eps: float = 1e-6,
) -> Tensor:
    """rotary(q, k, cos, sin) followed by the in-place kv_write of the rotated k and v, as one op:
    returns q rotated (contiguous [B, Hq, T, D]); the rotated k exists only in the cache. Shapes as in
    rotary and kv_write. The fuse_rotary_kv pass makes it from the pair. With q_norm and k_norm ([D]
    weights; per-head norms) q and k are first rms_norm'ed over the head dim (fuse_qk_norm folds them in:
    DFlash's context rows, whose k is normed and q is that same k)."""
    return rotary_kv_write_reference(q, k, v, cos, sin, cache, layer, slot_ids, start_pos, q_norm, k_norm, norm_eps)


@torch.library.register_fake("graphspec::rotary_kv_write")
def _(q, k, v, cos, sin, cache, layer, slot_ids, start_pos, q_norm=None, k_norm=None, norm_eps=1e-6):
    return q.new_empty(q.shape)


# --------------------------------------------------------------------------------------------------
# Attention over the cache
# --------------------------------------------------------------------------------------------------


def attention_reference(
    q: Tensor, cache: Tensor, layer: int, slot_ids: Tensor, start_pos: Tensor, scale: float, causal: bool = True
) -> Tensor:
    q_heads, t = q.shape[1], q.shape[2]
    keys = cache[layer, 0].index_select(0, slot_ids).to(torch.float32)  # [B, Hkv, S, D]
    values = cache[layer, 1].index_select(0, slot_ids).to(torch.float32)
    group = q_heads // keys.shape[1]
    keys = keys.repeat_interleave(group, dim=1)  # [B, Hq, S, D]
    values = values.repeat_interleave(group, dim=1)
    scores = torch.matmul(q.to(torch.float32), keys.transpose(2, 3)) * scale  # [B, Hq, T, S]
    # Query t of row b sits at position start_pos[b] + t and sees cache positions <= that; without
    # `causal` every query of the row sees the whole block, positions <= start_pos[b] + T - 1.
    key_pos = torch.arange(keys.shape[2], device=q.device)
    query_pos = start_pos[:, None] + torch.arange(t, device=q.device)  # [B, T]
    if not causal:
        query_pos = query_pos[:, -1:].expand(-1, t)
    visible = key_pos[None, None, :] <= query_pos[:, :, None]  # [B, T, S]
    scores = scores.masked_fill(~visible[:, None], float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    # Positions no query of the row can see hold dead KV (rejected drafts, padding garbage, NaN in
    # the poisoning tests); a zero probability times NaN is still NaN, so zero them out.
    dead = key_pos[None, :] > query_pos[:, -1:]  # [B, S]
    values = values.masked_fill(dead[:, None, :, None], 0.0)
    return torch.matmul(probs, values).to(q.dtype).transpose(1, 2)  # [B, T, Hq, D]


@library.op("graphspec::attention", mutates_args=())
def attention(q: Tensor, cache: Tensor, layer: int, slot_ids: Tensor, start_pos: Tensor, scale: float) -> Tensor:
    """Causal attention of q [B, Hq, T, D] (query t at position start_pos[b] + t) against the cache
    slot of each row; GQA when Hq is a multiple of Hkv. Returns [B, T, Hq, D]: token-major, so the
    output projection reads it as a plain [B, T, Hq * D] view (no transpose copy, and a layout that
    lets matmul fold the batch into one GEMM instead of a batched GEMM over an expanded weight)."""
    return attention_reference(q, cache, layer, slot_ids, start_pos, scale).contiguous()


@torch.library.register_fake("graphspec::attention")
def _(q: Tensor, cache: Tensor, layer: int, slot_ids: Tensor, start_pos: Tensor, scale: float) -> Tensor:
    batch, heads, t, head_dim = q.shape
    return q.new_empty((batch, t, heads, head_dim))


@library.op("graphspec::block_attention", mutates_args=())
def block_attention(q: Tensor, cache: Tensor, layer: int, slot_ids: Tensor, start_pos: Tensor, scale: float) -> Tensor:
    """Non-causal block attention (DFlash's drafter): q [B, Hq, T, D] holds a block of T queries at
    positions start_pos[b] .. start_pos[b] + T - 1, whose keys are already in the cache; every query of
    the block sees every cache position <= start_pos[b] + T - 1 of its row's slot (the context before
    the block and the whole block, no causal mask inside it). GQA and the [B, T, Hq, D] output as in
    attention."""
    return attention_reference(q, cache, layer, slot_ids, start_pos, scale, causal=False).contiguous()


@torch.library.register_fake("graphspec::block_attention")
def _(q: Tensor, cache: Tensor, layer: int, slot_ids: Tensor, start_pos: Tensor, scale: float) -> Tensor:
    batch, heads, t, head_dim = q.shape
    return q.new_empty((batch, t, heads, head_dim))


def rotary_kv_attention_reference(
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
    # Exactly [row_scale of q, k and v,] [rms_norm of q and k,] rotary_kv_write, then attention (block_attention
    # when not causal): bit-identical to those ops.
    if row_src is not None:
        q, k, v = scale_heads((q, k, v), row_src, row_eps)
    q_rot = rotary_kv_write_reference(q, k, v, cos, sin, cache, layer, slot_ids, start_pos, q_norm, k_norm, norm_eps)
    return attention_reference(q_rot, cache, layer, slot_ids, start_pos, scale, causal).contiguous()


def scale_heads(heads: tuple[Tensor, ...], src: Tensor, eps: float) -> tuple[Tensor, ...]:
    """Each [B, H, T, D] tensor of `heads` times the RMSNorm row scale of src [B, T, hidden] at its (b, t), rounded
    once: row_scale of the projection the heads are views of, moved past its split and transpose."""
    scale = inverse_rms_reference(src, eps)[:, None]  # [B, 1, T, 1]
    return tuple((x.to(torch.float32) * scale).to(x.dtype) for x in heads)


@library.op("graphspec::rotary_kv_attention", mutates_args=("cache",))
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
    """rotary_kv_write (rotary of q and k, the rotated k and v written into the cache) followed by
    attention of the rotated q, as one op: returns attention's [B, T, Hq, D]; neither rotated tensor
    exists outside the op. Shapes as in rotary_kv_write and attention. The fuse_kv_attention pass makes
    it from the pair, so one kernel launch does both. With q_norm and k_norm ([D] weights; Qwen3's
    per-head norms) q and k are first rms_norm'ed over the head dim (fuse_qk_norm folds them in).
    causal=False: the attention is block_attention's (DFlash's block, no causal mask inside it). With row_src
    [B, T, hidden] (the un-normalized rows q, k and v were projected from, a folded input norm: fuse_row_scale)
    q, k and v are first scaled by its rows' rsqrt(mean(src^2) + row_eps), as graphspec::row_scale would."""
    return rotary_kv_attention_reference(
        q, k, v, cos, sin, cache, layer, slot_ids, start_pos, scale, q_norm, k_norm, norm_eps, causal, row_src, row_eps
    )


@torch.library.register_fake("graphspec::rotary_kv_attention")
def _(q, k, v, cos, sin, cache, layer, slot_ids, start_pos, scale, q_norm=None, k_norm=None, norm_eps=1e-6,
      causal=True, row_src=None, row_eps=0.0):  # fmt: skip
    batch, heads, t, head_dim = q.shape
    return q.new_empty((batch, t, heads, head_dim))


def prefill_attention_reference(
    q: Tensor, k: Tensor, v: Tensor, cache: Tensor, layer: int, slot_ids: Tensor, start_pos: Tensor, scale: float
) -> Tensor:
    # Exactly kv_write then attention: the chunk's keys enter the cache first, so query t sees the
    # row's cached prefix (positions < start_pos) and the chunk's keys up to itself.
    _write_kv_rows(cache, layer, slot_ids, start_pos, k, v)
    return attention_reference(q, cache, layer, slot_ids, start_pos, scale).contiguous()


@library.op("graphspec::prefill_attention", mutates_args=("cache",))
def prefill_attention(
    q: Tensor, k: Tensor, v: Tensor, cache: Tensor, layer: int, slot_ids: Tensor, start_pos: Tensor, scale: float
) -> Tensor:
    """One prefill chunk's attention: k and v [B, Hkv, T, D] (rotated k) are written into the cache at
    positions start_pos[b] + t of slot slot_ids[b], and q [B, Hq, T, D] (rotated) attends causally to
    the row's cached prefix and the chunk. Returns [B, T, Hq, D] like attention. The
    fuse_prefill_attention pass makes it from a prefill program's kv_write + attention pair; its
    kernel (kernels/prefill_attention.py) reads the chunk's keys from k/v, not back from the cache."""
    return prefill_attention_reference(q, k, v, cache, layer, slot_ids, start_pos, scale)


@torch.library.register_fake("graphspec::prefill_attention")
def _(q, k, v, cache, layer, slot_ids, start_pos, scale):
    batch, heads, t, head_dim = q.shape
    return q.new_empty((batch, t, heads, head_dim))


# --------------------------------------------------------------------------------------------------
# Hybrid (Gated DeltaNet) layers: zero-centred norms, the causal conv1d and the gated delta rule
# --------------------------------------------------------------------------------------------------
# Linear-attention state lives per layer and cache slot: conv state [Lg, SLOTS, C, W-1] (the last W-1
# conv inputs, model dtype) and recurrent state [Lg, SLOTS, Hv, Dk, Dv] (fp32). Each op reads the
# state of slot_ids[b] at `layer` and returns what the state becomes: after position lengths[b] - 1
# (prefill and plain decode; positions at or past lengths[b] are right padding and leave it as it
# was), or after every position (the verify forward's snapshots, one per verified position, of
# which the accept region keeps the one at each row's accepted count).


def offset_rms_norm_reference(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    # Same rounding as transformers' Qwen3NextRMSNorm: normalize and scale by (1 + w) in fp32, then cast.
    hidden = x.to(torch.float32)
    hidden = hidden * torch.rsqrt(hidden.pow(2).mean(-1, keepdim=True) + eps)
    return (hidden * (1.0 + weight.to(torch.float32))).to(x.dtype)


@library.op("graphspec::offset_rms_norm", mutates_args=())
def offset_rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """Zero-centred RMSNorm (Qwen3-Next / Qwen3.5): normalize x [..., D] over the last dim, scale by
    (1 + weight [D]). Its weights are stored as offsets from one."""
    return offset_rms_norm_reference(x, weight, eps).contiguous()


@torch.library.register_fake("graphspec::offset_rms_norm")
def _(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    return x.new_empty(x.shape)


def add_offset_rms_norm_reference(x: Tensor, residual: Tensor, weight: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    total = residual + x  # rounded to the dtype, as the hybrid layers' plain residual adds are
    return offset_rms_norm_reference(total, weight, eps), total


@library.op("graphspec::add_offset_rms_norm", mutates_args=())
def add_offset_rms_norm(x: Tensor, residual: Tensor, weight: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    """Residual add then zero-centred RMSNorm: (offset_rms_norm(residual + x), residual + x)."""
    normed, total = add_offset_rms_norm_reference(x, residual, weight, eps)
    return normed.contiguous(), total.contiguous()


@torch.library.register_fake("graphspec::add_offset_rms_norm")
def _(x: Tensor, residual: Tensor, weight: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    return x.new_empty(x.shape), x.new_empty(x.shape)


def gated_rms_norm_reference(x: Tensor, gate: Tensor, weight: Tensor, eps: float) -> Tensor:
    # transformers' Qwen3NextRMSNormGated: normalize in fp32, scale in the input dtype, gate in fp32.
    hidden = x.to(torch.float32)
    hidden = hidden * torch.rsqrt(hidden.pow(2).mean(-1, keepdim=True) + eps)
    hidden = weight * hidden.to(x.dtype)
    return (hidden * torch.nn.functional.silu(gate.to(torch.float32))).to(x.dtype)


@library.op("graphspec::gated_rms_norm", mutates_args=())
def gated_rms_norm(x: Tensor, gate: Tensor, weight: Tensor, eps: float) -> Tensor:
    """RMSNorm of x [..., D] scaled by weight [D], then times silu(gate [..., D]): the Gated DeltaNet
    output norm (norm before gate)."""
    return gated_rms_norm_reference(x, gate, weight, eps).contiguous()


@torch.library.register_fake("graphspec::gated_rms_norm")
def _(x: Tensor, gate: Tensor, weight: Tensor, eps: float) -> Tensor:
    return x.new_empty(x.shape)


def gdn_gates_reference(a: Tensor, b: Tensor, a_log: Tensor, dt_bias: Tensor) -> tuple[Tensor, Tensor]:
    # transformers' Gated DeltaNet: the log decay in fp32, beta in the input dtype.
    g = -a_log.float().exp() * torch.nn.functional.softplus(a.float() + dt_bias)
    return g, b.sigmoid()


@library.op("graphspec::gdn_gates", mutates_args=())
def gdn_gates(a: Tensor, b: Tensor, a_log: Tensor, dt_bias: Tensor) -> tuple[Tensor, Tensor]:
    """The Gated DeltaNet's per-head gates from its projections a, b [..., Hv] and parameters A_log,
    dt_bias [Hv]: (g = -exp(A_log) * softplus(a + dt_bias) in fp32, beta = sigmoid(b))."""
    g, beta = gdn_gates_reference(a, b, a_log, dt_bias)
    return g.contiguous(), beta.contiguous()


@torch.library.register_fake("graphspec::gdn_gates")
def _(a: Tensor, b: Tensor, a_log: Tensor, dt_bias: Tensor) -> tuple[Tensor, Tensor]:
    return a.new_empty(a.shape, dtype=torch.float32), b.new_empty(b.shape)


def _initial(state: Tensor, layer: int, slot_ids: Tensor, start_pos: Tensor | None) -> Tensor:
    # The slot's state at `layer` [B, ...]; a row at position 0 starts a sequence: from zeros, as in
    # transformers' fresh cache, whatever the slot held before (where: even NaN does not leak through).
    initial = state[layer].index_select(0, slot_ids)
    if start_pos is None:
        return initial
    fresh = (start_pos == 0).reshape((-1,) + (1,) * (initial.dim() - 1))
    return torch.where(fresh, torch.zeros_like(initial), initial)


def _conv_window(
    x: Tensor, conv_state: Tensor, layer: int, slot_ids: Tensor, weight: Tensor, start_pos: Tensor | None
) -> tuple[Tensor, Tensor]:
    # x [B, T, C]; returns (silu(conv) [B, T, C], window [B, C, W-1+T]): the slot's last W-1 inputs,
    # then the chunk's. Column W-1+t holds x_t, so the state after x_t is columns t+1 .. t+W-1.
    history = _initial(conv_state, layer, slot_ids, start_pos)  # [B, C, W-1]
    window = torch.cat((history, x.transpose(1, 2).to(history.dtype)), dim=-1).to(weight.dtype)
    out = torch.nn.functional.conv1d(window, weight.unsqueeze(1), groups=weight.shape[0])  # [B, C, T]
    return torch.nn.functional.silu(out).to(x.dtype).transpose(1, 2), window


def causal_conv1d_reference(
    x: Tensor, conv_state: Tensor, layer: int, slot_ids: Tensor, weight: Tensor, start_pos: Tensor, lengths: Tensor
) -> tuple[Tensor, Tensor]:
    out, window = _conv_window(x, conv_state, layer, slot_ids, weight, start_pos)
    width = conv_state.shape[-1]
    # State after position lengths[b] - 1: columns lengths[b] .. lengths[b] + W-2 (the old state at 0).
    columns = lengths.clamp(0, x.shape[1])[:, None] + torch.arange(width, device=x.device)  # [B, W-1]
    final = window.gather(2, columns[:, None, :].expand(-1, window.shape[1], -1))
    return out.contiguous(), final.to(conv_state.dtype).contiguous()


@library.op("graphspec::causal_conv1d", mutates_args=())
def causal_conv1d(
    x: Tensor, conv_state: Tensor, layer: int, slot_ids: Tensor, weight: Tensor, start_pos: Tensor, lengths: Tensor
) -> tuple[Tensor, Tensor]:
    """Depthwise causal conv1d + SiLU of x [B, T, C] (kernel weight [C, W]) continuing the conv state
    [Lg, SLOTS, C, W-1] of slot slot_ids[b] at `layer` (zeros where start_pos[b] == 0: a new sequence).
    Returns (out [B, T, C], the state after position lengths[b] - 1 [B, C, W-1]); lengths [B] in 0..T:
    positions past it are right padding."""
    return causal_conv1d_reference(x, conv_state, layer, slot_ids, weight, start_pos, lengths)


@torch.library.register_fake("graphspec::causal_conv1d")
def _(x, conv_state, layer, slot_ids, weight, start_pos, lengths):
    return x.new_empty(x.shape), conv_state.new_empty((x.shape[0], *conv_state.shape[2:]))


def causal_conv1d_snapshots_reference(
    x: Tensor, conv_state: Tensor, layer: int, slot_ids: Tensor, weight: Tensor
) -> tuple[Tensor, Tensor]:
    out, window = _conv_window(x, conv_state, layer, slot_ids, weight, None)
    width = conv_state.shape[-1]
    snapshots = window.unfold(2, width, 1)[:, :, 1:]  # [B, C, T, W-1]: the state after each position
    return out.contiguous(), snapshots.transpose(1, 2).to(conv_state.dtype).contiguous()


@library.op("graphspec::causal_conv1d_snapshots", mutates_args=())
def causal_conv1d_snapshots(
    x: Tensor, conv_state: Tensor, layer: int, slot_ids: Tensor, weight: Tensor
) -> tuple[Tensor, Tensor]:
    """causal_conv1d over verify positions (never position 0): returns (out [B, T, C], the state after
    every position [B, T, C, W-1]); the slot's state itself is not advanced."""
    return causal_conv1d_snapshots_reference(x, conv_state, layer, slot_ids, weight)


@torch.library.register_fake("graphspec::causal_conv1d_snapshots")
def _(x, conv_state, layer, slot_ids, weight):
    batch, t, _ = x.shape
    return x.new_empty(x.shape), conv_state.new_empty((batch, t, *conv_state.shape[2:]))


def _l2norm(x: Tensor, eps: float = 1e-6) -> Tensor:
    # As transformers' (and FLA's) l2norm in the gated delta rule.
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + eps)


def gated_delta_rule_scan(
    q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, initial: Tensor, lengths: Tensor | None
) -> tuple[Tensor, list[Tensor]]:
    """The gated delta rule token by token, with transformers' torch_recurrent_gated_delta_rule's
    arithmetic. q, k [B, T, Hk, Dk], v [B, T, Hv, Dv], g and beta [B, T, Hv], initial [B, Hv, Dk, Dv]
    fp32. Returns out [B, T, Hv, Dv] (q's dtype) and the state after each position (fp32 [B, Hv, Dk, Dv]);
    with lengths [B], positions t >= lengths[b] leave the state as it was."""
    dtype = q.dtype
    group = v.shape[2] // k.shape[2]  # grouped value attention: each q/k head serves `group` value heads
    q, k = q.repeat_interleave(group, dim=2), k.repeat_interleave(group, dim=2)
    q, k, v, beta, g = (t.transpose(1, 2).to(torch.float32) for t in (q, k, v, beta, g))  # [B, H, T, ...]
    q, k = _l2norm(q), _l2norm(k)
    q = q / (q.shape[-1] ** 0.5)
    state = initial.to(torch.float32)
    out, states = [], []
    for t in range(q.shape[2]):
        step = state * g[:, :, t].exp()[..., None, None]
        memory = (step * k[:, :, t, :, None]).sum(dim=-2)  # [B, H, Dv]
        delta = (v[:, :, t] - memory) * beta[:, :, t, None]
        step = step + k[:, :, t, :, None] * delta[:, :, None, :]
        if lengths is not None:  # right padding: keep the state (where, so garbage never leaks in)
            step = torch.where((t < lengths)[:, None, None, None], step, state)
        state = step
        out.append((state * q[:, :, t, :, None]).sum(dim=-2))
        states.append(state)
    return torch.stack(out, dim=1).to(dtype), states  # [B, T, Hv, Dv]


def gated_delta_rule_reference(
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
) -> tuple[Tensor, Tensor]:
    initial = _initial(state, layer, slot_ids, start_pos)
    out, states = gated_delta_rule_scan(q, k, v, g, beta, initial, lengths)
    return out.contiguous(), (states[-1] if states else initial).to(state.dtype).contiguous()


@library.op("graphspec::gated_delta_rule", mutates_args=())
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
) -> tuple[Tensor, Tensor]:
    """Gated DeltaNet recurrence (q/k L2-normalized inside, q scaled by Dk**-0.5) from the recurrent
    state [Lg, SLOTS, Hv, Dk, Dv] of slot slot_ids[b] at `layer` (zeros where start_pos[b] == 0: a new
    sequence). q, k [B, T, Hk, Dk], v [B, T, Hv, Dv], g (log decay) and beta [B, T, Hv]. Returns
    (out [B, T, Hv, Dv], the state after position lengths[b] - 1 [B, Hv, Dk, Dv]); positions past
    lengths[b] are right padding."""
    return gated_delta_rule_reference(q, k, v, g, beta, state, layer, slot_ids, start_pos, lengths)


@torch.library.register_fake("graphspec::gated_delta_rule")
def _(q, k, v, g, beta, state, layer, slot_ids, start_pos, lengths):
    return v.new_empty(v.shape), state.new_empty((q.shape[0], *state.shape[2:]))


def gated_delta_rule_snapshots_reference(
    q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, state: Tensor, layer: int, slot_ids: Tensor
) -> tuple[Tensor, Tensor]:
    initial = state[layer].index_select(0, slot_ids)
    out, states = gated_delta_rule_scan(q, k, v, g, beta, initial, None)
    return out.contiguous(), torch.stack(states, dim=1).to(state.dtype).contiguous()


@library.op("graphspec::gated_delta_rule_snapshots", mutates_args=())
def gated_delta_rule_snapshots(
    q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, state: Tensor, layer: int, slot_ids: Tensor
) -> tuple[Tensor, Tensor]:
    """gated_delta_rule over verify positions (never position 0): returns (out [B, T, Hv, Dv], the state
    after every position [B, T, Hv, Dk, Dv]); the slot's state itself is not advanced."""
    return gated_delta_rule_snapshots_reference(q, k, v, g, beta, state, layer, slot_ids)


@torch.library.register_fake("graphspec::gated_delta_rule_snapshots")
def _(q, k, v, g, beta, state, layer, slot_ids):
    return v.new_empty(v.shape), state.new_empty((q.shape[0], q.shape[1], *state.shape[2:]))


# --------------------------------------------------------------------------------------------------
# Per-layer slot state (recurrent and conv state): whole-slot writes and the accept region's selection
# --------------------------------------------------------------------------------------------------


def _write_layer_rows(state: Tensor, layer: int, slot_ids: Tensor, value: Tensor) -> None:
    """Per-layer state write: value [B, ...] lands in state [L, SLOTS, ...] at layer `layer`, slot slot_ids[b]."""
    state[layer, slot_ids] = value.to(state.dtype)


layer_state_update, layer_state_write = library.state_update_ops("layer_state", _write_layer_rows)


def _select_rows(state: Tensor, slot_ids: Tensor, snapshots: Tensor, index: Tensor) -> None:
    """The "snapshot" rollback rule's commit: slot slot_ids[b] of state [L, SLOTS, ...] takes
    snapshots[:, b, index[b]] (snapshots [L, B, T, ...], one per verified position; index [B] the row's
    accepted count). Only the selected snapshot is read: the others may hold anything (NaN included)
    without reaching the state."""
    rows = torch.arange(snapshots.shape[1], device=snapshots.device)
    state[:, slot_ids] = snapshots[:, rows, index.clamp(0, snapshots.shape[2] - 1)].to(state.dtype)


select_update, select_write = library.state_update_ops("select", _select_rows)


# --------------------------------------------------------------------------------------------------
# Counter-based randomness and logits processing
# --------------------------------------------------------------------------------------------------


def _fmix32(x: Tensor) -> Tensor:
    # murmur3 finalizer on int64 tensors holding 32-bit values; products wrap, masks keep the low 32 bits.
    x = x ^ (x >> 16)
    x = (x * 0x85EBCA6B) & _MASK32
    x = x ^ (x >> 13)
    x = (x * 0xC2B2AE35) & _MASK32
    return x ^ (x >> 16)


def uniform(seed: Tensor, counter: Tensor, lane: Tensor | int) -> Tensor:
    """Float64 uniforms in [0, 1) from (seed [B], counter [B], lane); broadcasts over lane."""
    seed = seed.to(torch.int64)
    counter = counter.to(torch.int64)
    if isinstance(lane, int):
        # torch.full, not torch.tensor: a fill kernel, where torch.tensor copies from the host, which
        # a CUDA graph capture refuses.
        lane = torch.full((), lane, dtype=torch.int64, device=seed.device)
    extra = lane.dim()
    for _ in range(extra):
        seed, counter = seed.unsqueeze(-1), counter.unsqueeze(-1)
    key = _fmix32((seed & _MASK32) ^ _fmix32((counter & _MASK32) * 0x9E3779B1 & _MASK32))
    key = _fmix32(key ^ _fmix32(((seed >> 32) & _MASK32) + lane * 0x632BE5AB & _MASK32))
    high = _fmix32(key ^ 0x5BD1E995) >> 6  # 26 bits
    low = _fmix32(key ^ 0x27D4EB2F) >> 5  # 27 bits
    return (high.to(torch.float64) * 2.0**27 + low.to(torch.float64)) * 2.0**-53


def row_seeds(seed: int | Sequence[int] | None, count: int) -> Tensor:
    """[count] int64 per-row seeds. A seed belongs to its request, not to a row: an int seeds every
    row alike and a sequence gives one seed per row, so a request's stream is the same at any row index
    and beside any other requests. seed None draws a fresh random seed for each row."""
    if seed is None:
        seeds = torch.randint(0, 2**62, (count,), dtype=torch.int64).tolist()
    elif isinstance(seed, (str, bytes)) or not isinstance(seed, Sequence):
        seeds = [seed] * count
    elif len(seed) != count:
        raise InputError(f"seed must be None, an int, or one int per prompt ({count}), got {len(seed)} seeds")
    else:
        seeds = list(seed)
    for value in seeds:
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**63:
            raise InputError(f"seed must be None or an int in [0, 2**63) (or a list of them), got {value!r}")
    values = torch.tensor(seeds, dtype=torch.int64).reshape(count)
    return _fmix32(values & _MASK32) | (((values >> 32) & _MASK32) << 32)


# Sampling weights are fixed point: exp(s - max) in fp32 times 2**WEIGHT_BITS, truncated to int64, so
# every mass (normalizer, top-p prefix, inverse-CDF running sum) is an exact integer sum whose value does
# not depend on summation order, vocab split or batch. 2**44 keeps V * 2**44 < 2**63 for V < 2**19 and
# a weight's resolution (2**-44 of the max token's) far below fp32's rounding of the probabilities.
WEIGHT_BITS = 44
MAX_SAMPLING_VOCAB = 2**19


def order_key(s: Tensor) -> Tensor:
    """int64 order key of fp32 values: the int32 bit pattern with the 31 low bits of negatives flipped,
    so integer order is float order (-0.0 sorts just below +0.0; -inf lowest, NaN above +inf)."""
    bits = s.contiguous().view(torch.int32)
    return (bits ^ ((bits >> 31) & 0x7FFFFFFF)).to(torch.int64)


def sampling_weights(logits: Tensor, temperature: Tensor, top_k: Tensor, top_p: Tensor) -> Tensor:
    """Unnormalized sampling distribution [..., V] as int64 weights: the one definition of temperature,
    top-k and top-p that graphspec::sample, graphspec::verify_rejection and their kernels all implement.
    temperature [B] (0 means greedy: weight 1 at the argmax, 0 elsewhere), top_k [B] (0 = off),
    top_p [B] in (0, 1] (1 = off); logits may carry extra dims between B and V.

    Per row, with s = fp32(logits) / temperature (IEEE division) and m = max s:
      w_i = trunc(exp(s_i - m) * 2**WEIGHT_BITS)    (fp32 exp; the scaling is exact)
      top-k keeps every token whose s is >= the top_k-th largest s (ties with it all kept);
      top-p then keeps token i iff W_> < top_p * Z_k in float64, where Z_k is the sum of the kept
        weights and W_> the sum of the kept weights with s strictly above s_i (the token crossing
        top_p included, tokens tied with it all kept);
    "s above" is order_key order. Every sum is exact in int64, so the rule has no summation order."""
    vocab = logits.shape[-1]
    if vocab >= MAX_SAMPLING_VOCAB:
        raise InputError(f"sampling needs a vocab below {MAX_SAMPLING_VOCAB} (int64 fixed-point sums), got {vocab}")
    scaled, row_max = scaled_logits(logits, temperature)
    weight, key = fixed_point_weights(scaled, row_max), order_key(scaled)
    ascending, order = key.sort(-1)
    # top-k threshold: the top_k-th largest key (rows with top-k off keep everything).
    top_k = per_row(top_k.to(torch.int64), logits)
    kth = ascending.gather(-1, (vocab - top_k.clamp(1, vocab)).expand((*key.shape[:-1], 1)))
    threshold = torch.where((top_k > 0) & (top_k < vocab), kth, torch.iinfo(torch.int64).min)
    weight = torch.where(key >= threshold, weight, 0)
    # W_> per token: the kept mass at keys strictly above its own, from a prefix sum in key order.
    prefix = torch.cumsum(weight.gather(-1, order), dim=-1)
    prefix = torch.cat((torch.zeros_like(prefix[..., :1]), prefix), dim=-1)  # prefix[j]: mass of the j lowest
    total = prefix[..., -1:]
    above = total - prefix.gather(-1, torch.searchsorted(ascending, key, right=True))
    top_p = per_row(top_p.to(torch.float32), logits)
    keep_p = (top_p >= 1.0) | (above.to(torch.float64) < top_p.to(torch.float64) * total.to(torch.float64))
    return greedy_rows_one_hot(torch.where(keep_p, weight, 0), logits, temperature)


def per_row(x: Tensor, logits: Tensor) -> Tensor:
    """Per-row values x [B] shaped to broadcast against logits [B, ..., V]."""
    return x.reshape(x.shape + (1,) * (logits.dim() - 1))


def scaled_logits(logits: Tensor, temperature: Tensor) -> tuple[Tensor, Tensor]:
    """(s, max s) of sampling_weights: s = fp32(logits) / temperature per row (IEEE division; greedy rows,
    temperature <= 0, divide by 1), its max over the vocab kept as [..., 1]."""
    temperature = torch.where(temperature > 0, temperature, 1.0).to(torch.float32)
    scaled = logits.to(torch.float32) / per_row(temperature, logits)
    return scaled, scaled.amax(-1, keepdim=True)


def fixed_point_weights(scaled: Tensor, row_max: Tensor) -> Tensor:
    """sampling_weights' int64 weights before any cut: trunc(exp(s - max) * 2**WEIGHT_BITS)."""
    return (torch.exp(scaled - row_max) * 2.0**WEIGHT_BITS).to(torch.int64)


def greedy_rows_one_hot(weight: Tensor, logits: Tensor, temperature: Tensor) -> Tensor:
    """weight, except on greedy rows (temperature <= 0): weight 1 at the (first) argmax, 0 elsewhere."""
    one_hot = torch.zeros_like(weight).scatter(-1, logits.argmax(-1, keepdim=True), 1)
    return torch.where(per_row(temperature <= 0, logits), one_hot, weight)


def process_logits(logits: Tensor, temperature: Tensor, top_k: Tensor, top_p: Tensor) -> Tensor:
    """Sampling distribution [..., V] (float64) per row: sampling_weights divided by their (exact) sum."""
    weight = sampling_weights(logits, temperature, top_k, top_p)
    return weight.to(torch.float64) / weight.sum(-1, keepdim=True).to(torch.float64)


def argmax_reference(logits: Tensor, ids: Tensor | None = None) -> Tensor:
    best = logits.argmax(dim=-1)
    return best if ids is None else ids.index_select(0, best.flatten()).view(best.shape)


@library.op("graphspec::argmax", mutates_args=())
def argmax(logits: Tensor, ids: Tensor | None = None) -> Tensor:
    """Greedy token per row: the first index of the maximum over the last dim, like torch.argmax (NaN
    counts as the maximum). logits [..., V] -> [...] int64. An op of its own so it lowers to a kernel
    that spreads one row's vocab over the GPU (torch's reduction took 35 us for one 128k row on an H200).
    ids [V] int64 (a reduced vocabulary's token ids: EAGLE-3's d2t, a token map): the result is ids[index],
    looked up by the same launch that picks the index (a separate gather was a launch per draft)."""
    return argmax_reference(logits, ids)


@torch.library.register_fake("graphspec::argmax")
def _(logits: Tensor, ids: Tensor | None = None) -> Tensor:
    return logits.new_empty(logits.shape[:-1], dtype=torch.int64)


def sample_from(probs: Tensor, u: Tensor) -> Tensor:
    """Inverse-CDF draw: the first index whose inclusive running sum exceeds u * total, in float64.
    probs [..., V] (unnormalized is fine; int64 weights are summed exactly, then compared in float64),
    u [...] in [0, 1) -> token ids [...]."""
    if probs.dtype.is_floating_point:
        cdf = torch.cumsum(probs.to(torch.float64), dim=-1)
    else:
        cdf = torch.cumsum(probs.to(torch.int64), dim=-1).to(torch.float64)
    target = (u * cdf[..., -1]).unsqueeze(-1)
    index = torch.searchsorted(cdf, target, right=True).squeeze(-1)
    # u * total can round up to total; clamp onto the last token.
    return index.clamp(max=probs.shape[-1] - 1)


@library.op("graphspec::sample", mutates_args=())
def sample(
    logits: Tensor, temperature: Tensor, top_k: Tensor, top_p: Tensor, seed: Tensor, counter: Tensor, lane: int
) -> Tensor:
    """One token per row from logits [B, V]; rows with temperature 0 take the argmax. Returns [B] int64.
    The draw is sample_from over sampling_weights (exact integer running sums) with uniform(seed,
    counter, lane): the same q, bit for bit, that verify_rejection recomputes for a drafted token."""
    weight = sampling_weights(logits, temperature, top_k, top_p)
    return sample_from(weight, uniform(seed, counter, lane))


@torch.library.register_fake("graphspec::sample")
def _(logits: Tensor, temperature: Tensor, top_k: Tensor, top_p: Tensor, seed: Tensor, counter: Tensor, lane: int):
    return logits.new_empty(logits.shape[:1], dtype=torch.int64)


# --------------------------------------------------------------------------------------------------
# Verify / accept and commit
# --------------------------------------------------------------------------------------------------


def _leading_accepts(accepted: Tensor) -> Tensor:
    # accepted [B, K] bool -> length of the all-true prefix per row [B].
    return torch.cumprod(accepted.to(torch.int64), dim=1).sum(dim=1)


@library.op("graphspec::verify_greedy", mutates_args=())
def verify_greedy(target_logits: Tensor, draft_tokens: Tensor) -> tuple[Tensor, Tensor]:
    """Greedy verify. target_logits [B, K+1, V], draft_tokens [B, K].
    Returns (tokens [B, K+1], num_accepted [B]): tokens[:, j] is the target argmax at j, so the first
    num_accepted + 1 entries are the accepted drafts followed by the target's own next token."""
    target_tokens = target_logits.argmax(dim=-1)  # [B, K+1]
    accepted = _leading_accepts(draft_tokens == target_tokens[:, :-1])
    return target_tokens, accepted


@torch.library.register_fake("graphspec::verify_greedy")
def _(target_logits: Tensor, draft_tokens: Tensor) -> tuple[Tensor, Tensor]:
    batch, positions, _ = target_logits.shape
    return (
        target_logits.new_empty((batch, positions), dtype=torch.int64),
        target_logits.new_empty((batch,), dtype=torch.int64),
    )


def verify_rejection_reference(
    target_logits: Tensor,
    draft_logits: Tensor,
    draft_tokens: Tensor,
    temperature: Tensor,
    top_k: Tensor,
    top_p: Tensor,
    seed: Tensor,
    counter: Tensor,
) -> tuple[Tensor, Tensor]:
    p = process_logits(target_logits, temperature, top_k, top_p)  # [B, K+1, V]
    q = process_logits(draft_logits, temperature, top_k, top_p)  # [B, K, V]
    return rejection_from_probabilities(p, q, draft_tokens, seed, counter)


def rejection_from_probabilities(
    p: Tensor, q: Tensor, draft_tokens: Tensor, seed: Tensor, counter: Tensor
) -> tuple[Tensor, Tensor]:
    """verify_rejection_reference after process_logits: p [B, K+1, V] and q [B, K, V] float64 (the
    processed target and draft distributions) -> (tokens [B, K+1], num_accepted [B])."""
    batch, k = draft_tokens.shape
    index = draft_tokens.unsqueeze(-1)
    p_draft = p[:, :k].gather(-1, index).squeeze(-1)  # [B, K]
    q_draft = q.gather(-1, index).squeeze(-1)
    lanes = torch.arange(k, device=p.device) + ACCEPT_LANE
    u = uniform(seed, counter, lanes)  # [B, K]
    # Accept d_j with probability min(1, p/q): u * q < p avoids dividing by q (q > 0 for a drawn token).
    accepted = _leading_accepts(u * q_draft.to(torch.float64) < p_draft.to(torch.float64))
    # At the first rejection draw from max(0, p - q); after K accepts draw the bonus from p itself.
    q_padded = torch.cat((q, torch.zeros_like(q[:, :1])), dim=1)  # [B, K+1, V]
    rows = torch.arange(batch, device=p.device)
    p_n, q_n = p[rows, accepted], q_padded[rows, accepted]  # [B, V]
    residual = (p_n - q_n).clamp(min=0)
    # An all-zero residual means p == q there, where rejection cannot happen; fall back to p for safety.
    residual = torch.where(residual.sum(-1, keepdim=True) > 0, residual, p_n)
    resampled = sample_from(residual, uniform(seed, counter, RESAMPLE_LANE))  # [B]
    tokens = torch.cat((draft_tokens, draft_tokens[:, :1]), dim=1)
    tokens = tokens.scatter(1, accepted.unsqueeze(1), resampled.unsqueeze(1))
    return tokens, accepted


@library.op("graphspec::verify_rejection", mutates_args=())
def verify_rejection(
    target_logits: Tensor,
    draft_logits: Tensor,
    draft_tokens: Tensor,
    temperature: Tensor,
    top_k: Tensor,
    top_p: Tensor,
    seed: Tensor,
    counter: Tensor,
) -> tuple[Tensor, Tensor]:
    """Lossless rejection sampling (Leviathan et al. / Chen et al.).
    target_logits [B, K+1, V], draft_logits [B, K, V], draft_tokens [B, K] (drawn from the processed
    draft distribution). Returns (tokens [B, K+1], num_accepted [B]) with the same layout as
    verify_greedy: the first num_accepted + 1 tokens are emitted."""
    return verify_rejection_reference(
        target_logits, draft_logits, draft_tokens, temperature, top_k, top_p, seed, counter
    )


@torch.library.register_fake("graphspec::verify_rejection")
def _(target_logits, draft_logits, draft_tokens, temperature, top_k, top_p, seed, counter):
    batch, positions, _ = target_logits.shape
    return (
        target_logits.new_empty((batch, positions), dtype=torch.int64),
        target_logits.new_empty((batch,), dtype=torch.int64),
    )


@library.op("graphspec::limit_accepted", mutates_args=())
def limit_accepted(
    tokens: Tensor,
    num_accepted: Tensor,
    draft_length: Tensor,
    target_logits: Tensor,
    temperature: Tensor,
    top_k: Tensor,
    top_p: Tensor,
    seed: Tensor,
    counter: Tensor,
) -> tuple[Tensor, Tensor]:
    """Rows whose drafter proposed only draft_length [B] < K real drafts (the rest filler) accept at most
    draft_length. Where verify got as far as position draft_length (every real draft accepted), the
    token there becomes one drawn from the target's own distribution (lane TARGET_LANE; the argmax at
    temperature 0), whether verify accepted the filler or rejected it and resampled: there was no real
    draft there, so the target's distribution is what must be emitted; given the accepted real
    drafts, that leaves the output distribution unchanged. tokens [B, K+1], num_accepted [B] as
    returned by verify."""
    batch, positions = tokens.shape
    rows = torch.arange(batch, device=tokens.device)
    at = draft_length.clamp(min=0, max=positions - 1)
    own = sample(target_logits[rows, at], temperature, top_k, top_p, seed, counter, TARGET_LANE)  # [B]
    replace = (num_accepted >= at)[:, None] & (torch.arange(positions, device=tokens.device) == at[:, None])
    return torch.where(replace, own[:, None], tokens), torch.minimum(num_accepted, at)


@torch.library.register_fake("graphspec::limit_accepted")
def _(tokens, num_accepted, draft_length, target_logits, temperature, top_k, top_p, seed, counter):
    return torch.empty_like(tokens), torch.empty_like(num_accepted)


@library.op("graphspec::commit", mutates_args=())
def commit(committed_len: Tensor, last_tokens: Tensor, tokens: Tensor, num_accepted: Tensor) -> tuple[Tensor, Tensor]:
    """Advance each row past num_accepted + 1 emitted tokens.
    committed_len [B], last_tokens [B, 2] (the last two committed tokens), tokens [B, K+1].
    Returns (new committed_len [B], new last_tokens [B, 2])."""
    history = torch.cat((last_tokens, tokens), dim=1)  # [B, K+3]
    end = num_accepted + 3  # one past the last emitted token in `history`
    index = torch.stack((end - 2, end - 1), dim=1)
    return committed_len + num_accepted + 1, history.gather(1, index)


@torch.library.register_fake("graphspec::commit")
def _(committed_len: Tensor, last_tokens: Tensor, tokens: Tensor, num_accepted: Tensor) -> tuple[Tensor, Tensor]:
    return committed_len.new_empty(committed_len.shape), last_tokens.new_empty(last_tokens.shape)


# Ops whose reference implementation is also the op itself; lowering tables key on these.
OPS = {
    "rms_norm": torch.ops.graphspec.rms_norm.default,
    "add_rms_norm": torch.ops.graphspec.add_rms_norm.default,
    "embed_norm_concat": torch.ops.graphspec.embed_norm_concat.default,
    "rotary": torch.ops.graphspec.rotary.default,
    "rope_tables": torch.ops.graphspec.rope_tables.default,
    "silu_mul": torch.ops.graphspec.silu_mul.default,
    "scaled_silu_mul": torch.ops.graphspec.scaled_silu_mul.default,
    "scaled_silu_mul_linear": torch.ops.graphspec.scaled_silu_mul_linear.default,
    "row_scale": torch.ops.graphspec.row_scale.default,
    "kv_update": torch.ops.graphspec.kv_update.default,
    "kv_write": torch.ops.graphspec.kv_write.default,
    "slot_update": torch.ops.graphspec.slot_update.default,
    "slot_write": torch.ops.graphspec.slot_write.default,
    "rotary_kv_write": torch.ops.graphspec.rotary_kv_write.default,
    "attention": torch.ops.graphspec.attention.default,
    "block_attention": torch.ops.graphspec.block_attention.default,
    "rotary_kv_attention": torch.ops.graphspec.rotary_kv_attention.default,
    "prefill_attention": torch.ops.graphspec.prefill_attention.default,
    "argmax": torch.ops.graphspec.argmax.default,
    "sample": torch.ops.graphspec.sample.default,
    "verify_greedy": torch.ops.graphspec.verify_greedy.default,
    "verify_rejection": torch.ops.graphspec.verify_rejection.default,
    "limit_accepted": torch.ops.graphspec.limit_accepted.default,
    "commit": torch.ops.graphspec.commit.default,
    "offset_rms_norm": torch.ops.graphspec.offset_rms_norm.default,
    "gated_rms_norm": torch.ops.graphspec.gated_rms_norm.default,
    "add_offset_rms_norm": torch.ops.graphspec.add_offset_rms_norm.default,
    "gdn_gates": torch.ops.graphspec.gdn_gates.default,
    "causal_conv1d": torch.ops.graphspec.causal_conv1d.default,
    "causal_conv1d_snapshots": torch.ops.graphspec.causal_conv1d_snapshots.default,
    "gated_delta_rule": torch.ops.graphspec.gated_delta_rule.default,
    "gated_delta_rule_snapshots": torch.ops.graphspec.gated_delta_rule_snapshots.default,
    "layer_state_update": torch.ops.graphspec.layer_state_update.default,
    "layer_state_write": torch.ops.graphspec.layer_state_write.default,
    "select_update": torch.ops.graphspec.select_update.default,
    "select_write": torch.ops.graphspec.select_write.default,
}
