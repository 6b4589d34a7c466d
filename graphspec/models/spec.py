"""ModelSpec: the architecture facts graphspec needs, read from a transformers config."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import PretrainedConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from graphspec.errors import CheckpointError

# model_type -> (q/k/v bias, per-head q/k RMSNorm). Everything else is shared by the family.
FAMILIES: dict[str, tuple[bool, bool]] = {
    "llama": (False, False),
    "mistral": (False, False),
    "qwen2": (True, False),
    "qwen3": (False, True),
}
# Families whose config.attention_bias adds biases to q/k/v AND o_proj, as in transformers' modeling
# code. Mistral has no such option (never biased); Qwen2's q/k/v are always biased and o_proj never.
ATTENTION_BIAS_FAMILIES = ("llama", "qwen3")
# Rope types whose frequencies depend on the current sequence length; graphspec precomputes them once.
DYNAMIC_ROPE_TYPES = ("dynamic", "longrope")


@dataclass(frozen=True)
class ModelSpec:
    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    qkv_bias: bool
    o_bias: bool
    mlp_bias: bool
    qk_norm: bool
    tie_word_embeddings: bool
    max_position_embeddings: int
    sliding_window: int | None

    @classmethod
    def from_config(cls, config: PretrainedConfig) -> ModelSpec:
        model_type = getattr(config, "model_type", None)
        if model_type not in FAMILIES:
            raise CheckpointError(
                f"unsupported architecture {model_type!r} (architectures={getattr(config, 'architectures', None)}); "
                f"supported model_type values: {', '.join(sorted(FAMILIES))}"
            )
        act = getattr(config, "hidden_act", "silu")
        if act != "silu":
            raise CheckpointError(f"unsupported hidden_act {act!r}: graphspec models use SwiGLU (silu)")
        qkv_bias, qk_norm = FAMILIES[model_type]
        attention_bias = model_type in ATTENTION_BIAS_FAMILIES and bool(getattr(config, "attention_bias", False))
        heads = config.num_attention_heads
        kv_heads = getattr(config, "num_key_value_heads", None) or heads
        if heads % kv_heads:
            raise CheckpointError(f"num_attention_heads={heads} is not a multiple of num_key_value_heads={kv_heads}")
        # Qwen2/Qwen3 only use a sliding window when asked to; Mistral configs carry one by default.
        window = getattr(config, "sliding_window", None)
        if model_type in ("qwen2", "qwen3") and not getattr(config, "use_sliding_window", False):
            window = None
        return cls(
            model_type=model_type,
            vocab_size=config.vocab_size,
            hidden_size=config.hidden_size,
            intermediate_size=config.intermediate_size,
            num_layers=config.num_hidden_layers,
            num_heads=heads,
            num_kv_heads=kv_heads,
            head_dim=getattr(config, "head_dim", None) or config.hidden_size // heads,
            rms_norm_eps=float(config.rms_norm_eps),
            qkv_bias=qkv_bias or attention_bias,
            o_bias=attention_bias,
            mlp_bias=model_type == "llama" and bool(getattr(config, "mlp_bias", False)),  # only Llama has it
            qk_norm=qk_norm,
            tie_word_embeddings=bool(getattr(config, "tie_word_embeddings", False)),
            max_position_embeddings=config.max_position_embeddings,
            sliding_window=window,
        )


def rope_frequencies(config: PretrainedConfig) -> tuple[torch.Tensor, float]:
    """Inverse frequencies [D/2] and the cos/sin scale, computed by transformers' own rope
    functions so scaled variants (llama3, yarn, linear, ...) match the reference exactly."""
    params = getattr(config, "rope_parameters", None) or {}
    rope_type = params.get("rope_type", "default")
    partial = params.get("partial_rotary_factor", getattr(config, "partial_rotary_factor", None))
    if partial not in (None, 1, 1.0):
        raise CheckpointError(f"unsupported partial_rotary_factor {partial!r}: graphspec rotates the whole head")
    if rope_type == "default":
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        base = params.get("rope_theta", getattr(config, "rope_theta", 10000.0))
        inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
        return inv_freq, 1.0
    if rope_type not in ROPE_INIT_FUNCTIONS or rope_type in DYNAMIC_ROPE_TYPES:
        static = sorted({"default", *ROPE_INIT_FUNCTIONS} - set(DYNAMIC_ROPE_TYPES))
        raise CheckpointError(
            f"unsupported rope_type {rope_type!r}: frequencies must not depend on sequence length; "
            f"supported: {', '.join(static)}"
        )
    inv_freq, scale = ROPE_INIT_FUNCTIONS[rope_type](config, torch.device("cpu"))
    return inv_freq.float(), float(scale)
