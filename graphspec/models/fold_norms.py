"""Fold each decoder layer's post-attention RMSNorm weight into its gate/up projection (issue 16).

rms_norm(x, g) @ W.T = r(x) * (x @ (W * g).T), with r(x) = rsqrt(mean(x^2) + eps) per row. Once W * g is the
projection's weight, nothing has to write the normalized rows between the attention and the MLP: the o
projection adds into the residual (one addmm, decoder.add_linear, which the addmm_in_place pass turns into a
write in place), gate_up projects the residual itself, and graphspec::scaled_silu_mul applies r. A decode layer
drops one launch (graphspec::add_rms_norm) of its eight. Programs of many rows (prefill chunks) keep the norm
kernel, which then only normalizes (weight: the model's `folded_norm_weight`, ones; decoder.FOLDED_MAX_ROWS).

The fold is a change of the weights every program of a compile reads, so it is made once, at load, where the
compile decides it (SpecConfig.fold_norms, recorded in the artifact, whose loader folds the checkpoint's own
weights again); the folded norm leaves the model, so the step's declared weights (trace.model_inputs) say
which form a graph was traced for, and an artifact whose graphs expect the other form is refused.
"""

from __future__ import annotations

import torch

from graphspec.models.decoder import DecoderLM


def fold_refusal(model: torch.nn.Module) -> str | None:
    """Why `model`'s norms cannot be folded, None when they can."""
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
    """Fold every layer's post_attention_layernorm into its mlp.gate_up_proj, in place (see the module doc).
    Raises ValueError naming why when fold_refusal does."""
    reason = fold_refusal(model)
    if reason is not None:
        raise ValueError(f"cannot fold the norms of this model: {reason}")
    with torch.no_grad():
        for layer in model.model.layers:
            norm = layer.post_attention_layernorm
            weight = layer.mlp.gate_up_proj.weight  # [2I, H]: column j scales by g[j], one rounding per element
            weight.copy_((weight.float() * norm.weight.float()).to(weight.dtype))
            layer.mlp.folded_norm_eps = norm.eps
            del layer.post_attention_layernorm
        # What the folded norms weigh where a program keeps the norm kernel (decoder.FOLDED_MAX_ROWS).
        like = model.model.norm.weight
        ones = torch.ones(model.spec.hidden_size, dtype=like.dtype, device=like.device)
        model.register_buffer("folded_norm_weight", ones, persistent=False)
