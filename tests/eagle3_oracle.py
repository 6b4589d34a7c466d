"""An EAGLE-3 head built from transformers' Llama pieces, following vLLM's llama_eagle3.py forward (there
is no transformers class for it): the oracle graphspec's head is checked against, and the writer of
random test heads in the public checkpoint layout (its state_dict names are the stored names)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
import transformers
from safetensors.torch import save_file
from torch import nn
from transformers.models.llama.modeling_llama import LlamaAttention, LlamaMLP, LlamaRMSNorm, LlamaRotaryEmbedding


class Midlayer(nn.Module):
    def __init__(self, config: transformers.LlamaConfig) -> None:
        super().__init__()
        hidden, head_dim = config.hidden_size, config.head_dim
        self.self_attn = LlamaAttention(config, layer_idx=0)
        # EAGLE-3: q/k/v read [input_layernorm(embeds), hidden_norm(hidden)], 2H wide.
        self.self_attn.q_proj = nn.Linear(2 * hidden, config.num_attention_heads * head_dim, bias=False)
        self.self_attn.k_proj = nn.Linear(2 * hidden, config.num_key_value_heads * head_dim, bias=False)
        self.self_attn.v_proj = nn.Linear(2 * hidden, config.num_key_value_heads * head_dim, bias=False)
        self.mlp = LlamaMLP(config)
        self.input_layernorm = LlamaRMSNorm(hidden, config.rms_norm_eps)
        self.hidden_norm = LlamaRMSNorm(hidden, config.rms_norm_eps)
        self.post_attention_layernorm = LlamaRMSNorm(hidden, config.rms_norm_eps)


class Eagle3Oracle(nn.Module):
    """forward(embeds [B, T, H], hidden [B, T, H], positions [B, T]) -> (norm(h), h pre-norm): one causal
    forward with no cache. `hidden` is fc(aux features) or a previous pre-norm output."""

    def __init__(self, config: transformers.LlamaConfig, features: int, draft_vocab: int, norm_before_residual=False):
        super().__init__()
        config._attn_implementation = "eager"
        self.norm_before_residual = norm_before_residual
        self.fc = nn.Linear(features, config.hidden_size, bias=False)
        self.midlayer = Midlayer(config)
        self.norm = LlamaRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.lm_head = nn.Linear(config.hidden_size, draft_vocab, bias=False)
        self.rotary_emb = LlamaRotaryEmbedding(config)

    def forward(self, embeds: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor):
        layer, t = self.midlayer, embeds.shape[1]
        normed_hidden = layer.hidden_norm(hidden)
        residual = normed_hidden if self.norm_before_residual else hidden
        x = torch.cat((layer.input_layernorm(embeds), normed_hidden), dim=-1)
        mask = torch.full((t, t), float("-inf")).triu(1)[None, None]  # causal, additive
        attn_out, _ = layer.self_attn(x, position_embeddings=self.rotary_emb(hidden, positions), attention_mask=mask)
        residual = residual + attn_out
        prenorm = residual + layer.mlp(layer.post_attention_layernorm(residual))
        return self.norm(prenorm), prenorm


def head_config(target: transformers.PretrainedConfig, draft_vocab: int, **overrides) -> dict:
    """config.json of an EAGLE-3 head for `target` (hidden size, heads and vocabulary from it)."""
    config = dict(
        architectures=["LlamaForCausalLMEagle3"],
        model_type="llama",
        hidden_size=target.hidden_size,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=target.hidden_size // 4,
        intermediate_size=96,
        num_hidden_layers=1,
        hidden_act="silu",
        rms_norm_eps=1e-6,
        rope_theta=5000.0,
        max_position_embeddings=512,
        vocab_size=target.vocab_size,
        draft_vocab_size=draft_vocab,
        target_hidden_size=target.hidden_size,
        tie_word_embeddings=False,
    )
    config.update(overrides)
    return config


def make_eagle3_head(
    directory: Path, target_dir: Path, seed: int, draft_vocab: int, aux_layers=None, own_embedding=False, **overrides
) -> Path:
    """A random EAGLE-3 head for the target at `target_dir`, in the public layout: config.json,
    model.safetensors with midlayer.*, fc, norm, lm_head, d2t (a random sorted subset of target ids)
    and t2d."""
    target = transformers.AutoConfig.from_pretrained(target_dir)
    raw = head_config(target, draft_vocab, **overrides)
    if aux_layers is not None:
        raw["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": list(aux_layers)}
    layers = aux_layers or [2, target.num_hidden_layers // 2, target.num_hidden_layers - 3]
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(raw, indent=2))
    torch.manual_seed(seed)
    oracle = Eagle3Oracle(transformers.LlamaConfig(**raw), len(layers) * target.hidden_size, draft_vocab)
    state = {}
    for name, tensor in oracle.state_dict().items():
        noise = torch.randn_like(tensor) * (0.1 if name.endswith("norm.weight") else 0.2)
        state[name] = (1.0 + noise) if name.endswith("norm.weight") else noise
    used = torch.randperm(target.vocab_size)[:draft_vocab].sort().values  # the mapped target ids, in order
    state["d2t"] = used - torch.arange(draft_vocab)
    state["t2d"] = torch.zeros(target.vocab_size, dtype=torch.bool).index_fill(0, used, True)
    if own_embedding:  # a head trained with an embedding of its own (else it shares the target's)
        state["embed_tokens.weight"] = torch.randn(target.vocab_size, raw["hidden_size"]) * 0.5
    save_file({name: t.contiguous() for name, t in state.items()}, directory / "model.safetensors")
    return directory


def load_oracle(directory: Path, target: transformers.PretrainedConfig) -> tuple[Eagle3Oracle, torch.Tensor, tuple]:
    """(oracle with the head's weights, target ids of the draft ids [draft vocab], aux layers); the
    oracle's `embed_tokens` is the head's own embedding or None (the target's)."""
    from safetensors.torch import load_file

    raw = json.loads((Path(directory) / "config.json").read_text())
    layers = (raw.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids") or [
        2,
        target.num_hidden_layers // 2,
        target.num_hidden_layers - 3,
    ]
    stored = load_file(Path(directory) / "model.safetensors")
    oracle = Eagle3Oracle(
        transformers.LlamaConfig(**raw),
        len(layers) * target.hidden_size,
        raw["draft_vocab_size"],
        raw.get("norm_before_residual", False),
    )
    oracle.load_state_dict({n: t for n, t in stored.items() if n not in ("d2t", "t2d", "embed_tokens.weight")})
    oracle.embed_tokens = None
    if "embed_tokens.weight" in stored:
        oracle.embed_tokens = nn.Embedding.from_pretrained(stored["embed_tokens.weight"])
    ids = torch.arange(raw["draft_vocab_size"]) + stored["d2t"]
    return oracle.eval(), ids, tuple(layers)


def full_vocab(logits: torch.Tensor, ids: torch.Tensor, vocab: int) -> torch.Tensor:
    """Draft-vocabulary logits [..., Vd] scattered onto the target vocabulary, -inf elsewhere (vLLM)."""
    full = logits.new_full((*logits.shape[:-1], vocab), float("-inf"))
    full[..., ids] = logits
    return full


@torch.no_grad()
def oracle_drafts(oracle_pair, sequence: list[int], k: int, vocab: int) -> tuple[list[int], list[torch.Tensor]]:
    """The K greedy drafts (and their target-vocabulary logits) of the oracle head after `sequence`,
    recomputed from scratch: pairs (x_{t+1}, fc(f_t)) over the whole sequence with transformers' target
    features f, then K-1 drafts chained on the pre-norm output."""
    hf_target, oracle, ids, layers = oracle_pair
    states = hf_target(torch.tensor([sequence]), output_hidden_states=True).hidden_states
    features = torch.cat([states[i] for i in layers], dim=-1)  # [1, L, F]
    tokens, hidden = torch.tensor([sequence[1:]]), oracle.fc(features[:, :-1])
    drafts, logits = [], []
    for _ in range(k):
        out, prenorm = oracle(oracle.embed_tokens(tokens), hidden, torch.arange(tokens.shape[1])[None])
        logits.append(full_vocab(oracle.lm_head(out[0, -1]), ids, vocab))
        drafts.append(int(logits[-1].argmax()))
        tokens = torch.cat((tokens, torch.tensor([[drafts[-1]]])), 1)
        hidden = torch.cat((hidden, prenorm[:, -1:]), 1)
    return drafts, logits


@torch.no_grad()
def oracle_generation(
    oracle_pair, prompt: list[int], k: int, new_tokens: int, vocab: int
) -> tuple[list[int], list[int]]:
    """EAGLE-3 greedy speculative decoding with transformers' target (full forwards, no cache) and the
    oracle head: (emitted tokens, accepted count per step)."""
    hf_target = oracle_pair[0]
    sequence, counts = list(prompt), []
    sequence.append(int(hf_target(torch.tensor([sequence])).logits[0, -1].argmax()))
    while len(sequence) - len(prompt) < new_tokens:
        drafts, _ = oracle_drafts(oracle_pair, sequence, k, vocab)
        verify = hf_target(torch.tensor([sequence + drafts])).logits[0, len(sequence) - 1 :].argmax(-1).tolist()
        accepted = next((i for i in range(k) if drafts[i] != verify[i]), k)
        sequence += [*drafts[:accepted], verify[accepted]]
        counts.append(accepted)
    return sequence[len(prompt) :], counts
