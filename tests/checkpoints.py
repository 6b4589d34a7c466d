"""Tiny random checkpoints, written with transformers' save_pretrained so tests load them through
graphspec's real loading code. Cached per session by the fixtures in conftest.py."""

from __future__ import annotations

import inspect
from pathlib import Path

import torch
import transformers

CONFIGS = {
    "llama": transformers.LlamaConfig,
    "mistral": transformers.MistralConfig,
    "qwen2": transformers.Qwen2Config,
    "qwen3": transformers.Qwen3Config,
}
MODEL_CLASSES = {
    "llama": transformers.LlamaForCausalLM,
    "mistral": transformers.MistralForCausalLM,
    "qwen2": transformers.Qwen2ForCausalLM,
    "qwen3": transformers.Qwen3ForCausalLM,
}
# llama3 rope scaling with an original context short enough that tiny test prompts cross it.
LLAMA3_ROPE = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 64,
}


def tiny_config(family: str = "llama", vocab_size: int = 128, **overrides) -> transformers.PretrainedConfig:
    fields = dict(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    if family == "qwen3":
        fields["head_dim"] = 16
    fields.update(overrides)
    return CONFIGS[family](**fields)


def make_checkpoint(directory: Path, family: str = "llama", seed: int = 0, **overrides) -> Path:
    """Save a random-weight model of `family` to `directory` and return it."""
    torch.manual_seed(seed)
    config = tiny_config(family, **overrides)
    model = MODEL_CLASSES[family](config)
    # Random init of norms is all ones; perturb everything so no weight is trivially structured.
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.02)
    model.save_pretrained(directory)
    return Path(directory)


def kv_cache(out: transformers.utils.ModelOutput) -> object:
    """A transformers forward's KV cache: `cache` from 5.24 on (`past_key_values` goes in 5.40), else the old name."""
    return out["cache"] if "cache" in out else out["past_key_values"]


def cache_argument(model: torch.nn.Module) -> str:
    """The name `model`'s forward takes the KV cache by: `cache` from transformers 5.24 on, `past_key_values` before."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def load_hf(directory: Path) -> transformers.PreTrainedModel:
    """The transformers model for a checkpoint, fp32, eval mode: the reference implementation."""
    return transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()


def mtp_stored_names(hf_mtp: torch.nn.Module, num_layers: int, layout: str) -> dict[str, str]:
    """transformers MtpModel parameter name -> the name a public checkpoint stores it under."""
    names = {}
    for name in hf_mtp.state_dict():
        if not name.startswith("layers."):
            continue  # embed_tokens / shared_head: the target's own
        index, local = name.removeprefix("layers.").split(".", 1)
        if layout == "deepseek_v3":
            local = local.removeprefix("mtp_block.").replace("post_norm.", "shared_head.norm.")
            names[name] = f"model.layers.{num_layers + int(index)}.{local}"
        else:
            assert index == "0", "the Qwen3-Next layout holds one MTP layer"
            renames = {"enorm.": "pre_fc_norm_embedding.", "hnorm.": "pre_fc_norm_hidden.", "eh_proj.": "fc."}
            renames["post_norm."] = "norm."
            for old, new in renames.items():
                if local.startswith(old):
                    local = new + local.removeprefix(old)
            names[name] = "mtp." + local.replace("mtp_block.", "layers.0.")
    return names


def make_mtp_checkpoint(
    directory: Path, layout: str = "deepseek_v3", seed: int = 0, mtp_layers: int = 1, **overrides
) -> Path:
    """A tiny Qwen3 target whose checkpoint also holds `mtp_layers` MTP layers in `layout` ("deepseek_v3":
    model.layers.{L + i}.*, or "qwen3_next": mtp.*, one layer), with random weights; config
    num_mtp_layers = mtp_layers."""
    from safetensors.torch import load_file, save_file
    from transformers.modeling_layers import MtpModel

    types = ["full_attention"] * mtp_layers
    make_checkpoint(directory, "qwen3", seed, num_mtp_layers=mtp_layers, mtp_layer_types=types, **overrides)
    model = load_hf(directory)
    torch.manual_seed(seed + 1000)
    mtp = MtpModel(model, mtp_layers)
    with torch.no_grad():
        for name, parameter in mtp.named_parameters():
            if name.startswith("layers."):
                parameter.copy_(torch.randn_like(parameter) * 0.1 + (1.0 if name.endswith("norm.weight") else 0.0))
    state = load_file(directory / "model.safetensors")
    weights = mtp.state_dict()
    for name, stored in mtp_stored_names(mtp, model.config.num_hidden_layers, layout).items():
        state[stored] = weights[name].contiguous()
    save_file(state, directory / "model.safetensors", metadata={"format": "pt"})
    return Path(directory)


def load_hf_mtp(directory: Path, layout: str = "deepseek_v3") -> tuple[torch.nn.Module, torch.nn.Module]:
    """(transformers target, transformers MtpModel) with the checkpoint's MTP weights: the oracle."""
    from safetensors.torch import load_file
    from transformers.modeling_layers import MtpModel

    model = load_hf(directory)
    mtp = MtpModel(model, model.config.num_mtp_layers).eval()
    stored = load_file(directory / "model.safetensors")
    names = mtp_stored_names(mtp, model.config.num_hidden_layers, layout)
    mtp.load_state_dict({name: stored[file_name] for name, file_name in names.items()}, strict=False)
    return model, mtp


