"""Training-side DFlash drafter for the demo target (z-lab DFlash, graphspec/drafters/dflash.py is the
inference side). tools/ only: this module trains the drafter and replays its greedy drafts for
tools/measure_acceptance.py, and it writes and reads exactly the z-lab checkpoint files graphspec loads.

Context convention (graphspec/drafters/dflash.py): at committed length L the block [x_{L-1}, MASK x K]
sits at positions a .. a+K with anchor a = L-1, and its queries see the context rows of positions
0 .. a-1 only (graphspec writes the context row of position a too, but the block's own K/V at a
overwrite it before it is read) plus the whole block, non-causally. Context row t is
hidden_norm(fc(concat of the target's hidden_states[i + 1][t] for i in target_layer_ids)); context
rows run through no layer, every drafter layer reads k_norm(k_proj(row)) roped at t and v_proj(row).
Mask slot j (position a + j) predicts token x_{a+j} through the target's lm_head after the final norm.

`forward` computes many anchors of a window at once: their blocks are laid side by side and one boolean
attention mask (F.scaled_dot_product_attention) keeps each block to its own keys and its context
prefix, so one pass gives exactly what graphspec's drafter computes for each anchor alone
(tests/tools/test_demo_dflash.py checks it against graphspec's DFlash on the same weights).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import Tensor, nn
from transformers import LlamaForCausalLM
from transformers.models.llama.modeling_llama import rotate_half

WEIGHTS = "model.safetensors"


def zlab_target_layer_ids(num_target_layers: int, count: int) -> list[int]:
    """z-lab's build_target_layer_ids: `count` layers spread evenly from layer 1 to layer L-3 (for
    Qwen3-8B, 36 layers, 5 ids: [1, 9, 17, 25, 33])."""
    if count == 1:
        return [num_target_layers // 2]
    start, end = 1, num_target_layers - 3
    return [round(start + index * (end - start) / (count - 1)) for index in range(count)]


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.ones(dim)), eps

    def forward(self, x: Tensor) -> Tensor:
        x32 = x.float()
        return self.weight * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype)


class Attention(nn.Module):
    """Qwen3 attention (z-lab names): per-head q/k RMSNorm, no biases."""

    def __init__(self, hidden: int, heads: int, kv_heads: int, head_dim: int, eps: float) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.q_proj = nn.Linear(hidden, heads * head_dim, bias=False)
        self.k_proj = nn.Linear(hidden, kv_heads * head_dim, bias=False)
        self.v_proj = nn.Linear(hidden, kv_heads * head_dim, bias=False)
        self.o_proj = nn.Linear(heads * head_dim, hidden, bias=False)
        self.q_norm, self.k_norm = RMSNorm(head_dim, eps), RMSNorm(head_dim, eps)

    def keys(self, x: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
        """k (normed, roped) and v of rows x [B, N, H], as [B, kv_heads, N, D]."""
        batch, length, _ = x.shape
        k = self.k_norm(self.k_proj(x).view(batch, length, self.kv_heads, self.head_dim)).transpose(1, 2)
        v = self.v_proj(x).view(batch, length, self.kv_heads, self.head_dim).transpose(1, 2)
        return k * cos[:, None] + rotate_half(k) * sin[:, None], v

    def forward(self, x: Tensor, ctx_kv: tuple[Tensor, Tensor], cos: Tensor, sin: Tensor, mask: Tensor) -> Tensor:
        batch, length, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(batch, length, self.heads, self.head_dim)).transpose(1, 2)
        q = q * cos[:, None] + rotate_half(q) * sin[:, None]
        k, v = self.keys(x, cos, sin)
        groups = self.heads // self.kv_heads
        k = torch.cat((ctx_kv[0], k), dim=2).repeat_interleave(groups, dim=1)
        v = torch.cat((ctx_kv[1], v), dim=2).repeat_interleave(groups, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None])
        return self.o_proj(out.transpose(1, 2).reshape(batch, length, self.heads * self.head_dim))


class MLP(nn.Module):
    def __init__(self, hidden: int, inter: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, inter, bias=False)
        self.up_proj = nn.Linear(hidden, inter, bias=False)
        self.down_proj = nn.Linear(inter, hidden, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Layer(nn.Module):
    def __init__(self, config: dict) -> None:
        super().__init__()
        hidden, eps = config["hidden_size"], config["rms_norm_eps"]
        heads, kv_heads, head_dim = config["num_attention_heads"], config["num_key_value_heads"], config["head_dim"]
        self.self_attn = Attention(hidden, heads, kv_heads, head_dim, eps)
        self.mlp = MLP(hidden, config["intermediate_size"])
        self.input_layernorm, self.post_attention_layernorm = RMSNorm(hidden, eps), RMSNorm(hidden, eps)


class DFlashDrafter(nn.Module):
    """The z-lab drafter's own tensors (fc, hidden_norm, layers, norm); the target's embedding and
    lm_head are passed to forward, never owned (they stay frozen and are not saved)."""

    def __init__(self, config: dict) -> None:
        super().__init__()
        self.config = config
        hidden, eps = config["hidden_size"], config["rms_norm_eps"]
        ids = config["dflash_config"]["target_layer_ids"]
        self.fc = nn.Linear(len(ids) * hidden, hidden, bias=False)
        self.hidden_norm = RMSNorm(hidden, eps)
        self.layers = nn.ModuleList(Layer(config) for _ in range(config["num_hidden_layers"]))
        self.norm = RMSNorm(hidden, eps)
        head_dim = config["head_dim"]
        inv_freq = 1.0 / config["rope_theta"] ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    @property
    def block_size(self) -> int:
        return self.config["block_size"]

    @property
    def mask_token_id(self) -> int:
        return self.config["dflash_config"]["mask_token_id"]

    @property
    def target_layer_ids(self) -> list[int]:
        return self.config["dflash_config"]["target_layer_ids"]

    def rope(self, positions: Tensor) -> tuple[Tensor, Tensor]:
        freqs = positions.float()[..., None] * self.inv_freq
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos(), emb.sin()

    def forward(
        self, target: LlamaForCausalLM, features: Tensor, tokens: Tensor, anchors: Tensor, block: int | None = None
    ) -> Tensor:
        """Draft logits [B, N, K, V] of the blocks at anchors [B, N] (1 <= a, a + K < T) of windows
        tokens [B, T] with the target's features [B, T, F] (context rows 0..a-1 for anchor a). block: the
        block's length K + 1, at most block_size (None: block_size, what the drafter was trained with)."""
        batch, length = tokens.shape
        block = self.block_size if block is None else block
        assert 2 <= block <= self.block_size, (block, self.block_size)
        count = anchors.shape[1]
        offsets = torch.arange(block, device=tokens.device)
        positions = (anchors[:, :, None] + offsets).reshape(batch, count * block)  # [B, N*S]
        first = tokens.gather(1, anchors)  # x_a
        ids = torch.full((batch, count, block), self.mask_token_id, dtype=tokens.dtype, device=tokens.device)
        ids[:, :, 0] = first
        hidden = target.model.embed_tokens(ids.reshape(batch, count * block))
        # Block row r (anchor n) sees context rows t < a_n and the S rows of its own block.
        row_anchor = anchors.repeat_interleave(block, dim=1)  # [B, N*S]
        see_ctx = torch.arange(length, device=tokens.device)[None, None, :] < row_anchor[:, :, None]
        row_block = torch.arange(count, device=tokens.device).repeat_interleave(block)
        see_block = (row_block[:, None] == row_block[None, :]).expand(batch, -1, -1)
        mask = torch.cat((see_ctx, see_block), dim=2)  # [B, N*S, T + N*S]
        context = self.hidden_norm(self.fc(features))
        ctx_cos, ctx_sin = self.rope(torch.arange(length, device=tokens.device).expand(batch, -1))
        cos, sin = self.rope(positions)
        for layer in self.layers:
            ctx_kv = layer.self_attn.keys(context, ctx_cos, ctx_sin)
            hidden = hidden + layer.self_attn(layer.input_layernorm(hidden), ctx_kv, cos, sin, mask)
            hidden = hidden + layer.mlp(layer.post_attention_layernorm(hidden))
        out = self.norm(hidden).view(batch, count, block, -1)[:, :, 1:]
        return target.lm_head(out)

    def save(self, directory: Path, dtype: torch.dtype = torch.float16) -> None:
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "config.json").write_text(json.dumps(self.config, indent=2) + "\n")
        state = {name: t.detach().to("cpu", dtype).contiguous() for name, t in self.state_dict().items()}
        save_file(state, directory / WEIGHTS, metadata={"format": "pt"})

    @classmethod
    def load(cls, directory: Path) -> DFlashDrafter:
        directory = Path(directory)
        drafter = cls(json.loads((directory / "config.json").read_text()))
        state = {name: t.float() for name, t in load_file(directory / WEIGHTS).items()}
        drafter.load_state_dict(state)
        return drafter.eval()


