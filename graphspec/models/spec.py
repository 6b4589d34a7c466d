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
    "qwen3_next": (False, True),
    "qwen3_5": (False, True),
    "qwen3_5_text": (False, True),
}
# Hybrid families: Gated DeltaNet (linear attention) layers interleaved with gated full-attention layers
# (models/hybrid.py), zero-centred (1 + w) norms, partial rotary. "qwen3_5" is the multimodal wrapper
# config (Qwen3_5ForConditionalGeneration); its text model's fields sit in text_config.
HYBRID_FAMILIES = ("qwen3_next", "qwen3_5", "qwen3_5_text")
# Where each hybrid family's checkpoint packs a Gated DeltaNet layer's input projections: Qwen3-Next
# interleaves q/k/v/z (and b/a) per key head in two tensors, Qwen3.5 stores four plain ones.
LINEAR_LAYOUTS = {"qwen3_next": "qwen3_next", "qwen3_5": "qwen3_5", "qwen3_5_text": "qwen3_5"}
# Families whose config.attention_bias adds biases to q/k/v AND o_proj, as in transformers' modeling
# code. Mistral has no such option (never biased); Qwen2's q/k/v are always biased and o_proj never.
ATTENTION_BIAS_FAMILIES = ("llama", "qwen3", *HYBRID_FAMILIES)
# Rope types whose frequencies depend on the current sequence length; graphspec precomputes them once.
DYNAMIC_ROPE_TYPES = ("dynamic", "longrope")


@dataclass(frozen=True)
class LinearSpec:
    """A hybrid model's Gated DeltaNet layers (all alike)."""

    num_k_heads: int
    num_v_heads: int
    k_head_dim: int
    v_head_dim: int
    conv_kernel: int  # W: the conv state keeps the last W - 1 inputs
    layout: str  # LINEAR_LAYOUTS value: how the checkpoint packs the input projections

    @property
    def conv_dim(self) -> int:
        """C: channels of the conv (q, k and v of every head)."""
        return 2 * self.num_k_heads * self.k_head_dim + self.num_v_heads * self.v_head_dim


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
    # Hybrid families only: "linear_attention" / "full_attention" per layer, and the linear layers' shape.
    layer_types: tuple[str, ...] = ()
    linear: LinearSpec | None = None

    @property
    def attention_layers(self) -> tuple[int, ...]:
        """Layers with full attention (and so a KV cache layer), in order."""
        return tuple(
            i for i in range(self.num_layers) if not self.layer_types or self.layer_types[i] == "full_attention"
        )

    @property
    def linear_layers(self) -> tuple[int, ...]:
        """Gated DeltaNet layers (with conv and recurrent state), in order."""
        return tuple(i for i, kind in enumerate(self.layer_types) if kind == "linear_attention")

    @classmethod
    def from_config(cls, config: PretrainedConfig) -> ModelSpec:
        model_type = getattr(config, "model_type", None)
        if model_type not in FAMILIES:
            raise CheckpointError(
                f"unsupported architecture {model_type!r} (architectures={getattr(config, 'architectures', None)}); "
                f"supported model_type values: {', '.join(sorted(FAMILIES))}"
            )
        if model_type in HYBRID_FAMILIES:
            return _hybrid_spec(config, model_type)
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


def text_config(config: PretrainedConfig) -> PretrainedConfig:
    """The config of the language model: Qwen3.5's multimodal wrapper keeps it in text_config."""
    if getattr(config, "model_type", None) == "qwen3_5":
        return config.get_text_config()
    return config


