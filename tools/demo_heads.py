"""Training-side modules for the demo target's two heads: an MTP head (SGLang standalone NextN layout)
and an EAGLE-3 head (the public layout vLLM and SafeAILab use). tools/ only: graphspec's own drafters
(graphspec/drafters/) are the inference side; these modules exist to train the heads and to measure
their greedy acceptance, and they write and read exactly the checkpoint files graphspec loads.

Both heads read pairs (x_{s+1}, feature_s) - the next token and the target's feature at position s - and
predict x_{s+2}; draft j of a chain (j = 0..K-1) feeds the head's own output for draft j-1 in place of
the target's feature and the token that draft j-1 proposed. `unroll` computes every draft of every chain
of a sequence in one pass ("training-time test", as SafeAILab's EAGLE-3 trains): draft j's query at
pair s sees the target-fed pairs 0..s of draft 0 and its own chain's pairs at s for drafts 1..j, which
is what the head's KV cache holds at inference (catch-up over the committed pairs, then the chain). When
drafts 0..j-1 of a chain were accepted, the tokens they proposed are the real ones, so feeding the real
tokens (teacher forcing) gives exactly the inference drafts wherever acceptance can still reach.

Rotary positions: MTP follows transformers' MtpModel (a pair's rotary position is the token's, s + 1,
graphspec/drafters/mtp.py); EAGLE-3 follows vLLM (the feature's, s). Chain draft j sits j further on.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import Tensor, nn
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.models.llama.modeling_llama import LlamaMLP, LlamaRMSNorm, LlamaRotaryEmbedding, rotate_half

MTP_PREFIX = "model.layers.0."  # SGLang's standalone NextN checkpoints hold the layer at index 0
WEIGHTS = "model.safetensors"


class HeadAttention(nn.Module):
    """Llama attention (transformers' parameter names) whose q/k/v read `in_features` (2H for EAGLE-3)."""

    def __init__(self, config: LlamaConfig, in_features: int) -> None:
        super().__init__()
        self.heads, self.kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.heads
        self.q_proj = nn.Linear(in_features, self.heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(in_features, self.kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(in_features, self.kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.heads * self.head_dim, config.hidden_size, bias=False)

    def project(self, x: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """q [B, heads, N, D], k and v [B, heads, N, D] (kv heads repeated), rotated at cos/sin."""
        batch, length, _ = x.shape

        def split(projection: nn.Linear, heads: int) -> Tensor:
            return projection(x).view(batch, length, heads, self.head_dim).transpose(1, 2)

        cos, sin = cos[:, None], sin[:, None]
        q, k = split(self.q_proj, self.heads), split(self.k_proj, self.kv_heads)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        groups = self.heads // self.kv_heads
        v = split(self.v_proj, self.kv_heads)
        return q, k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)


def ttt_mask(length: int, drafts: int, device: torch.device) -> Tensor:
    """[N, drafts * N] bool: query s of the last draft sees keys 0..s of draft 0 (causal) and key s of
    each later draft (its own chain); every other key belongs to another chain or to the future."""
    index = torch.arange(length, device=device)
    blocks = [index[None, :] <= index[:, None]] + [index[None, :] == index[:, None]] * (drafts - 1)
    return torch.cat(blocks, dim=1)


class Unrolled(nn.Module):
    """The shared chain: `step(tokens_embedded, hidden, cos, sin, keys, values) -> (chain hidden, normed)`
    is one head layer; subclasses say how pairs are built and where logits come from."""

    position_offset = 0  # the rotary position of pair s is s + position_offset

    def attention_layer(self) -> nn.Module:
        raise NotImplementedError

    def unroll(self, target: LlamaForCausalLM, tokens: Tensor, features: Tensor, drafts: int) -> list[Tensor]:
        """Logits of drafts 0..drafts-1 for every pair s = 0..T-2 of `tokens` [B, T]: list of [B, T-1, vocab];
        draft j at s predicts tokens[:, s + 2 + j] (rows past the sequence read token 0 and are dead)."""
        batch, length = tokens.shape[0], tokens.shape[1] - 1
        embed = target.get_input_embeddings()
        padded = F.pad(tokens, (0, drafts))  # token 0 past the end: those pairs predict nothing real
        hidden = self.first_hidden(features[:, :length])
        positions = torch.arange(length, device=tokens.device).expand(batch, -1) + self.position_offset
        rotary = self.rotary
        keys, values, logits = [], [], []
        for draft in range(drafts):
            embedded = embed(padded[:, 1 + draft : 1 + draft + length])
            cos, sin = rotary(embedded, positions + draft)
            hidden, normed, k, v = self.step(embedded, hidden, cos, sin, keys, values)
            keys.append(k)
            values.append(v)
            logits.append(self.logits(target, normed))
        return logits

    def attend(self, attention: HeadAttention, x: Tensor, cos: Tensor, sin: Tensor, keys: list, values: list):
        q, k, v = attention.project(x, cos, sin)
        mask = ttt_mask(x.shape[1], len(keys) + 1, x.device)
        out = F.scaled_dot_product_attention(
            q, torch.cat([*keys, k], dim=2), torch.cat([*values, v], dim=2), attn_mask=mask
        )  # [B, heads, N, D]
        out = attention.o_proj(out.transpose(1, 2).flatten(2))
        return out, k, v


class MtpHead(Unrolled):
    """out = shared_head.norm(layer(eh_proj([enorm(embed(x_{s+1})), hnorm(h_s)]))), logits = the target's
    lm_head(out); h_s is the target's final post-norm hidden state, and a chain feeds `out` back as h."""

    position_offset = 1

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        hidden, eps = config.hidden_size, config.rms_norm_eps
        self.config = config
        self.enorm, self.hnorm = LlamaRMSNorm(hidden, eps), LlamaRMSNorm(hidden, eps)
        self.eh_proj = nn.Linear(2 * hidden, hidden, bias=False)
        self.input_layernorm = LlamaRMSNorm(hidden, eps)
        self.self_attn = HeadAttention(config, hidden)
        self.post_attention_layernorm = LlamaRMSNorm(hidden, eps)
        self.mlp = LlamaMLP(config)
        self.shared_head = nn.Module()
        self.shared_head.norm = LlamaRMSNorm(hidden, eps)
        self.rotary = LlamaRotaryEmbedding(config)

    def first_hidden(self, features: Tensor) -> Tensor:
        return features

    def step(self, embedded, hidden, cos, sin, keys, values):
        residual = self.eh_proj(torch.cat((self.enorm(embedded), self.hnorm(hidden)), dim=-1))
        attended, k, v = self.attend(self.self_attn, self.input_layernorm(residual), cos, sin, keys, values)
        residual = residual + attended
        out = self.shared_head.norm(residual + self.mlp(self.post_attention_layernorm(residual)))
        return out, out, k, v

    def logits(self, target: LlamaForCausalLM, normed: Tensor) -> Tensor:
        return target.lm_head(normed)

    def to_target_ids(self, draft_ids: Tensor) -> Tensor:
        return draft_ids

    def save(self, directory: Path, dtype: torch.dtype = torch.float16) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        config = self.config.to_dict()
        config.update(architectures=["LlamaForCausalLMNextN"], num_nextn_predict_layers=1, dtype=dtype_name(dtype))
        config["_name_or_path"] = ""  # the target config's load path (a training machine's folder) says nothing here
        (directory / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        tensors = {MTP_PREFIX + name: tensor for name, tensor in self.state_dict().items()}
        save_file(stored(tensors, dtype), directory / WEIGHTS, metadata={"format": "pt"})

    @classmethod
    def load(cls, directory: Path) -> MtpHead:
        config = json.loads((Path(directory) / "config.json").read_text())
        if config.get("architectures") != ["LlamaForCausalLMNextN"] or config.get("num_nextn_predict_layers") != 1:
            raise ValueError(f"{directory} is not a one-layer LlamaForCausalLMNextN head")
        head = cls(LlamaConfig(**{k: v for k, v in config.items() if k not in ("architectures", "dtype")}))
        tensors = load_file(Path(directory) / WEIGHTS)
        head.load_state_dict({name.removeprefix(MTP_PREFIX): t.float() for name, t in tensors.items()})
        return head


class Eagle3Midlayer(nn.Module):
    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        hidden, eps = config.hidden_size, config.rms_norm_eps
        self.input_layernorm = LlamaRMSNorm(hidden, eps)
        self.hidden_norm = LlamaRMSNorm(hidden, eps)
        self.self_attn = HeadAttention(config, 2 * hidden)
        self.post_attention_layernorm = LlamaRMSNorm(hidden, eps)
        self.mlp = LlamaMLP(config)


class Eagle3Head(Unrolled):
    """vLLM's llama_eagle3 forward: g = fc(cat of the target's aux hidden states); one midlayer whose
    q/k/v read cat[input_layernorm(embed(x)), hidden_norm(g)] with g as the residual; logits over the
    draft vocabulary = lm_head(norm(prenorm)); a chain feeds the prenorm output back as g (no fc)."""

    def __init__(self, config: LlamaConfig, target_hidden_size: int, aux_layer_ids: list[int], d2t: Tensor) -> None:
        super().__init__()
        hidden = config.hidden_size
        self.config, self.target_hidden_size, self.aux_layer_ids = config, target_hidden_size, list(aux_layer_ids)
        self.fc = nn.Linear(len(aux_layer_ids) * target_hidden_size, hidden, bias=False)
        self.midlayer = Eagle3Midlayer(config)
        self.norm = LlamaRMSNorm(hidden, config.rms_norm_eps)
        self.lm_head = nn.Linear(hidden, len(d2t), bias=False)
        target_ids = torch.arange(len(d2t)) + d2t
        t2d = torch.zeros(config.vocab_size, dtype=torch.bool)
        t2d[target_ids] = True
        self.register_buffer("d2t", d2t.to(torch.int64))
        self.register_buffer("t2d", t2d)
        self.rotary = LlamaRotaryEmbedding(config)

    def first_hidden(self, features: Tensor) -> Tensor:
        return self.fc(features)

    def step(self, embedded, hidden, cos, sin, keys, values):
        layer = self.midlayer
        x = torch.cat((layer.input_layernorm(embedded), layer.hidden_norm(hidden)), dim=-1)
        attended, k, v = self.attend(layer.self_attn, x, cos, sin, keys, values)
        residual = hidden + attended
        prenorm = residual + layer.mlp(layer.post_attention_layernorm(residual))
        return prenorm, self.norm(prenorm), k, v

    def logits(self, target: LlamaForCausalLM, normed: Tensor) -> Tensor:
        return self.lm_head(normed)

    def to_target_ids(self, draft_ids: Tensor) -> Tensor:
        return draft_ids + self.d2t[draft_ids]

    def save(self, directory: Path, dtype: torch.dtype = torch.float16) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        c = self.config
        config = {
            "architectures": ["LlamaForCausalLMEagle3"],
            "model_type": "llama",
            "hidden_size": c.hidden_size,
            "num_attention_heads": c.num_attention_heads,
            "num_key_value_heads": c.num_key_value_heads,
            "head_dim": c.hidden_size // c.num_attention_heads,
            "intermediate_size": c.intermediate_size,
            "num_hidden_layers": 1,
            "hidden_act": "silu",
            "rms_norm_eps": c.rms_norm_eps,
            "rope_theta": c.rope_parameters["rope_theta"],
            "max_position_embeddings": c.max_position_embeddings,
            "vocab_size": c.vocab_size,
            "draft_vocab_size": len(self.d2t),
            "target_hidden_size": self.target_hidden_size,
            "tie_word_embeddings": False,
            "dtype": dtype_name(dtype),
            "eagle_config": {"eagle_aux_hidden_state_layer_ids": self.aux_layer_ids},
        }
        (directory / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        save_file(stored(self.state_dict(), dtype), directory / WEIGHTS, metadata={"format": "pt"})

    @classmethod
    def load(cls, directory: Path) -> Eagle3Head:
        config = json.loads((Path(directory) / "config.json").read_text())
        if config.get("architectures") != ["LlamaForCausalLMEagle3"]:
            raise ValueError(f"{directory} is not a LlamaForCausalLMEagle3 head")
        llama = llama_config(
            config["vocab_size"], config["hidden_size"], config["intermediate_size"], config["num_attention_heads"],
            config["num_key_value_heads"], config["max_position_embeddings"], config["rms_norm_eps"],
            config["rope_theta"],
        )  # fmt: skip
        tensors = load_file(Path(directory) / WEIGHTS)
        ids = config["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
        head = cls(llama, config["target_hidden_size"], ids, tensors["d2t"])
        head.load_state_dict({n: (t if n in ("d2t", "t2d") else t.float()) for n, t in tensors.items()})
        return head


def eagle3_config(target: LlamaConfig) -> LlamaConfig:
    """The EAGLE-3 midlayer's shape: the target's hidden size, heads and MLP (as public EAGLE-3 heads)."""
    return llama_config(
        target.vocab_size, target.hidden_size, target.intermediate_size, target.num_attention_heads,
        target.num_key_value_heads, target.max_position_embeddings, target.rms_norm_eps,
        target.rope_parameters["rope_theta"],
    )  # fmt: skip


def llama_config(vocab, hidden, intermediate, heads, kv_heads, positions, eps, rope_theta) -> LlamaConfig:
    return LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=1,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=positions,
        rms_norm_eps=eps,
        rope_parameters={"rope_type": "default", "rope_theta": rope_theta},
    )


def default_aux_layers(num_layers: int) -> list[int]:
    """vLLM's default EAGLE-3 aux layers for Llama: the inputs of layers 2, L // 2 and L - 3."""
    return [min(2, num_layers - 1), num_layers // 2, max(0, num_layers - 3)]


def frequent_tokens_d2t(counts: Tensor, draft_vocab: int) -> Tensor:
    """d2t for the `draft_vocab` most frequent target ids (SafeAILab: sorted ids, d2t[d] = id_d - d)."""
    used = torch.sort(torch.topk(counts, draft_vocab, sorted=False).indices).values
    return used - torch.arange(draft_vocab)


def target_features(target: LlamaForCausalLM, tokens: Tensor, head: Unrolled) -> tuple[Tensor, Tensor]:
    """(features [B, T, F] the head reads, target logits [B, T, V]) from one target forward."""
    out = target.model(input_ids=tokens, output_hidden_states=True)
    if isinstance(head, Eagle3Head):  # hidden_states[i] (i < L) is the input of layer i in every version
        features = torch.cat([out.hidden_states[index] for index in head.aux_layer_ids], dim=-1)
    else:
        features = out.last_hidden_state  # after the final norm: what the target's lm_head reads
    return features, target.lm_head(out.last_hidden_state)


def stored(tensors: dict[str, Tensor], dtype: torch.dtype) -> dict[str, Tensor]:
    return {
        n: (t if not t.is_floating_point() else t.to(dtype)).detach().cpu().contiguous() for n, t in tensors.items()
    }


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")
