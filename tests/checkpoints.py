"""Tiny random checkpoints, written with transformers' save_pretrained so tests load them through
graphspec's real loading code. Cached per session by the fixtures in conftest.py."""

from __future__ import annotations

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


def load_hf(directory: Path) -> transformers.PreTrainedModel:
    """The transformers model for a checkpoint, fp32, eval mode: the reference implementation."""
    return transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