def _hybrid_spec(config: PretrainedConfig, model_type: str) -> ModelSpec:
    """ModelSpec of a hybrid (Gated DeltaNet) checkpoint; refuses what models/hybrid.py does not implement."""
    text = text_config(config)
    act = getattr(text, "hidden_act", "silu")
    if act != "silu":
        raise CheckpointError(f"unsupported hidden_act {act!r}: graphspec's hybrid layers use SiLU")
    layers = text.num_hidden_layers
    layer_types = tuple(text.layer_types)
    unknown = sorted(set(layer_types) - {"linear_attention", "full_attention"})
    if len(layer_types) != layers or unknown:
        raise CheckpointError(
            f"layer_types must name linear_attention or full_attention for each of the {layers} layers, "
            f"got {list(layer_types)}"
        )
    # Qwen3-Next's MoE layers (every decoder_sparse_step-th layer not in mlp_only_layers) need an MoE block.
    experts = getattr(text, "num_experts", 0) or 0
    step = getattr(text, "decoder_sparse_step", 1) or 1
    dense_only = set(getattr(text, "mlp_only_layers", None) or [])
    moe = [i for i in range(layers) if experts > 0 and i not in dense_only and (i + 1) % step == 0]
    if moe:
        raise CheckpointError(
            f"{model_type}: layers {moe} are mixture-of-experts (num_experts={experts}); graphspec implements "
            "only dense hybrid models so far (num_experts=0, or every layer in mlp_only_layers)"
        )
    heads = text.num_attention_heads
    kv_heads = getattr(text, "num_key_value_heads", None) or heads
    if heads % kv_heads:
        raise CheckpointError(f"num_attention_heads={heads} is not a multiple of num_key_value_heads={kv_heads}")
    linear = LinearSpec(
        num_k_heads=text.linear_num_key_heads,
        num_v_heads=text.linear_num_value_heads,
        k_head_dim=text.linear_key_head_dim,
        v_head_dim=text.linear_value_head_dim,
        conv_kernel=text.linear_conv_kernel_dim,
        layout=LINEAR_LAYOUTS[model_type],
    )
    if linear.num_v_heads % linear.num_k_heads:
        raise CheckpointError(
            f"linear_num_value_heads={linear.num_v_heads} is not a multiple of "
            f"linear_num_key_heads={linear.num_k_heads}"
        )
    if linear.conv_kernel < 2:
        raise CheckpointError(f"linear_conv_kernel_dim must be at least 2, got {linear.conv_kernel}")
    bias = bool(getattr(text, "attention_bias", False))
    return ModelSpec(
        model_type=model_type,
        vocab_size=text.vocab_size,
        hidden_size=text.hidden_size,
        intermediate_size=text.intermediate_size,
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=getattr(text, "head_dim", None) or text.hidden_size // heads,
        rms_norm_eps=float(text.rms_norm_eps),
        qkv_bias=bias,
        o_bias=bias,
        mlp_bias=False,
        qk_norm=True,
        tie_word_embeddings=bool(getattr(config, "tie_word_embeddings", False)),
        max_position_embeddings=text.max_position_embeddings,
        sliding_window=None,
        layer_types=layer_types,
        linear=linear,
    )


def rope_frequencies(config: PretrainedConfig) -> tuple[torch.Tensor, float]:
    """Inverse frequencies [R/2] and the cos/sin scale, computed by transformers' own rope
    functions so scaled variants (llama3, yarn, linear, ...) match the reference exactly. R is the
    rotated part of the head: all of it, except in hybrid families (partial_rotary_factor)."""
    if getattr(config, "model_type", None) in HYBRID_FAMILIES:
        return _partial_rope_frequencies(text_config(config))
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


def _partial_rope_frequencies(config: PretrainedConfig) -> tuple[torch.Tensor, float]:
    """Hybrid families' default rope over the first int(head_dim * partial_rotary_factor) dims, with the
    arithmetic of their transformers rotary embeddings (Qwen3.5's M-RoPE sections reduce to it for text,
    where the three position streams are equal)."""
    params = getattr(config, "rope_parameters", None) or {}
    rope_type = params.get("rope_type", "default")
    if rope_type != "default":
        raise CheckpointError(f"unsupported rope_type {rope_type!r} for a hybrid model: graphspec supports 'default'")
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    dim = int(head_dim * params.get("partial_rotary_factor", 1.0))
    if dim < 2 or dim % 2:
        raise CheckpointError(f"partial_rotary_factor gives {dim} rotated dims of {head_dim}; need an even count >= 2")
    base = params["rope_theta"]
    return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float) / dim)), 1.0
