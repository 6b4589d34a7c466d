"""Fold each decoder layer's RMSNorm weights into the projections they feed (issue 16).

rms_norm(x, g) @ W.T = r(x) * (x @ (W * g).T), with r(x) = rsqrt(mean(x^2) + eps) per row. Once W * g is the
projection's weight, nothing has to write the normalized rows: the projection reads the residual itself and the
kernel that consumes its output applies r.
- The post-attention norm moves into gate/up: the o projection adds into the residual (one addmm,
  decoder.add_linear, which the addmm_in_place pass turns into a write in place) and graphspec::scaled_silu_mul
  applies r.
- The input norm moves into q/k/v: the down projection adds into the residual the same way and graphspec::row_scale
  applies r, which the fuse_row_scale pass moves into the step's attention kernel (rotary_kv_attention scales q, k
  and v as it loads them). Not where q/k/v have a bias (r would scale it too): Qwen2's layers keep this norm.
A decode layer then launches two kernels fewer (both graphspec::add_rms_norm). Programs of many rows (prefill
chunks) keep the norm kernels, which then only normalize (weight: the model's `folded_norm_weight`, ones;
decoder.FOLDED_MAX_ROWS), and so do prefill programs' input norms (their attention takes no row scale).

The fold is a change of the weights every program of a compile reads, so it is made once, at load, where the
compile decides it (SpecConfig.fold_norms, recorded in the artifact, whose loader folds the checkpoint's own
weights again); the folded norms leave the model, so the step's declared weights (trace.model_inputs) say
which form a graph was traced for, and an artifact whose graphs expect the other form is refused.
"""

from __future__ import annotations

import torch

from graphspec.models.decoder import DecoderLM


def fold_refusal(model: torch.nn.Module) -> str | None:
    """Why `model`'s norms cannot be folded, None when they can (its input norms too unless q/k/v have a bias)."""
    if not isinstance(model, DecoderLM):
        return f"{type(model).__name__} layers are not the decoder's (only DecoderLM folds)"
    if model.spec.mlp_bias:
        return "its gate/up projection has a bias, which the row scale would scale too"
    if model.spec.o_bias:
        return "its o projection has a bias (the residual add is a bias-free addmm)"
    if any(layer.mlp.folded_norm_eps is not None for layer in model.model.layers):
        return "its norms are folded already"
    return None


def fold_norms(model: DecoderLM) -> None:
    """Fold every layer's post_attention_layernorm into its mlp.gate_up_proj and, where q/k/v have no bias, its
    input_layernorm into self_attn.qkv_proj, in place (see the module doc). Raises ValueError naming why when
    fold_refusal does."""
    reason = fold_refusal(model)
    if reason is not None:
        raise ValueError(f"cannot fold the norms of this model: {reason}")
    with torch.no_grad():
        for layer in model.model.layers:
            fold_into(layer.post_attention_layernorm, layer.mlp.gate_up_proj.weight)
            layer.mlp.folded_norm_eps = layer.post_attention_layernorm.eps
            del layer.post_attention_layernorm
            if not model.spec.qkv_bias:
                fold_into(layer.input_layernorm, layer.self_attn.qkv_proj.weight)
                layer.self_attn.folded_norm_eps = layer.input_layernorm.eps
                del layer.input_layernorm
        # What the folded norms weigh where a program keeps the norm kernel (decoder.FOLDED_MAX_ROWS).
        like = model.model.norm.weight
        ones = torch.ones(model.spec.hidden_size, dtype=like.dtype, device=like.device)
        model.register_buffer("folded_norm_weight", ones, persistent=False)


def fold_into(norm: torch.nn.Module, weight: torch.Tensor) -> None:
    """weight [N, H] *= norm.weight [H] along its input columns, one rounding per element."""
    weight.copy_((weight.float() * norm.weight.float()).to(weight.dtype))