def split_nextn_head(source: Path, target_dir: Path, head_dir: Path) -> tuple[Path, Path]:
    """A DeepSeek-V3-layout MTP checkpoint (make_mtp_checkpoint) split in two: the target alone (no MTP
    tensors or config fields) and its head as a standalone directory in SGLang's NextN convention (the
    target's config with architectures ["<Arch>NextN"] and num_nextn_predict_layers 1, tensors
    model.layers.0.*)."""
    import json
    import shutil

    from safetensors.torch import load_file, save_file

    raw = json.loads((source / "config.json").read_text())
    prefix = f"model.layers.{raw['num_hidden_layers']}."
    state = load_file(source / "model.safetensors")
    target_raw = {key: value for key, value in raw.items() if key not in ("num_mtp_layers", "mtp_layer_types")}
    head_raw = {**target_raw, "architectures": [raw["architectures"][0] + "NextN"], "num_nextn_predict_layers": 1}
    for directory, config, tensors in (
        (target_dir, target_raw, {n: t for n, t in state.items() if not n.startswith(prefix)}),
        (
            head_dir,
            head_raw,
            {"model.layers.0." + n.removeprefix(prefix): t for n, t in state.items() if n.startswith(prefix)},
        ),
    ):
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "config.json").write_text(json.dumps(config, indent=2))
        save_file(tensors, directory / "model.safetensors", metadata={"format": "pt"})
    shutil.copy(source / "generation_config.json", target_dir / "generation_config.json")
    return Path(target_dir), Path(head_dir)


# Hybrid (Gated DeltaNet) families: config class, model class. Qwen3-Next is dense with num_experts=0.
HYBRID_CLASSES = {
    "qwen3_next": (transformers.Qwen3NextConfig, transformers.Qwen3NextForCausalLM),
    "qwen3_5_text": (transformers.Qwen3_5TextConfig, transformers.Qwen3_5ForCausalLM),
}


def tiny_hybrid_config(
    family: str = "qwen3_5_text", vocab_size: int = 128, **overrides
) -> transformers.PretrainedConfig:
    """Three Gated DeltaNet layers and one gated full-attention layer (the 3:1 pattern), partial rotary."""
    fields = dict(
        vocab_size=vocab_size,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        linear_conv_kernel_dim=4,
        linear_key_head_dim=8,
        linear_value_head_dim=8,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        max_position_embeddings=512,
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    if family == "qwen3_next":
        fields["num_experts"] = 0
    fields.update(overrides)
    return HYBRID_CLASSES[family][0](**fields)


def make_hybrid_checkpoint(
    directory: Path, family: str = "qwen3_5_text", seed: int = 0, perturbation: float = 0.05, **overrides
) -> Path:
    """Save a random-weight hybrid model (transformers' own class) to `directory` and return it. Its
    norms start at zero ((1 + w) norms) and A_log/dt_bias at fixed values, so everything is perturbed
    (by noise of std `perturbation`; larger gives peakier next-token distributions)."""
    torch.manual_seed(seed)
    model = HYBRID_CLASSES[family][1](tiny_hybrid_config(family, **overrides))
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn_like(parameter) * perturbation)
    model.save_pretrained(directory)
    return Path(directory)


def nest_language_model(source: Path, directory: Path) -> Path:
    """A Qwen3.5 text checkpoint rewritten in the public multimodal layout: config model_type "qwen3_5"
    with the text config under text_config, tensors model.language_model.* (lm_head stays), plus one
    vision tensor graphspec must skip."""
    import json

    from safetensors.torch import load_file, save_file

    raw = json.loads((source / "config.json").read_text())
    text = {key: value for key, value in raw.items() if key not in ("architectures", "transformers_version")}
    config = {
        "architectures": ["Qwen3_5ForConditionalGeneration"],
        "model_type": "qwen3_5",
        "text_config": {**text, "model_type": "qwen3_5_text"},
        "tie_word_embeddings": raw.get("tie_word_embeddings", False),
    }
    state = load_file(source / "model.safetensors")
    nested = {
        ("model.language_model." + n.removeprefix("model.") if n.startswith("model.") else n): t
        for n, t in state.items()
    }
    nested["model.visual.patch_embed.proj.weight"] = torch.zeros(4, 3)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config, indent=2))
    save_file(nested, directory / "model.safetensors", metadata={"format": "pt"})
    return directory


def make_hybrid_mtp_checkpoint(directory: Path, seed: int = 0, **overrides) -> Path:
    """A tiny Qwen3.5 (qwen3_5_text) target whose checkpoint also holds one MTP layer (mtp.*, the public
    Qwen3.5 layout; a gated full-attention block) with random weights; config num_mtp_layers = 1."""
    from safetensors.torch import load_file, save_file
    from transformers.modeling_layers import MtpModel

    make_hybrid_checkpoint(
        directory, "qwen3_5_text", seed, num_mtp_layers=1, mtp_layer_types=["full_attention"], **overrides
    )
    model = load_hf(directory)
    torch.manual_seed(seed + 1000)
    mtp = MtpModel(model, 1)
    with torch.no_grad():  # zero-centred norms: small random offsets around 0
        for name, parameter in mtp.named_parameters():
            if name.startswith("layers."):
                parameter.copy_(torch.randn_like(parameter) * 0.1)
    state = load_file(directory / "model.safetensors")
    weights = mtp.state_dict()
    for name, stored in mtp_stored_names(mtp, model.config.num_hidden_layers, "qwen3_next").items():
        state[stored] = weights[name].contiguous()
    save_file(state, directory / "model.safetensors", metadata={"format": "pt"})
    return Path(directory)
