"""Random DFlash drafters for tiny test targets, written in either public layout, and transformers' own
DFlash assistant (MuseGlimmerAssistantModel) with the same weights: the oracle graphspec's drafter is
checked against."""

from __future__ import annotations

import json
from pathlib import Path

import torch
import transformers
from safetensors.torch import load_file, save_file

# Own (z-lab) name -> transformers' MuseGlimmerAssistantModel name.
MUSE_NAMES = {"fc.weight": "encoder.fc.weight", "hidden_norm.weight": "encoder.output_norm_enc.weight"}


def muse_config(target: transformers.PretrainedConfig, block_size: int, layer_ids, mask_token_id: int, **overrides):
    """MuseGlimmerAssistantConfig for `target`: its hidden size, full attention (no sliding window)."""
    fields = dict(
        hidden_size=target.hidden_size,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        max_position_embeddings=512,
        block_size=block_size,
        mask_token_id=mask_token_id,
        target_layer_ids=list(layer_ids),
        layer_types=["full_attention"] * overrides.get("num_hidden_layers", 2),
    )
    fields.update(overrides)
    return transformers.MuseGlimmerAssistantConfig(**fields)


def make_dflash_drafter(
    directory: Path,
    target_dir: Path,
    seed: int,
    block_size: int = 4,
    layer_ids=(0, 1),
    mask_token_id: int = 3,
    layout: str = "zlab",
    **overrides,
) -> Path:
    """A random DFlash drafter for the target at `target_dir`: `layout` "zlab" (a Qwen3 config with
    architectures ["DFlashDraftModel"], dflash_config, fc / hidden_norm) or "muse" (transformers' own
    save_pretrained of MuseGlimmerAssistantModel)."""
    target = transformers.AutoConfig.from_pretrained(target_dir)
    config = muse_config(target, block_size, layer_ids, mask_token_id, **overrides)
    torch.manual_seed(seed)
    model = transformers.MuseGlimmerAssistantModel(config)
    with torch.no_grad():  # perturb everything: norms are all ones at init
        for name, parameter in model.named_parameters():
            noise = torch.randn_like(parameter)
            parameter.copy_(1 + 0.1 * noise if name.endswith("norm.weight") or "norm_enc" in name else 0.3 * noise)
    directory = Path(directory)
    if layout == "muse":
        model.save_pretrained(directory)
        return directory
    directory.mkdir(parents=True, exist_ok=True)
    own = {value: key for key, value in MUSE_NAMES.items()}
    state = {own.get(name, name): tensor.contiguous() for name, tensor in model.state_dict().items()}
    save_file(state, directory / "model.safetensors")
    raw = {
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size,
        "num_hidden_layers": config.num_hidden_layers,
        "num_attention_heads": config.num_attention_heads,
        "num_key_value_heads": config.num_key_value_heads,
        "head_dim": config.head_dim,
        "rms_norm_eps": config.rms_norm_eps,
        "rope_theta": config.rope_parameters["rope_theta"],
        "max_position_embeddings": config.max_position_embeddings,
        "vocab_size": target.vocab_size,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "block_size": block_size,
        "num_target_layers": target.num_hidden_layers,
        "dflash_config": {"target_layer_ids": list(layer_ids), "mask_token_id": mask_token_id},
    }
    (directory / "config.json").write_text(json.dumps(raw, indent=2))
    return directory


def load_oracle(directory: Path) -> transformers.MuseGlimmerAssistantModel:
    """transformers' DFlash assistant with the drafter directory's weights (either layout), eager attention."""
    directory = Path(directory)
    raw = json.loads((directory / "config.json").read_text())
    if raw.get("model_type") == "muse_glimmer_assistant":
        model = transformers.MuseGlimmerAssistantModel.from_pretrained(directory, attn_implementation="eager")
        return model.eval()
    fields = {name: raw[name] for name in ("hidden_size", "intermediate_size", "num_attention_heads")}
    config = transformers.MuseGlimmerAssistantConfig(
        **fields,
        num_hidden_layers=raw["num_hidden_layers"],
        num_key_value_heads=raw["num_key_value_heads"],
        head_dim=raw["head_dim"],
        rms_norm_eps=raw["rms_norm_eps"],
        rope_parameters={"rope_type": "default", "rope_theta": raw["rope_theta"]},
        max_position_embeddings=raw["max_position_embeddings"],
        block_size=raw["block_size"],
        mask_token_id=raw["dflash_config"]["mask_token_id"],
        target_layer_ids=raw["dflash_config"]["target_layer_ids"],
        layer_types=["full_attention"] * raw["num_hidden_layers"],
    )
    config._attn_implementation = "eager"
    model = transformers.MuseGlimmerAssistantModel(config)
    state = {MUSE_NAMES.get(name, name): tensor for name, tensor in load_file(directory / "model.safetensors").items()}
    model.load_state_dict(state)
    return model.eval()
