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


def drafter_shapes(target_hidden: int, features: int, layers: int, heads=4, kv_heads=2, head_dim=16, inter=96):
    """z-lab name -> shape of every tensor of a DFlash drafter (Qwen3-style layers, no embedding/lm_head)."""
    shapes = {"fc.weight": (target_hidden, features), "hidden_norm.weight": (target_hidden,)}
    for index in range(layers):
        prefix = f"layers.{index}."
        shapes |= {
            prefix + "self_attn.q_proj.weight": (heads * head_dim, target_hidden),
            prefix + "self_attn.k_proj.weight": (kv_heads * head_dim, target_hidden),
            prefix + "self_attn.v_proj.weight": (kv_heads * head_dim, target_hidden),
            prefix + "self_attn.o_proj.weight": (target_hidden, heads * head_dim),
            prefix + "self_attn.q_norm.weight": (head_dim,),
            prefix + "self_attn.k_norm.weight": (head_dim,),
            prefix + "mlp.gate_proj.weight": (inter, target_hidden),
            prefix + "mlp.up_proj.weight": (inter, target_hidden),
            prefix + "mlp.down_proj.weight": (target_hidden, inter),
            prefix + "input_layernorm.weight": (target_hidden,),
            prefix + "post_attention_layernorm.weight": (target_hidden,),
        }
    return shapes | {"norm.weight": (target_hidden,)}


def make_dflash_drafter(
    directory: Path,
    target_dir: Path,
    seed: int,
    block_size: int = 4,
    layer_ids=(0, 1),
    mask_token_id: int = 3,
    layout: str = "zlab",
    num_hidden_layers: int = 2,
    layer_types=None,
    sliding_window: int | None = None,
    heads: tuple[int, int, int] = (4, 2, 16),
) -> Path:
    """A random DFlash drafter for the target at `target_dir` (norms 1 + N(0, 0.1), weights N(0, 0.3)):
    `layout` "zlab" (a Qwen3 config with architectures ["DFlashDraftModel"], block_size, dflash_config;
    fc / hidden_norm) or "muse" (what transformers' MuseGlimmerAssistantModel.save_pretrained writes:
    model_type muse_glimmer_assistant, encoder.fc / encoder.output_norm_enc). Written without transformers'
    DFlash classes, so a transformers that lacks them (the GPU machine's) can still build one. heads:
    (attention heads, kv heads, head dim)."""
    target = json.loads((Path(target_dir) / "config.json").read_text())
    hidden = target["hidden_size"]
    generator = torch.Generator().manual_seed(seed)
    state = {}
    shapes = drafter_shapes(hidden, len(layer_ids) * hidden, num_hidden_layers, *heads)
    for name, shape in shapes.items():
        noise = torch.randn(shape, generator=generator)
        state[name] = 1 + 0.1 * noise if name.endswith("norm.weight") else 0.3 * noise
    fields = {
        "hidden_size": hidden,
        "intermediate_size": 96,
        "num_hidden_layers": num_hidden_layers,
        "num_attention_heads": heads[0],
        "num_key_value_heads": heads[1],
        "head_dim": heads[2],
        "rms_norm_eps": 1e-6,
        "hidden_act": "silu",
        "max_position_embeddings": 512,
        "block_size": block_size,
    }
    if layout == "muse":
        names = MUSE_NAMES
        raw = {
            **fields,
            "architectures": ["MuseGlimmerAssistantModel"],
            "model_type": "muse_glimmer_assistant",
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
            "mask_token_id": mask_token_id,
            "target_layer_ids": list(layer_ids),
            "layer_types": list(layer_types or ["full_attention"] * num_hidden_layers),
            "sliding_window": sliding_window or 2048,
        }
    else:
        names = {}
        raw = {
            **fields,
            "architectures": ["DFlashDraftModel"],
            "model_type": "qwen3",
            "rope_theta": 10000.0,
            "vocab_size": target["vocab_size"],
            "tie_word_embeddings": False,
            "num_target_layers": target["num_hidden_layers"],
            "dflash_config": {"target_layer_ids": list(layer_ids), "mask_token_id": mask_token_id},
        }
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(raw, indent=2))
    save_file({names.get(name, name): t.contiguous() for name, t in state.items()}, directory / "model.safetensors")
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


@torch.no_grad()
def oracle_generation(
    hf_target, oracle, layer_ids, mask: int, prompt: list[int], block: int, new_tokens: int
) -> tuple[list[int], list[int]]:
    """DFlash greedy speculative decoding written with transformers' target (full forwards, no cache, so it
    also serves targets transformers' assisted generation refuses, like stateful hybrids) and its DFlash
    assistant: each step's block [last token, MASK x (block-1)] attends to the committed positions'
    hidden_states[i + 1] of layer_ids, as DFlashTokenCandidateGenerator builds it. (emitted tokens,
    accepted count per step)."""
    sequence = list(prompt)
    sequence.append(int(hf_target(torch.tensor([sequence])).logits[0, -1].argmax()))
    counts: list[int] = []
    while len(sequence) - len(prompt) < new_tokens:
        states = hf_target(torch.tensor([sequence[:-1]]), output_hidden_states=True).hidden_states
        context = torch.cat([states[i + 1] for i in layer_ids], dim=-1)
        noise = hf_target.model.embed_tokens(torch.tensor([[sequence[-1]] + [mask] * (block - 1)]))
        positions = torch.arange(len(sequence) - 1 + block)[None]
        hidden = oracle(noise_embeds=noise, context_hidden_states=context, position_ids=positions).last_hidden_state
        drafts = hf_target.lm_head(hidden[0, 1:]).argmax(-1).tolist()
        verify = hf_target(torch.tensor([sequence + drafts])).logits[0, len(sequence) - 1 :].argmax(-1).tolist()
        accepted = next((i for i in range(block - 1) if drafts[i] != verify[i]), block - 1)
        sequence += [*drafts[:accepted], verify[accepted]]
        counts.append(accepted)
    return sequence[len(prompt) :], counts