def drafter_config(
    target: LlamaForCausalLM, layers: int, block_size: int, target_layer_ids: list[int], mask_token_id: int
) -> dict:
    """A z-lab config.json (a Qwen3 config with architectures ["DFlashDraftModel"], top-level
    block_size, dflash_config) for a drafter at the target's hidden size with the target's attention shape."""
    config = target.config
    heads = config.num_attention_heads
    rope = getattr(config, "rope_parameters", None) or {}
    return {
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": config.num_key_value_heads,
        "head_dim": getattr(config, "head_dim", None) or config.hidden_size // heads,
        "rms_norm_eps": config.rms_norm_eps,
        "hidden_act": "silu",
        "rope_theta": float(rope.get("rope_theta", getattr(config, "rope_theta", 10000.0))),
        "max_position_embeddings": config.max_position_embeddings,
        "vocab_size": config.vocab_size,
        "tie_word_embeddings": False,
        "num_target_layers": config.num_hidden_layers,
        "block_size": block_size,
        "dflash_config": {"target_layer_ids": list(target_layer_ids), "mask_token_id": mask_token_id},
    }


@torch.no_grad()
def target_features(target: LlamaForCausalLM, tokens: Tensor, layer_ids: list[int]) -> tuple[Tensor, Tensor]:
    """(concat of hidden_states[i + 1] for i in layer_ids [B, T, n*H], the target's last hidden state
    [B, T, H], whose lm_head gives its logits)."""
    states = target.model(input_ids=tokens, output_hidden_states=True).hidden_states
    return torch.cat([states[i + 1] for i in layer_ids], dim=-1), states[-1]
