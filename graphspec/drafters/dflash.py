"""DFlash block drafters (z-lab DFlash; transformers' MuseGlimmerAssistantModel and its
DFlashTokenCandidateGenerator are the oracle; SGLang, vLLM and TokenSpeed serve it).

A DFlash drafter proposes its K drafts in ONE forward of its few decoder layers over the block [last committed
token, MASK x K], embedded with the target's embedding, at positions L-1 .. L-1+K. K is at most block_size - 1
(the block it was trained with) and may be less, as vLLM's num_speculative_tokens: a shorter block (fewer mask
slots to attend to) changes the drafts, never the output, and at large batches a smaller K keeps the verify's
rows down. Its attention is non-causal inside the block (graphspec::block_attention): every block query sees
the whole block and the context before it. The context is the target's own hidden states: the outputs of the
target layers `target_layer_ids` (transformers' hidden_states[i + 1]), concatenated, projected by `fc` and
normed by `hidden_norm` (one [H] row per committed position), whose K/V every drafter layer keeps in its cache
(k_norm(k_proj(ctx)) roped at the row's position, v_proj(ctx); the context rows do not run through the
layers). Mask slot j predicts the token at its own position through the target's lm_head after the drafter's
final norm. The K drafts are independent given the context, so sampling each from its own logits gives
rejection sampling a valid q (Proposal.logits). With a token map (setting `token_map`, drafters/token_map.py)
the block scores only the map's lm_head rows, scattered onto the vocabulary with -inf elsewhere: the lm_head
read per step drops from V x H to N x H, at the cost of never drafting an id off the map.

One step: the previous verify's K+1 feature rows (committed by the accept region, rows past the
accepted count dead) are written as context K/V at their positions start-1 .. start-1+K, then the block
writes its own K/V at L-1 .. L-1+K, over every dead context row (they all lie at L-1 or later), and
attends. The drafter's cache thus rolls back by length: context entries at or past L-1 are dead and
rewritten before they are read.

Checkpoint layouts (a drafter directory; neither stores an embedding or an lm_head: the target's are used):
- z-lab: config.json a Qwen3 (or Llama) config with architectures [...DFlash...], top-level block_size
  and dflash_config {target_layer_ids, mask_token_id}; tensors fc.weight [H, n * target H],
  hidden_norm.weight, layers.<i>.{self_attn.{q,k,v,o}_proj, self_attn.{q,k}_norm, mlp.{gate,up,down}_proj,
  input_layernorm, post_attention_layernorm}.weight, norm.weight.
- transformers: model_type "muse_glimmer_assistant" (MuseGlimmerAssistantConfig: block_size,
  mask_token_id, target_layer_ids at the top level), the same tensors with fc and hidden_norm named
  encoder.fc and encoder.output_norm_enc.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
import transformers
from torch import Tensor, nn
from transformers import AutoConfig, PretrainedConfig

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
)
from graphspec.drafters.token_map import attach_hot_head, draft_scores
from graphspec.errors import CheckpointError, InputError
from graphspec.models.decoder import (
    DecoderLayer,
    DecoderLM,
    Linear,
    RMSNorm,
    checkpoint_state,
    kv_cache_shape,
    rope_tables,
)
from graphspec.models.loading import LoadedModel, checkpoint_tensors, load_config, read_into, tensor_problems
from graphspec.models.spec import ModelSpec, rope_frequencies

MUSE_MODEL_TYPE = "muse_glimmer_assistant"
ARCHITECTURES = ("DFlash", "MuseGlimmerAssistant")  # a drafter directory's architectures name contains one
# Own name -> transformers' (MuseGlimmerAssistantModel) stored name; the z-lab layout stores own names.
MUSE_NAMES = {"fc.weight": "encoder.fc.weight", "hidden_norm.weight": "encoder.output_norm_enc.weight"}
IGNORED_SUFFIXES = ("rotary_emb.inv_freq", "rotary_emb.original_inv_freq")  # tables, not weights


def is_dflash(raw: dict[str, Any]) -> bool:
    """A config.json (as a dict) of a DFlash drafter: its model_type or an architectures name says so."""
    architectures = raw.get("architectures") or []
    return raw.get("model_type") == MUSE_MODEL_TYPE or any(
        any(name in str(arch) for name in ARCHITECTURES) for arch in architectures
    )


def read_config(path: str | Path) -> PretrainedConfig:
    """The drafter directory's config as transformers reads it: a MuseGlimmerAssistantConfig for the
    transformers layout (needs a transformers that has it), else the family config (load_config)."""
    path = Path(path)
    raw = _raw_config(path)
    if raw.get("model_type") != MUSE_MODEL_TYPE:
        return load_config(path)
    try:
        return AutoConfig.from_pretrained(str(path))
    except (ValueError, KeyError, OSError) as error:
        raise CheckpointError(
            f"{path}/config.json: model_type {MUSE_MODEL_TYPE!r} needs a transformers with "
            f"MuseGlimmerAssistantConfig (this is {transformers.__version__}; 5.23 has it): {error}"
        ) from None


def _raw_config(path: Path) -> dict[str, Any]:
    file = path / "config.json"
    if not file.is_file():
        raise CheckpointError(f"{file}: missing config.json; is {path} a DFlash drafter directory?")
    try:
        raw = json.loads(file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise CheckpointError(f"{file}: not valid JSON ({error})") from None
    if not isinstance(raw, dict):
        raise CheckpointError(f"{file}: not a JSON object")
    return raw


@dataclass(frozen=True)
class DFlashConfig:
    """What a DFlash drafter directory's config says, checked against the target."""

    spec: ModelSpec  # the drafter's layers (vocab_size: the target's, whose embedding and lm_head it uses)
    block_size: int
    mask_token_id: int
    target_layer_ids: tuple[int, ...]
    muse_names: bool  # transformers' layout (encoder.fc, encoder.output_norm_enc)


