"""EAGLE-3 heads (SafeAILab EAGLE-3, SpecForge; vLLM's llama_eagle3.py is the serving reference).

A head predicts the token after next from (the next token, features of the target here): features
are the residual streams entering three target layers (transformers' hidden_states[i] for the aux
layers i, default (2, L // 2, L - 3)), fused by `fc` [H, 3 * target H]; one decoder layer whose q/k/v
read [input_layernorm(embed(x_{t+1})), hidden_norm(h_t)] (2H wide), then
    residual = h_t (or hidden_norm(h_t) with norm_before_residual)
    x, residual = post_attention_layernorm(attn + residual), attn + residual
    out, prenorm = norm(mlp(x) + residual), mlp(x) + residual          logits = lm_head(out) [draft vocab]
Drafts 2..K chain on the pre-norm value: h for d_i is the head's own `prenorm` for d_{i-1} (vLLM).
The head's vocabulary is reduced: draft id d is target id d + d2t[d]; its logits are scattered onto
the target vocabulary (-inf elsewhere, as vLLM's compute_logits), so greedy proposals and rejection
sampling's q are over target ids and never pick an unmapped one. Positions follow vLLM: rotary and
the KV entry at the feature's position t.

One step is MTP's (see mtp.py): catch-up over the previous verify's K+1 (token, features) rows (the
accepted ones are exact, the rest write dead KV), d1 from the accepted row, then K-1 chained drafts.

Checkpoint layout (a head directory): config.json with architectures [...Eagle3...], the target's
vocab_size, draft_vocab_size, optional target_hidden_size and eagle_config.eagle_aux_hidden_state_layer_ids;
tensors midlayer.{self_attn.{q,k,v,o}_proj, mlp.{gate,up,down}_proj, input_layernorm, hidden_norm,
post_attention_layernorm}.weight, fc.weight, norm.weight, lm_head.weight [draft vocab, H], d2t int64
[draft vocab] (may be absent when the draft vocabulary is the target's), optional embed_tokens.weight
(else the target's embedding); t2d is not read.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from safetensors import safe_open
from torch import Tensor, nn

from graphspec import ops
from graphspec.drafters.base import (
    CommitWrite,
    Drafter,
    PrefillChunk,
    PrefillEnd,
    PrefillView,
    Proposal,
    State,
    StepView,
    rows_at,
)
from graphspec.drafters.token_map import read_token_map, restrict_map
from graphspec.errors import CheckpointError, InputError
from graphspec.models.decoder import (
    DecoderLayer,
    DecoderLM,
    Embedding,
    FusedLinear,
    Linear,
    RMSNorm,
    checkpoint_state,
    kv_cache_shape,
    rope_tables,
)
from graphspec.models.loading import LoadedModel, checkpoint_tensors, load_config, read_into, tensor_problems
from graphspec.models.spec import ModelSpec, rope_frequencies

ARCHITECTURE = "Eagle3"  # a head directory's config.json architectures name contains it
# Stored tensors the head does not read: t2d (target -> draft membership) says what d2t says, and
# rotary tables older transformers versions saved with the weights (graphspec computes its own).
IGNORED_TENSORS = ("t2d",)
IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


class Eagle3Head(nn.Module):
    """forward(tokens [B, T], hidden [B, T, H], kv_start [B], slot_ids, cache, cos, sin) -> (normed
    [B, T, H], prenorm [B, T, H], cache): the midlayer over pairs (tokens[t], hidden[t]) with their KV at
    kv_start + t. `hidden` is fc(features) for target features, or a previous prenorm when chaining."""

    def __init__(
        self,
        spec: ModelSpec,
        features: int,
        draft_vocab: int,
        embed_tokens: nn.Embedding | None,
        norm_before_residual: bool,
        inv_freq: Tensor,
        rope_scale: float,
    ) -> None:
        super().__init__()
        self.spec, self.norm_before_residual, self.rope_scale = spec, norm_before_residual, rope_scale
        hidden = spec.hidden_size
        with torch.device("meta"):
            self.fc = Linear(features, hidden, bias=False)
            self.midlayer = DecoderLayer(spec, 0)  # layer 0 of the head's own KV cache
            attn = self.midlayer.self_attn
            attn.qkv_proj = FusedLinear(2 * hidden, attn.qkv_proj.parts, spec.qkv_bias)  # q/k/v read the 2H concat
            self.midlayer.hidden_norm = RMSNorm(hidden, spec.rms_norm_eps)
            self.norm = RMSNorm(hidden, spec.rms_norm_eps)
            self.lm_head = Linear(hidden, draft_vocab, bias=False)
            own = Embedding(spec.vocab_size, hidden) if embed_tokens is None else None
        self.embed_tokens = own if own is not None else embed_tokens  # the target's module when shared
        self.register_buffer("inv_freq", inv_freq.to(torch.float32), persistent=False)
        # Draft id -> target id (d + d2t[d]); set from the checkpoint's d2t when the weights load.
        self.register_buffer("draft_to_target", torch.arange(draft_vocab), persistent=False)

    def forward(
        self,
        tokens: Tensor,
        hidden: Tensor,
        kv_start: Tensor,
        slot_ids: Tensor,
        cache: Tensor,
        cos: Tensor,
        sin: Tensor,
        in_place: bool = False,
    ) -> tuple[Tensor, Tensor, Tensor]:
        layer, eps = self.midlayer, self.spec.rms_norm_eps
        # [input_layernorm(embed(tokens)), hidden_norm(hidden)] [B, T, 2H]
        x = ops.embed_norm_concat(
            tokens, self.embed_tokens.weight, layer.input_layernorm.weight, hidden, layer.hidden_norm.weight, eps
        )
        residual = x[..., hidden.shape[-1] :].contiguous() if self.norm_before_residual else hidden
        attn_out, cache = layer.self_attn(x, cos, sin, kv_start, slot_ids, cache, in_place)
        x, residual = ops.add_rms_norm(attn_out, residual, layer.post_attention_layernorm.weight, eps)
        out, prenorm = ops.add_rms_norm(layer.mlp(x), residual, self.norm.weight, eps)
        return out, prenorm, cache


@dataclass
class HeadPlan:
    """Everything check_drafter learns about a head directory from its config and file headers (and
    its small d2t tensor), before any other weight is read."""

    head: Eagle3Head  # on meta
    names: dict[str, str]  # own checkpoint-layout name -> stored name
    files: list[Path]
    config: Any  # the head's transformers config
    aux_layers: tuple[int, ...]
    d2t: Tensor | None  # [draft vocab] int64, None: the identity

    def target_ids(self) -> Tensor:
        """The target id of every draft id, d + d2t[d] [draft vocab] (on the CPU)."""
        ids = torch.arange(self.head.lm_head.out_features)
        return ids if self.d2t is None else ids + self.d2t


def is_eagle3(architectures: list[str] | None) -> bool:
    return any(ARCHITECTURE in name for name in architectures or ())


def aux_layers(raw: dict[str, Any], path: Path, num_layers: int) -> tuple[int, ...]:
    """The target layers whose inputs the head reads: the config's ids, else (2, L // 2, L - 3)."""
    eagle_config = raw.get("eagle_config") or {}
    ids = eagle_config.get("eagle_aux_hidden_state_layer_ids", raw.get("eagle_aux_hidden_state_layer_ids"))
    where = f"{path}: eagle_aux_hidden_state_layer_ids"
    if ids is None:
        ids, where = [2, num_layers // 2, num_layers - 3], f"{path}: the default aux layers (2, L // 2, L - 3)"
    if not isinstance(ids, list) or not ids or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        raise InputError(f"{where} must be a non-empty list of layer indices, got {ids!r}")
    bad = [i for i in ids if not 0 <= i < num_layers]
    if bad:
        raise InputError(
            f"{where} {ids} name layers {bad} outside the target's {num_layers} layers (0..{num_layers - 1})"
        )
    return tuple(ids)


def plan_head(path: Path, target_config: Any, target: DecoderLM) -> HeadPlan:
    """The head (on meta) for `target` with its stored names, every config field, name and shape
    checked against the target and the file headers, and d2t's entries checked to be target ids.
    `target` may be on meta (check_drafter calls this before the target's weights load)."""
    path = Path(path)
    raw = json.loads((path / "config.json").read_text()) if (path / "config.json").is_file() else {}
    if raw and "model_type" not in raw:
        raise InputError(
            f'{path}/config.json has no model_type; EAGLE-3 heads are Llama layers: add "model_type": "llama"'
        )
    config = load_config(path)  # raises on a missing or unreadable config.json
    # The midlayer is a Llama layer whatever family the config names (vLLM's LlamaForCausalLMEagle3):
    # no per-head q/k norms, biases only where attention_bias / mlp_bias ask for them.
    bias = bool(raw.get("attention_bias", False))
    spec = replace(
        ModelSpec.from_config(config), qk_norm=False, qkv_bias=bias, o_bias=bias, mlp_bias=bool(raw.get("mlp_bias"))
    )
    target_spec = target.spec
    if spec.num_layers != 1:
        raise InputError(f"{path}: num_hidden_layers={spec.num_layers}; graphspec runs EAGLE-3 heads of one layer")
    if spec.vocab_size != target_spec.vocab_size:
        raise InputError(
            f"{path}: the head's vocab_size {spec.vocab_size} is not the target's {target_spec.vocab_size}; an "
            f"EAGLE-3 head must be trained for this target"
        )
    target_hidden = raw.get("target_hidden_size") or spec.hidden_size
    if target_hidden != target_spec.hidden_size:
        raise InputError(
            f"{path}: the head reads target hidden states of size {target_hidden} (target_hidden_size or "
            f"hidden_size), but the target's hidden_size is {target_spec.hidden_size}"
        )
    draft_vocab = int(raw.get("draft_vocab_size") or spec.vocab_size)
    if not 0 < draft_vocab <= spec.vocab_size:
        raise InputError(f"{path}: draft_vocab_size {draft_vocab} must be in 1..vocab_size ({spec.vocab_size})")
    layers = aux_layers(raw, path, target_spec.num_layers)
    files, available = checkpoint_tensors(path)
    own_embedding = "embed_tokens.weight" in available
    if not own_embedding and spec.hidden_size != target_spec.hidden_size:
        raise InputError(
            f"{path}: the head's hidden_size {spec.hidden_size} differs from the target's {target_spec.hidden_size} "
            f"and it stores no embed_tokens.weight, so it cannot share the target's embedding"
        )
    inv_freq, rope_scale = rope_frequencies(config)
    head = Eagle3Head(
        spec,
        len(layers) * target_hidden,
        draft_vocab,
        None if own_embedding else target.model.embed_tokens,
        bool(raw.get("norm_before_residual", False)),
        inv_freq,
        rope_scale,
    )
    own = {name: tuple(tensor.shape) for name, tensor in checkpoint_state(head).items()}
    if not own_embedding:
        own.pop("embed_tokens.weight")
    check_tensors(path, own, available, draft_vocab, spec.vocab_size)
    d2t = read_d2t(path, available, draft_vocab, spec.vocab_size)
    return HeadPlan(head, {name: name for name in own}, files, config, layers, d2t)


def mapped_rows(draft_to_target: Tensor, token_map: str | Path, path: str | Path, vocab_size: int) -> Tensor:
    """The head's draft ids (rows of its lm_head) whose target ids the token-map file holds, ordered by
    target id; the file is checked and an empty overlap refused (token_map.restrict_map)."""
    ids = read_token_map(token_map, vocab_size)
    return restrict_map(draft_to_target, ids, f"token map {token_map} and EAGLE-3 head {path}")


def check_tensors(
    path: Path, own: dict[str, tuple[int, ...]], available: dict[str, Any], draft_vocab: int, vocab: int
) -> None:
    """Every tensor the head needs is stored with its shape; nothing unknown is stored."""
    expected = {**own, "d2t": (draft_vocab,)}
    # Without d2t only the identity map (draft vocabulary = target vocabulary) is known.
    needed = [*own, "d2t"] if draft_vocab != vocab else list(own)
    ignored = set(IGNORED_TENSORS)
    problems = tensor_problems(
        expected, available, needed, lambda name: name in ignored or name.endswith(IGNORED_SUFFIXES)
    )
    if problems:
        raise CheckpointError(f"{path}: the EAGLE-3 head does not fit the target: " + "; ".join(problems))


def read_d2t(path: Path, available: dict[str, Any], draft_vocab: int, vocab: int) -> Tensor | None:
    """The d2t offsets (draft id d -> target id d + d2t[d]), checked to name distinct target ids."""
    if "d2t" not in available:
        return None
    file = available["d2t"][0]
    with safe_open(str(file), framework="pt", device="cpu") as handle:
        d2t = handle.get_tensor("d2t")
    if d2t.dtype not in (torch.int64, torch.int32):
        raise CheckpointError(f"{path}: d2t must hold integers (int64), found {d2t.dtype}")
    ids = torch.arange(draft_vocab) + d2t.to(torch.int64)
    bad = ((ids < 0) | (ids >= vocab)).nonzero().flatten().tolist()
    if bad:
        shown = ", ".join(f"d2t[{i}]={int(d2t[i])} -> {int(ids[i])}" for i in bad[:5])
        raise InputError(
            f"{path}: d2t maps draft ids to target ids outside 0..{vocab - 1} ({len(bad)} entries: {shown}); "
            f"target id = draft id + d2t[draft id]"
        )
    if ids.unique().numel() != draft_vocab:
        raise InputError(f"{path}: d2t maps several draft ids to one target id; each draft id needs its own")
    return d2t.to(torch.int64)


class Eagle3(Drafter):
    kind = "eagle3"

    def __init__(
        self,
        path: str | Path,
        target: LoadedModel,
        dtype: torch.dtype,
        device: str | torch.device,
        token_map: str | Path | None = None,
    ) -> None:
        """token_map: a token-map file (drafters/token_map.py): draft over the head's ids that it holds only
        (the head's lm_head sliced to their rows once, here); None: the head's whole draft vocabulary."""
        plan = plan_head(Path(path), target.config, target.model)
        head = plan.head
        read_into(head, plan.files, plan.names, dtype, device)
        head.draft_to_target = plan.target_ids()
        if token_map is not None:
            kept = mapped_rows(head.draft_to_target, token_map, path, head.spec.vocab_size)
            head.lm_head.weight = nn.Parameter(
                head.lm_head.weight.index_select(0, kept.to(device)), requires_grad=False
            )
            head.lm_head.out_features = kept.numel()
            head.draft_to_target = head.draft_to_target[kept]
        head.draft_to_target = head.draft_to_target.to(device)
        head.inv_freq = head.inv_freq.to(device)
        head.eval().requires_grad_(False)
        self.head, self.target = head, target.model
        self.aux_layers = plan.aux_layers
        self.target_features = tuple(f"layer_in:{index}" for index in plan.aux_layers)
        # The artifact stores the head directory's files as the "draft" checkpoint.
        self.loaded = LoadedModel(head, plan.config, None, Path(path), plan.files)  # type: ignore[arg-type]
        self.settings = {} if token_map is None else {"token_map": str(Path(token_map).absolute())}

    def describe(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "aux_layers": list(self.aux_layers),
            "draft_vocab_size": self.head.lm_head.out_features,  # the token map's overlap with it, given one
        }

    def states(self, slots: int, max_seq_len: int, k: int, dtype: torch.dtype) -> tuple[State, ...]:
        features = self.head.fc.in_features
        return (
            State("eagle3_cache", kv_cache_shape(self.head.spec, 1, slots, max_seq_len), dtype, "length"),
            # The last verify's K+1 rows: target features, tokens (row j at position start + j), and start.
            State(
                "eagle3_features", (slots, k + 1, features), dtype, "verified", CommitWrite("target_features", "start")
            ),
            State("eagle3_tokens", (slots, k + 1), torch.int64, "verified", CommitWrite("tokens", "start")),
            State("eagle3_start", (slots, 1), torch.int64, "verified", CommitWrite("committed_len", "start")),
        )

    def draft_scores(self, params: dict[str, Tensor], out: Tensor) -> tuple[Tensor, Tensor]:
        """(logits [B, draft vocab], their target ids) of head outputs [B, H]; rejection sampling's q is
        scatter_to_vocab of them (draft logits at their target ids, -inf elsewhere: no draft and no draft
        probability lands on an unmapped id)."""
        return F.linear(out, params["lm_head.weight"]), params["draft_to_target"]

    def pick(self, params: dict[str, Tensor], out: Tensor, step: StepView, index: int) -> tuple[Tensor, Tensor]:
        """(draft [B], its logits [B, V]) of head outputs [B, H] (StepView.pick_mapped)."""
        return step.pick_mapped(*self.draft_scores(params, out), self.head.spec.vocab_size, index)

    def propose(self, params: dict[str, Tensor], step: StepView, state: dict[str, Tensor]) -> Proposal:
        k, inputs = step.k, step.inputs
        length, slot_ids = inputs["committed_len"], inputs["slot_ids"]  # L [B]
        cache = state["eagle3_cache"]
        # The catch-up window: the state's W = K_max + 1 rows (the largest K of any bucket's step; the
        # previous step, whatever its K, accepted at most W - 1 drafts). This step drafts its own K.
        width = state["eagle3_features"].shape[1]
        offsets = torch.arange(width, device=length.device)
        features = state["eagle3_features"].index_select(0, slot_ids)  # [B, W, F]
        start = state["eagle3_start"].index_select(0, slot_ids)[:, 0]  # [B]: position of tokens[:, 0]
        accepted = (length - 1 - start).clamp(min=0, max=width - 1)  # the previous step's accepted count
        # Rows past it are dead; give them a valid token id (an embedding lookup must stay in range).
        tokens = torch.where(offsets <= accepted[:, None], state["eagle3_tokens"].index_select(0, slot_ids), 0)
        # Row j's features sit at position start - 1 + j; clamped so even a never-written slot (padding
        # rows read the spare one) writes inside the cache.
        kv_start = (start - 1).clamp(min=0, max=cache.shape[4] - width)
        drafted = length - 2 + torch.arange(1, k, device=length.device)[:, None]  # drafts 2..K's KV positions [K-1, B]
        # Their KV starts, computed with the other position arithmetic (one launch on a GPU, not one per draft);
        # [K-1, B], so each draft's row is contiguous (the kernels read a [B] index as contiguous).
        chain_kv = drafted.clamp(min=0)
        positions = torch.cat((kv_start[:, None] + offsets, drafted.t()), dim=1)
        cos, sin = rope_tables(positions, params["inv_freq"], self.head.rope_scale)  # [B, W + K - 1, D]

        def head(tokens: Tensor, hidden: Tensor, kv: Tensor, cache: Tensor, rows: slice) -> tuple[Tensor, ...]:
            args = (tokens, hidden, kv, slot_ids, cache, cos[:, rows], sin[:, rows])
            return torch.func.functional_call(self.head, params, args)

        # 1. Catch-up over the previous verify's rows; the accepted row's output predicts d1.
        hidden = F.linear(features, params["fc.weight"])  # [B, W, H]
        out, prenorm, cache = head(tokens, hidden, kv_start, cache, slice(0, width))
        out, chained = rows_at(accepted, out, prenorm)  # [B, H] each
        proposal, logits = self.pick(params, out, step, 0)  # [B], [B, V]
        proposals, proposal_logits = [proposal], [logits]
        # 2. Drafts 2..K: d_{i-1} (at position L + i - 2) with the head's own pre-norm value, at L + i - 3.
        for index in range(1, k):
            out, prenorm, cache = head(
                proposals[-1][:, None],
                chained[:, None],
                chain_kv[index - 1],
                cache,
                slice(width + index - 1, width + index),
            )
            chained = prenorm[:, 0]
            proposal, logits = self.pick(params, out[:, 0], step, index)
            proposals.append(proposal)
            proposal_logits.append(logits)
        kept = {name: state[name] for name in ("eagle3_features", "eagle3_tokens", "eagle3_start")}
        return Proposal(torch.stack(proposals, dim=1), {"eagle3_cache": cache, **kept}, torch.stack(proposal_logits, 1))

    def prefill(self, prompt: PrefillView, state: dict[str, Tensor]) -> None:
        tokens, features, slots, lengths = prompt.tokens, prompt.features, prompt.slot_ids, prompt.lengths
        assert features is not None, "prefill needs the target features the drafter declares"
        if tokens.shape[1] > 1:  # pairs (x_t, f_{t-1}) at positions t - 1 = 0 .. T-2; right padding writes dead KV
            kv_start = torch.zeros_like(lengths)
            positions = torch.arange(tokens.shape[1] - 1, device=tokens.device).expand(tokens.shape[0], -1)
            cos, sin = rope_tables(positions, self.head.inv_freq, self.head.rope_scale)
            cache = state["eagle3_cache"][..., : tokens.shape[1] - 1, :]  # a view cut to the pairs, as the target's
            hidden = self.head.fc(features[:, :-1])
            self.head(tokens[:, 1:], hidden, kv_start, slots, cache, cos, sin, in_place=True)
        self.prefill_finish(prompt.end(), state)

    def prefill_chunk(
        self, params: dict[str, Tensor], chunk: PrefillChunk, state: dict[str, Tensor]
    ) -> dict[str, Tensor]:
        # Pairs (x_{p+1}, f_p) for the chunk's positions p: KV and rotary at p (as prefill() above). The
        # pair of the prompt's last position (its x is the first token, unknown yet) and those past it
        # write dead KV: the first step's catch-up rewrites the entry at L - 1 before reading it.
        assert chunk.features is not None, "prefill needs the target features the drafter declares"
        positions = chunk.start_pos[:, None] + torch.arange(chunk.tokens.shape[1], device=chunk.tokens.device)
        cos, sin = rope_tables(positions, params["inv_freq"], self.head.rope_scale)
        hidden = F.linear(chunk.features, params["fc.weight"])
        args = (chunk.next_tokens, hidden, chunk.start_pos, chunk.slot_ids, state["eagle3_cache"], cos, sin)
        _, _, cache = torch.func.functional_call(self.head, params, args)
        kept = ("eagle3_features", "eagle3_tokens", "eagle3_start")
        return {"eagle3_cache": cache, **{name: state[name] for name in kept}}

    def prefill_finish(self, end: PrefillEnd, state: dict[str, Tensor]) -> None:
        # The first step's catch-up row 0: the first token (at position P) with the prompt's last features.
        assert end.last_features is not None, "prefill needs the target features the drafter declares"
        state["eagle3_tokens"][end.slot_ids, 0] = end.first
        state["eagle3_features"][end.slot_ids, 0] = end.last_features.to(state["eagle3_features"].dtype)
        state["eagle3_start"][end.slot_ids, 0] = end.lengths