def _int_field(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InputError(f"{where} must be an integer, got {value!r}")
    return value


def plan_config(
    path: Path,
    raw: dict[str, Any],
    config: PretrainedConfig,
    target: ModelSpec,
    k: int | None = None,
    max_seq_len: int | None = None,
) -> DFlashConfig:
    """The drafter's config fields checked against the target, K and the cache length (issue 17's
    start-up checks): target_layer_ids in range and distinct, block_size >= 2 and >= K + 1, the mask token a
    target id, the drafter's hidden size the target's (it shares the embedding and lm_head), no sliding
    window shorter than the cache. k / max_seq_len None: not checked (check_drafter did)."""
    muse = raw.get("model_type") == MUSE_MODEL_TYPE
    if muse:  # transformers' config: the fields at the top level, with the class's defaults
        fields = {name: getattr(config, name, None) for name in ("target_layer_ids", "mask_token_id")}
        where = f"{path}: "
    else:
        fields, where = raw.get("dflash_config") or {}, f"{path}: dflash_config."
    ids = fields.get("target_layer_ids")
    if not isinstance(ids, list) or not ids or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        raise InputError(f"{where}target_layer_ids must be a non-empty list of target layer indices, got {ids!r}")
    layers = target.num_layers
    bad = [i for i in ids if not 0 <= i < layers]
    if bad:
        raise InputError(
            f"{where}target_layer_ids {ids} name layers {bad} outside the target's {layers} layers (0..{layers - 1})"
        )
    if len(set(ids)) != len(ids):
        raise InputError(f"{where}target_layer_ids {ids} name a layer twice")
    mask = fields.get("mask_token_id")
    if mask is None:
        raise InputError(f"{where}mask_token_id is missing: the block's mask slots need one")
    mask = _int_field(mask, f"{where}mask_token_id")
    if not 0 <= mask < target.vocab_size:
        raise InputError(f"{where}mask_token_id {mask} is outside the target's vocabulary (0..{target.vocab_size - 1})")
    block = getattr(config, "block_size", raw.get("block_size"))
    if block is None:
        raise InputError(f"{path}: config.json has no block_size")
    block = _int_field(block, f"{path}: block_size")
    if block < 2:
        raise InputError(f"{path}: block_size {block}: a DFlash block needs the last token and at least one mask slot")
    if k is not None:
        check_k(k, block, f"{path}: ")
    spec = _layer_spec(config, muse, target)
    if spec.hidden_size != target.hidden_size:
        raise InputError(
            f"{path}: the drafter's hidden_size {spec.hidden_size} is not the target's {target.hidden_size}; "
            f"DFlash drafters embed and predict with the target's embedding and lm_head"
        )
    window = spec.sliding_window
    layer_types = getattr(config, "layer_types", None) or []
    if max_seq_len is not None and window is not None and "sliding_attention" in layer_types and max_seq_len > window:
        raise InputError(
            f"{path}: max_seq_len={max_seq_len} exceeds the drafter's sliding_window={window} (layer_types "
            f"{sorted(set(layer_types))}); graphspec's block attention has no window: lower max_seq_len"
        )
    return DFlashConfig(spec, block, mask, tuple(ids), muse)


def check_k(k: int, block_size: int, where: str = "") -> None:
    """K drafts need K mask slots: 1 <= K <= block_size - 1 (the block [last token, MASK x K])."""
    if not 1 <= k <= block_size - 1:
        raise InputError(
            f"{where}block_size {block_size} drafts at most {block_size - 1} tokens per step (the block is the "
            f"last token and up to {block_size - 1} mask slots), but k={k}; compile with k <= {block_size - 1}"
        )


def _layer_spec(config: PretrainedConfig, muse: bool, target: ModelSpec) -> ModelSpec:
    """The drafter layers' ModelSpec with the target's vocabulary: Qwen3-style layers (per-head q/k norms,
    no biases) for the transformers layout, the config's own family otherwise."""
    if not muse:
        return replace(ModelSpec.from_config(config), vocab_size=target.vocab_size)
    heads = config.num_attention_heads
    return ModelSpec(
        model_type="qwen3",
        vocab_size=target.vocab_size,
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_layers=config.num_hidden_layers,
        num_heads=heads,
        num_kv_heads=config.num_key_value_heads or heads,
        head_dim=getattr(config, "head_dim", None) or config.hidden_size // heads,
        rms_norm_eps=float(config.rms_norm_eps),
        qkv_bias=False,
        o_bias=False,
        mlp_bias=False,
        qk_norm=True,
        tie_word_embeddings=False,
        max_position_embeddings=config.max_position_embeddings,
        sliding_window=config.sliding_window,
    )


class DFlashHead(nn.Module):
    """The drafter's layers with the target's embedding and lm_head (shared modules).

    forward("context", features [B, T, F], start [B], slot_ids, cache, cos, sin) -> cache: every
    layer's K/V of hidden_norm(fc(features)) at positions start .. start+T-1 (cos/sin [B, T, D] of them).
    forward("step", (features [B, Tc, F], tokens [B, T]), (context start [B], block start [B]), slot_ids,
    cache, cos, sin) -> (normed hidden [B, T, H], cache): the context's K/V as above, then the non-causal
    block forward at positions block start .. +T-1, its K/V written first; cos/sin [B, Tc + T, D] of the
    context positions then the block's. Each layer projects the context rows and the block rows in one
    GEMM (its q/k/v weight read once per step, not twice; the context rows' q columns are dropped)."""

    def __init__(self, spec: ModelSpec, features: int, target: DecoderLM, inv_freq: Tensor, rope_scale: float) -> None:
        super().__init__()
        self.spec, self.rope_scale = spec, rope_scale
        hidden = spec.hidden_size
        self.embed_tokens = target.model.embed_tokens  # registered first: a tied lm_head is named after it
        with torch.device("meta"):
            self.fc = Linear(features, hidden, bias=False)
            self.hidden_norm = RMSNorm(hidden, spec.rms_norm_eps)
            self.layers = nn.ModuleList(DecoderLayer(spec, index) for index in range(spec.num_layers))
            self.norm = RMSNorm(hidden, spec.rms_norm_eps)
        for layer in self.layers:
            layer.self_attn.causal = False
        self.lm_head = target.lm_head
        self.register_buffer("inv_freq", inv_freq.to(torch.float32), persistent=False)

    def forward(
        self,
        mode: str,
        inputs: Any,
        start: Any,
        slot_ids: Tensor,
        cache: Tensor,
        cos: Tensor,
        sin: Tensor,
        in_place: bool = False,
    ) -> Any:
        # One forward with a mode, so torch.func.functional_call binds the step's parameters to both.
        if mode == "context":
            return self.write_context(inputs, start, slot_ids, cache, cos, sin, in_place)
        if mode == "step":
            return self.step(*inputs, *start, slot_ids, cache, cos, sin, in_place)
        raise ValueError(f"DFlashHead mode must be 'context' or 'step', got {mode!r}")

    def context(self, features: Tensor) -> Tensor:
        """The context rows [B, T, H]: hidden_norm(fc(features))."""
        return ops.rms_norm(self.fc(features), self.hidden_norm.weight, self.spec.rms_norm_eps)

    def write_context(
        self, features: Tensor, start: Tensor, slot_ids: Tensor, cache: Tensor, cos: Tensor, sin: Tensor, in_place: bool
    ) -> Tensor:
        context = self.context(features)
        for layer in self.layers:
            attn = layer.self_attn
            q_rows = attn.num_heads * attn.head_dim
            # Only k and v of the context rows: the fused q/k/v weight's rows past q (a view, no copy).
            bias = None if attn.qkv_proj.bias is None else attn.qkv_proj.bias[q_rows:]
            kv = F.linear(context, attn.qkv_proj.weight[q_rows:], bias)
            cache = self.write_kv(attn, kv, start, slot_ids, cache, cos, sin, in_place)
        return cache

    @staticmethod
    def write_kv(
        attn: nn.Module,
        kv: Tensor,
        start: Tensor,
        slot_ids: Tensor,
        cache: Tensor,
        cos: Tensor,
        sin: Tensor,
        in_place: bool,
    ) -> Tensor:
        """The context rows' projected k and v (kv [B, T, 2 x kv width]) normed, roped and written."""
        batch, t, _ = kv.shape
        k, v = kv.chunk(2, dim=-1)
        k = k.view(batch, t, attn.num_kv_heads, attn.head_dim)
        v = v.view(batch, t, attn.num_kv_heads, attn.head_dim).transpose(1, 2)
        if attn.qk_norm:
            k = ops.rms_norm(k, attn.k_norm.weight, attn.k_norm.eps)
        k = k.transpose(1, 2)  # [B, Hkv, T, D]
        _, k = ops.rotary(k, k, cos, sin)  # the op rotates a (q, k) pair; k stands in for q
        if in_place:
            ops.kv_write(cache, attn.layer, slot_ids, start, k, v)
            return cache
        return ops.kv_update(cache, attn.layer, slot_ids, start, k, v)

    def step(
        self,
        features: Tensor,
        tokens: Tensor,
        context_start: Tensor,
        block_start: Tensor,
        slot_ids: Tensor,
        cache: Tensor,
        cos: Tensor,
        sin: Tensor,
        in_place: bool,
    ) -> tuple[Tensor, Tensor]:
        context = self.context(features)
        rows = context.shape[1]
        residual = self.embed_tokens(tokens)  # [B, T, H]
        layers = self.layers
        hidden = ops.rms_norm(residual, layers[0].input_layernorm.weight, self.spec.rms_norm_eps)
        for index, layer in enumerate(layers):
            attn = layer.self_attn
            qkv = attn.qkv_proj(torch.cat((context, hidden), dim=1))  # [B, Tc + T, q + k + v]
            # The context's K/V first: its dead rows lie at L-1 or later, where the block writes over them.
            kv = qkv[:, :rows, attn.num_heads * attn.head_dim :]
            cache = self.write_kv(attn, kv, context_start, slot_ids, cache, cos[:, :rows], sin[:, :rows], in_place)
            attn_out, cache = attn.attend(
                qkv[:, rows:], cos[:, rows:], sin[:, rows:], block_start, slot_ids, cache, in_place
            )
            norm = layer.post_attention_layernorm
            hidden, residual = ops.add_rms_norm(attn_out, residual, norm.weight, norm.eps)
            norm = layers[index + 1].input_layernorm if index + 1 < len(layers) else self.norm
            hidden, residual = ops.add_rms_norm(layer.mlp(hidden), residual, norm.weight, norm.eps)
        return hidden, cache


@dataclass
class DFlashPlan:
    """Everything check_drafter learns about a drafter directory from its config and file headers."""

    head: DFlashHead  # on meta (its shared embedding and lm_head are the given target's)
    names: dict[str, str]  # own checkpoint-layout name -> stored name
    files: list[Path]
    config: PretrainedConfig
    dflash: DFlashConfig


def capture_points(target_layer_ids: tuple[int, ...], num_layers: int) -> tuple[str, ...]:
    """The decoder capture points of the outputs of target layers i (transformers' hidden_states[i + 1]):
    the input of layer i + 1, or for the last layer the final normed state (which is what transformers
    returns as hidden_states[L])."""
    return tuple("final" if i == num_layers - 1 else f"layer_in:{i + 1}" for i in target_layer_ids)


def plan_head(path: Path, target: DecoderLM, k: int | None = None, max_seq_len: int | None = None) -> DFlashPlan:
    """The drafter (on meta) for `target` with its stored names, every config field, name and shape checked
    against the target and the file headers. `target` may be on meta (check_drafter calls this before
    the target's weights load)."""
    path = Path(path)
    raw = _raw_config(path)
    config = read_config(path)
    plan = plan_config(path, raw, config, target.spec, k, max_seq_len)
    inv_freq, rope_scale = rope_frequencies(config)
    features = len(plan.target_layer_ids) * target.spec.hidden_size
    head = DFlashHead(plan.spec, features, target, inv_freq, rope_scale)
    own = {name: tuple(t.shape) for name, t in checkpoint_state(head).items()}
    for shared in ("embed_tokens.weight", "lm_head.weight"):
        own.pop(shared, None)
    names = {name: MUSE_NAMES.get(name, name) if plan.muse_names else name for name in own}
    files, available = checkpoint_tensors(path)
    check_tensors(path, own, names, available, len(plan.target_layer_ids), target.spec.hidden_size)
    return DFlashPlan(head, names, files, config, plan)


def check_tensors(
    path: Path,
    own: dict[str, tuple[int, ...]],
    names: dict[str, str],
    available: dict[str, Any],
    layer_count: int,
    target_hidden: int,
) -> None:
    """Every tensor the drafter needs is stored with its shape, nothing unknown is stored; the fc width
    gets its own message (the features are len(target_layer_ids) target hidden states wide)."""
    fc = names["fc.weight"]
    if fc in available and tuple(available[fc][1]) != own["fc.weight"]:
        width = list(available[fc][1])
        raise InputError(
            f"{path}: {fc} is {width}: it reads features {width[-1] if width else '?'} wide, but "
            f"len(target_layer_ids) x the target's hidden_size is {layer_count} x {target_hidden} = "
            f"{layer_count * target_hidden} (expected {list(own['fc.weight'])})"
        )
    stored = {names[name]: shape for name, shape in own.items()}
    problems = tensor_problems(stored, available, ignore_unexpected=lambda name: name.endswith(IGNORED_SUFFIXES))
    if problems:
        raise CheckpointError(
            f"{path}: the DFlash drafter does not fit its config and the target: " + "; ".join(problems)
        )


class DFlash(Drafter):
    kind = "dflash"

    def __init__(
        self,
        path: str | Path,
        target: LoadedModel,
        dtype: torch.dtype,
        device: str | torch.device,
        token_map: str | Path | None = None,
    ) -> None:
        """token_map: a token-map file (drafters/token_map.py): the block's drafts score only its ids
        (the lm_head read per step drops from V x H to N x H); None: the full vocabulary."""
        plan = plan_head(Path(path), target.model)  # K and the cache length: checked by check_drafter
        head = plan.head
        read_into(head, plan.files, plan.names, dtype, device)
        head.inv_freq = head.inv_freq.to(device)
        self.draft_vocab = None
        if token_map is not None:
            vocab = target.model.spec.vocab_size
            self.draft_vocab = attach_hot_head(head, target.model.lm_head.weight, token_map, vocab)
        head.eval().requires_grad_(False)
        self.head, self.config = head, plan.dflash
        self.target_features = capture_points(plan.dflash.target_layer_ids, target.model.spec.num_layers)
        # The artifact stores the drafter directory's files as the "draft" checkpoint.
        self.loaded = LoadedModel(head, plan.config, None, Path(path), plan.files)  # type: ignore[arg-type]
        self.settings = {} if token_map is None else {"token_map": str(Path(token_map).absolute())}

    def describe(self) -> dict[str, Any]:
        described = {
            "kind": self.kind,
            "block_size": self.config.block_size,
            "target_layer_ids": list(self.config.target_layer_ids),
            "mask_token_id": self.config.mask_token_id,
        }
        if self.draft_vocab is not None:  # the map's path is not described: an artifact carries a copy
            described["draft_vocab_size"] = self.draft_vocab
        return described

    def states(self, slots: int, max_seq_len: int, k: int, dtype: torch.dtype) -> tuple[State, ...]:
        check_k(k, self.config.block_size)
        features = self.head.fc.in_features
        spec = self.head.spec
        return (
            State("dflash_cache", kv_cache_shape(spec, spec.num_layers, slots, max_seq_len), dtype, "length"),
            # The last verify's K+1 rows of target features (row j at position start - 1 + j), and start.
            State(
                "dflash_features", (slots, k + 1, features), dtype, "verified", CommitWrite("target_features", "start")
            ),
            State("dflash_start", (slots, 1), torch.int64, "verified", CommitWrite("committed_len", "start")),
        )

    def propose(self, params: dict[str, Tensor], step: StepView, state: dict[str, Tensor]) -> Proposal:
        k, inputs = step.k, step.inputs
        check_k(k, self.config.block_size)
        length, slot_ids = inputs["committed_len"], inputs["slot_ids"]  # L [B]
        cache = state["dflash_cache"]
        # The context: the state's W = K_max + 1 rows (the largest K of any bucket's step: the previous
        # step, whatever its K, left at most W live rows); the block: this step's K + 1.
        width = state["dflash_features"].shape[1]
        features = state["dflash_features"].index_select(0, slot_ids)  # [B, W, F]
        start = state["dflash_start"].index_select(0, slot_ids)[:, 0]  # [B]: the previous step's L
        # Row j of the previous verify sits at position start - 1 + j; clamped so a never-written slot
        # (padding rows read the spare one) writes inside the cache. Real rows need no clamp. Dead rows
        # land at L-1 or later: under the block, or past it where nothing reads them before the next
        # step's context rewrites them.
        context_start = (start - 1).clamp(min=0, max=cache.shape[4] - width)
        block_start = length - 1
        context_positions = context_start[:, None] + torch.arange(width, device=length.device)
        block_positions = block_start[:, None] + torch.arange(k + 1, device=length.device)
        positions = torch.cat((context_positions, block_positions), dim=1)
        cos, sin = rope_tables(positions, params["inv_freq"], self.head.rope_scale)  # [B, W + K + 1, D]

        # Context K/V of the previous verify's rows (the dead ones land at L-1 or later, under the block),
        # then the block [x_{L-1}, MASK x K], non-causal; mask slot j predicts the token at its own position.
        mask = torch.full((length.shape[0], k), self.config.mask_token_id, dtype=torch.int64, device=length.device)
        tokens = torch.cat((inputs["last_tokens"][:, 1:], mask), dim=1)  # [B, K+1]
        args = ("step", (features, tokens), (context_start, block_start), slot_ids, cache, cos, sin)
        out, cache = torch.func.functional_call(self.head, params, args)
        # Contiguous [B, K, H] (a small copy): the strided slice would trace to a bmm against the lm_head
        # expanded B times (each row reading all of it), and numerics="invariant" has no bmm kernel.
        masks = out[:, 1:].contiguous()
        head_weight = "lm_head.weight" if "lm_head.weight" in params else "embed_tokens.weight"  # tied: that name
        scores = draft_scores(masks, params, head_weight)  # [B, K, V or the map's N]
        drafts, logits = step.pick_mapped(*scores, self.head.spec.vocab_size)  # [B, K], [B, K, V]
        kept = {name: state[name] for name in ("dflash_features", "dflash_start")}
        return Proposal(drafts, {"dflash_cache": cache, **kept}, logits)

    def prefill(self, prompt: PrefillView, state: dict[str, Tensor]) -> None:
        features, slots, lengths = prompt.features, prompt.slot_ids, prompt.lengths
        assert features is not None, "prefill needs the target features the drafter declares"
        # Context K/V of every prompt position; right padding writes dead entries past each prompt.
        positions = torch.arange(features.shape[1], device=features.device).expand(features.shape[0], -1)
        cos, sin = rope_tables(positions, self.head.inv_freq, self.head.rope_scale)
        start = torch.zeros_like(lengths)
        self.head("context", features, start, slots, state["dflash_cache"], cos, sin, in_place=True)
        self.prefill_finish(prompt.end(), state)

    def prefill_chunk(
        self, params: dict[str, Tensor], chunk: PrefillChunk, state: dict[str, Tensor]
    ) -> dict[str, Tensor]:
        # Context K/V of the chunk's positions (as prefill() above); positions past a prompt are dead.
        assert chunk.features is not None, "prefill needs the target features the drafter declares"
        positions = chunk.start_pos[:, None] + torch.arange(chunk.tokens.shape[1], device=chunk.tokens.device)
        cos, sin = rope_tables(positions, params["inv_freq"], self.head.rope_scale)
        args = ("context", chunk.features, chunk.start_pos, chunk.slot_ids, state["dflash_cache"], cos, sin)
        cache = torch.func.functional_call(self.head, params, args)
        return {"dflash_cache": cache, **{name: state[name] for name in ("dflash_features", "dflash_start")}}

    def prefill_finish(self, end: PrefillEnd, state: dict[str, Tensor]) -> None:
        # The first step's context row 0: the prompt's last position (P - 1), rewritten as written; its
        # rows 1..K are dead (at P or later, under the first block), so start = P says accepted 0.
        assert end.last_features is not None, "prefill needs the target features the drafter declares"
        state["dflash_features"][end.slot_ids, 0] = end.last_features.to(state["dflash_features"].dtype)
        state["dflash_start"][end.slot_ids, 0] = end.lengths
