"""Multi-token-prediction (MTP) heads shipped with the target (DeepSeek-V3, Qwen3-Next, Qwen3.5 style).
For a hybrid target (models/hybrid.py) the head's block is one of its gated full-attention layers with
zero-centred norms: the head keeps only its own KV cache, so drafting never touches the target's
recurrent state.

An MTP layer predicts the token after next from (the next token, the target's hidden state here):
    out_t = post_norm(block(eh_proj([enorm(embed(x_{t+1})), hnorm(h_t)])))     logits = lm_head(out_t)
with `block` one decoder layer of the target's family (its own KV cache) and the target's embedding and
lm_head. Positions follow transformers' MtpModel: rotary at the token's position t+1, the KV entry at
the hidden's position t (so the head's cache has no entry before the first pair).

With n MTP layers, a step of K drafts runs d = min(n, K) of them, each with its own KV cache, as
transformers' MtpModel does: layer j pairs the token at position t + j + 1 with layer j-1's output for
hidden position t (layer 0: the target's h_t), rotary at the token's position, KV at t, and its output
at the last committed position L - 2 predicts draft j + 1; the tokens it pairs past L - 1 are the drafts
of the layers before it. Drafts past d chain on the last layer, one row each: draft i feeds d_{i-1}
with the head's own post-norm output for it (for one layer this is vLLM's rule of reusing layer
(i-1) mod n; for several, chaining the last keeps every layer's KV gap-free).

One step: (1) catch-up: every layer runs over a window of K + d rows, the d - 1 committed positions
before the previous verify's first row (kept in the state: they are the rows a rejected draft made
stale in layers >= 1) and that verify's K+1 (token, hidden) rows; rows up to L - 2 are exact, the rest
write dead KV that the chained drafts or the next step rewrite before anything reads it; (2) drafts
d+1..K chain as above. The head's cache has d - 1 positions more than max_seq_len, for windows that
begin before position 0 (then rows from position 0 on) or run past the last chunk of a prompt.

Checkpoint layouts (read from the target's own files): DeepSeek-V3 `model.layers.{L + i}.{enorm, hnorm,
eh_proj, shared_head.norm, <decoder layer>}`; Qwen3.5/Qwen3-Next `mtp.{pre_fc_norm_embedding,
pre_fc_norm_hidden, fc, norm, layers.{i}.<decoder layer>}`. Copies of the embedding or head stored
beside them are not read: the target's are used.

A head directory (SGLang's standalone NextN convention) holds the same head apart from the target:
config.json is a config of the target's family with architectures ["<TargetArch>NextN"] and
num_nextn_predict_layers, and the tensors use the DeepSeek-V3 layout at layer index 0
(`model.layers.0.{enorm, hnorm, eh_proj, shared_head.norm, <decoder layer>}`).

A reduced ("hot") draft vocabulary (setting `token_map`, a token-map file: drafters/token_map.py): the
lm_head rows of the map's N ids are copied once at load into `hot_lm_head` [N, H] (the target's lm_head
is untouched and still scores the verify), each draft scores N ids instead of V, and the logits are
scattered onto the target vocabulary with -inf elsewhere, as EAGLE-3's d2t (FR-Spec, SGLang's
--speculative-token-map). Still lossless: drafts are target ids and q is 0 off the map, so the verify
emits the target's token wherever it lies; acceptance drops where that token is off the map.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
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
from graphspec.drafters.token_map import attach_hot_head, draft_scores
from graphspec.errors import CheckpointError, InputError
from graphspec.models.decoder import DecoderLayer, DecoderLM, Linear, RMSNorm, checkpoint_state, kv_cache_shape
from graphspec.models.hybrid import GatedAttentionLayer, HybridLM
from graphspec.models.loading import (
    LoadedModel,
    checkpoint_tensors,
    load_config,
    mtp_layer_count,
    read_into,
    tensor_problems,
)
from graphspec.models.spec import ModelSpec

# Per layout: own name (inside one MtpLayer) -> stored name; "block." maps onto the decoder layer's names.
LAYOUTS = {
    "deepseek_v3": {
        "enorm.weight": "enorm.weight",
        "hnorm.weight": "hnorm.weight",
        "eh_proj.weight": "eh_proj.weight",
        "post_norm.weight": "shared_head.norm.weight",
        "block.": "",
    },
    "qwen3_next": {
        "enorm.weight": "pre_fc_norm_embedding.weight",
        "hnorm.weight": "pre_fc_norm_hidden.weight",
        "eh_proj.weight": "fc.weight",
        "post_norm.weight": "norm.weight",
        "block.": "layers.{index}.",
    },
}


class MtpLayer(nn.Module):
    def __init__(self, spec: ModelSpec, index: int) -> None:
        super().__init__()
        self.enorm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)
        self.hnorm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)
        self.eh_proj = Linear(2 * spec.hidden_size, spec.hidden_size, bias=False)
        # `index` is its layer in the head's own KV cache. A hybrid target's head is one of its gated
        # full-attention layers (attention only: drafting never advances the target's recurrent state).
        block = GatedAttentionLayer if spec.linear is not None else DecoderLayer
        self.block = block(spec, index)
        self.post_norm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)


class MtpHead(nn.Module):
    """forward(layer, tokens [B, T], hidden [B, T, H], kv_start [B], slot_ids, cache, cos, sin) ->
    (post-norm output [B, T, H], cache): layer `layer` over the pairs (tokens[t], hidden[t]), their KV
    at kv_start + t. embed_tokens and lm_head are the target's modules (shared, not copied)."""

    def __init__(self, target: DecoderLM | HybridLM, count: int) -> None:
        super().__init__()
        self.spec = target.spec
        # Hybrid families' norms are zero-centred, (1 + w), as their target's (graphspec::offset_rms_norm).
        self.offset_norms = target.spec.linear is not None
        with torch.device("meta"):
            self.layers = nn.ModuleList(MtpLayer(target.spec, index) for index in range(count))
        self.embed_tokens = target.model.embed_tokens
        self.lm_head = target.lm_head
        self.register_buffer("inv_freq", target.inv_freq.clone(), persistent=False)

    def forward(
        self,
        layer: int,
        tokens: Tensor,
        hidden: Tensor,
        kv_start: Tensor,
        slot_ids: Tensor,
        cache: Tensor,
        cos: Tensor,
        sin: Tensor,
        in_place: bool = False,
    ) -> tuple[Tensor, Tensor]:
        mtp, eps = self.layers[layer], self.spec.rms_norm_eps
        norm = ops.offset_rms_norm if self.offset_norms else ops.rms_norm
        if self.offset_norms:
            embedded = self.embed_tokens(tokens)
            pair = torch.cat((norm(embedded, mtp.enorm.weight, eps), norm(hidden, mtp.hnorm.weight, eps)), -1)
        else:  # the same pair in one op (one launch where four were)
            pair = ops.embed_norm_concat(
                tokens, self.embed_tokens.weight, mtp.enorm.weight, hidden, mtp.hnorm.weight, eps
            )
        residual = mtp.eh_proj(pair)  # [B, T, H]
        block = mtp.block
        x = norm(residual, block.input_layernorm.weight, eps)
        attn_out, cache = block.self_attn(x, cos, sin, kv_start, slot_ids, cache, in_place)
        add_norm = ops.add_offset_rms_norm if self.offset_norms else ops.add_rms_norm
        x, residual = add_norm(attn_out, residual, block.post_attention_layernorm.weight, eps)
        out, _ = add_norm(block.mlp(x), residual, mtp.post_norm.weight, eps)
        return out, cache


def layer_names(layout: str, index: int, num_layers: int, own: list[str]) -> dict[str, str]:
    """Own parameter name (layers.{index}.*) -> stored checkpoint name, for one MTP layer."""
    rules = LAYOUTS[layout]
    prefix = f"model.layers.{num_layers + index}." if layout == "deepseek_v3" else "mtp."
    names = {}
    for name in own:
        local = name.removeprefix(f"layers.{index}.")
        if local.startswith("block."):
            stored = rules["block."].format(index=index) + local.removeprefix("block.")
        else:
            stored = rules[local]
        names[name] = prefix + stored
    return names


class Mtp(Drafter):
    kind = "mtp"
    target_features = ("final",)

    def __init__(
        self,
        target: LoadedModel,
        dtype: torch.dtype,
        device: str | torch.device,
        head_dir: Path | None = None,
        token_map: str | Path | None = None,
    ) -> None:
        """head_dir: a NextN head directory; None reads the head from the target's own checkpoint.
        token_map: a token-map file (drafters/token_map.py): draft over its ids only; None: the full vocabulary."""
        self.target = target.model
        path, config = (target.path, target.config) if head_dir is None else (Path(head_dir), load_config(head_dir))
        head, names, layout, files = plan_head(path, config, target.model, own_checkpoint=head_dir is None)
        self.layout = layout
        read_into(head, files, names, dtype, device)
        head.inv_freq = head.inv_freq.to(device)
        self.draft_vocab = None  # N with a token map: each draft then reads N x H of the lm_head, not V x H
        if token_map is not None:
            vocab = target.model.spec.vocab_size
            self.draft_vocab = attach_hot_head(head, target.model.lm_head.weight, token_map, vocab)
        head.eval().requires_grad_(False)
        self.head = head
        # From the target's checkpoint the artifact stores no second copy; a head directory is its
        # "draft" checkpoint.
        self.loaded = None if head_dir is None else LoadedModel(head, config, None, path, files)  # type: ignore[arg-type]
        self.settings = {} if token_map is None else {"token_map": str(Path(token_map).absolute())}
        # Tied embeddings appear once among the parameters, under the embedding's name.
        self.head_weight = "embed_tokens.weight" if target.model.spec.tie_word_embeddings else "lm_head.weight"

    def describe(self) -> dict[str, Any]:
        # The token map's path is not described: an artifact carries its own copy (artifact.py).
        described = {"kind": self.kind, "layers": len(self.head.layers), "layout": self.layout}
        if self.draft_vocab is not None:
            described["draft_vocab_size"] = self.draft_vocab
        return described

    def draft_scores(self, params: dict[str, Tensor], out: Tensor) -> tuple[Tensor, Tensor | None]:
        """(logits, their target ids or None) of head outputs (token_map.draft_scores): the full lm_head, or
        with a token map its hot rows; rejection sampling's q is scatter_to_vocab of them."""
        return draft_scores(out, params, self.head_weight)

    def pick(self, params: dict[str, Tensor], out: Tensor, step: StepView, index: int) -> tuple[Tensor, Tensor]:
        """(draft [B], its logits [B, V]) of head outputs [B, H] (StepView.pick_mapped)."""
        return step.pick_mapped(*self.draft_scores(params, out), self.head.spec.vocab_size, index)

    @property
    def model(self) -> nn.Module:
        return self.head

    def depth(self, k: int) -> int:
        """The MTP layers a step of K drafts runs over its catch-up window: one per draft, at most all."""
        return min(len(self.head.layers), k)

    def states(self, slots: int, max_seq_len: int, k: int, dtype: torch.dtype) -> tuple[State, ...]:
        spec, depth = self.head.spec, self.depth(k)
        cache = kv_cache_shape(spec, depth, slots, max_seq_len + depth - 1)
        rows = k + depth  # the last verify's K+1 rows, then the depth-1 committed positions before them
        return (
            State("mtp_cache", cache, dtype, "length"),
            # Hidden states and tokens of those rows (verify row j: hidden at start - 1 + j, token at
            # start + j; prior row i: hidden at start - depth + i, token one later), and start.
            State(
                "mtp_hidden",
                (slots, rows, spec.hidden_size),
                dtype,
                "verified",
                CommitWrite("target_features", "start"),
            ),
            State("mtp_tokens", (slots, rows), torch.int64, "verified", CommitWrite("tokens", "start")),
            State("mtp_start", (slots, 1), torch.int64, "verified", CommitWrite("committed_len", "start")),
        )

    def run(self, params: dict[str, Tensor] | None, *args: Tensor | int) -> tuple[Tensor, Tensor]:
        """MtpHead.forward(*args): traced with the step's params, or (params None) eagerly on the head's own
        weights, writing the cache in place."""
        if params is None:
            return self.head(*args, in_place=True)
        return torch.func.functional_call(self.head, params, args)

    def catch_up(
        self,
        params: dict[str, Tensor] | None,
        seq: Tensor,
        hidden: Tensor,
        kv_start: Tensor,
        slot_ids: Tensor,
        cache: Tensor,
        cos: Tensor,
        sin: Tensor,
        after_layer: Callable[[int, Tensor], Tensor] | None = None,
    ) -> tuple[Tensor, Tensor]:
        """Every layer of the cache over a window of W = hidden.shape[1] rows, row t's hidden at position
        kv_start + t: layer j pairs seq[:, t + j] (the token j + 1 positions on) with layer j-1's output
        for row t (layer 0: `hidden`), rotary cos/sin[:, t + j], KV at kv_start + t. after_layer(j, out)
        returns seq with what layer j drafted written in for the layers after it. Returns the last
        layer's output and the cache."""
        width, out = hidden.shape[1], hidden
        for index in range(cache.shape[0]):
            span = slice(index, index + width)
            out, cache = self.run(
                params, index, seq[:, span], out, kv_start, slot_ids, cache, cos[:, span], sin[:, span]
            )
            if after_layer is not None:
                seq = after_layer(index, out)
        return out, cache

    def propose(self, params: dict[str, Tensor], step: StepView, state: dict[str, Tensor]) -> Proposal:
        k, inputs = step.k, step.inputs
        length, slot_ids = inputs["committed_len"], inputs["slot_ids"]  # L [B]
        cache = state["mtp_cache"]
        depth = cache.shape[0]
        # The states' K (the largest of any bucket's step; the previous step, whatever its K, accepted at
        # most that many) lays out the catch-up window; this step drafts its own K.
        k_state = state["mtp_hidden"].shape[1] - depth
        width = k_state + depth
        rows = torch.arange(length.shape[0], device=length.device)
        hidden = state["mtp_hidden"].index_select(0, slot_ids)  # [B, K_state+d, H]
        tokens = state["mtp_tokens"].index_select(0, slot_ids)
        start = state["mtp_start"].index_select(0, slot_ids)[:, 0]  # [B]: position of the verify's first token
        accepted = (length - 1 - start).clamp(min=0, max=k_state)  # the previous step's accepted count
        first = start - depth  # the window's first hidden position
        if depth > 1:  # window order: prior rows, then verify rows; from position 0 if it starts before
            hidden, tokens = (torch.cat((x[:, k_state + 1 :], x[:, : k_state + 1]), 1) for x in (hidden, tokens))
            skip = (-first).clamp(min=0, max=depth - 1)
            hidden, tokens = window_from(hidden, skip), window_from(tokens, skip)
            first = first + skip
            draft_row = accepted + depth - 1 - skip  # the row at position L - 2, whose outputs predict drafts
        else:
            draft_row = accepted
        # Clamped so even a never-written slot (padding rows read the spare one) writes inside the cache.
        kv_start = first.clamp(min=0, max=cache.shape[4] - width)
        columns = torch.arange(width + depth - 1, device=length.device)
        # seq[c]: the token at position kv_start + 1 + c: committed up to draft_row (past it: dead rows
        # get a valid id, an embedding lookup must stay in range), then each layer's draft once drawn.
        seq = torch.where(columns <= draft_row[:, None], padded(tokens, depth - 1), 0)
        chain = torch.arange(depth - 1, max(k, depth) - 1, device=length.device)  # draft i > d: position L + i - 2
        # Their KV starts (one before), with the other position arithmetic: one launch on a GPU, not one per
        # draft; [K - d, B], each draft's row contiguous (the kernels read a [B] index as contiguous).
        chain_kv = (length + (chain - depth)[:, None]).clamp(min=0)
        positions = torch.cat((kv_start[:, None] + 1 + columns, length[:, None] + chain), dim=1)
        cos, sin = self.target.rope(positions, params["inv_freq"])  # [B, width + d - 1 + K - d, D]
        proposals: list[Tensor] = []
        proposal_logits: list[Tensor] = []
        outputs: list[Tensor] = []

        def draft(index: int, out: Tensor) -> Tensor:
            """Layer `index`'s output at draft_row predicts draft index + 1; the layers after it pair it."""
            nonlocal seq
            outputs.extend(rows_at(draft_row, out))  # [B, H]
            proposal, logits = self.pick(params, outputs[-1], step, index)  # [B], [B, V]
            proposals.append(proposal)
            proposal_logits.append(logits)
            if index < depth - 1:
                seq = torch.where(columns == (draft_row + 1 + index)[:, None], proposals[-1][:, None], seq)
            return seq

        # 1. Catch-up: every layer over the window.
        _, cache = self.catch_up(params, seq, hidden, kv_start, slot_ids, cache, cos, sin, draft)
        # 2. Drafts d+1..K chain on the last layer: d_{i-1} at position L + i - 2, KV one before, with the
        # head's own output.
        chained = outputs[-1]
        for index in range(depth, k):
            kv = chain_kv[index - depth]
            at = slice(width + depth - 1 + index - depth, width + index)
            args = (depth - 1, proposals[-1][:, None], chained[:, None], kv, slot_ids, cache, cos[:, at], sin[:, at])
            out, cache = self.run(params, *args)
            chained = out[:, 0]
            proposal, logits = self.pick(params, chained, step, index)
            proposals.append(proposal)
            proposal_logits.append(logits)
        states = {"mtp_cache": cache, **{name: state[name] for name in ("mtp_hidden", "mtp_tokens", "mtp_start")}}
        if depth > 1:  # the next step's prior rows: positions L - d .. L - 2 (committed whatever verify accepts)
            prior = (draft_row[:, None] - depth + 2 + torch.arange(depth - 1, device=length.device)).clamp(min=0)
            after = torch.full_like(start, k_state + 1)
            states["mtp_hidden"] = ops.slot_update(state["mtp_hidden"], slot_ids, after, hidden[rows[:, None], prior])
            states["mtp_tokens"] = ops.slot_update(state["mtp_tokens"], slot_ids, after, seq[rows[:, None], prior])
        # The catch-up drafts one token per layer: a step of fewer drafts than the states' depth (a small
        # bucket K) still runs every layer, keeping each layer's cache current, and keeps its first K.
        proposals, proposal_logits = proposals[:k], proposal_logits[:k]
        return Proposal(torch.stack(proposals, dim=1), states, logits=torch.stack(proposal_logits, dim=1))

    def prefill(self, prompt: PrefillView, state: dict[str, Tensor]) -> None:
        tokens, hidden, slots, lengths = prompt.tokens, prompt.hidden, prompt.slot_ids, prompt.lengths
        depth = state["mtp_cache"].shape[0]
        # Pairs (x_{t+1}, h_t) for t = 0 .. T-1 (x_T unknown: 0); right padding writes dead KV, and so do
        # layer j's last j rows, whose tokens lie past the prompt (the first step's window rewrites them).
        seq = padded(tokens[:, 1:], depth)
        if tokens.shape[1] > 1:
            pairs = tokens.shape[1] - 1
            positions = 1 + torch.arange(pairs + depth - 1, device=tokens.device).expand(tokens.shape[0], -1)
            cos, sin = self.target.rope(positions, self.head.inv_freq)
            kv_start = torch.zeros_like(lengths)
            cache = state["mtp_cache"][..., :pairs, :]  # a view cut to the pairs, as the target's
            self.catch_up(None, seq, hidden[:, :-1], kv_start, slots, cache, cos, sin)
        if depth > 1:  # positions P - d .. P - 1 where prefill_finish looks for them (as prefill_chunk leaves them)
            last = (lengths[:, None] - depth + torch.arange(depth, device=tokens.device)).clamp(min=0)
            rows = torch.arange(tokens.shape[0], device=tokens.device)[:, None]
            k = state["mtp_hidden"].shape[1] - depth
            state["mtp_hidden"][slots, k:] = hidden[rows, last].to(state["mtp_hidden"].dtype)
            state["mtp_tokens"][slots, k:] = seq[rows, last]
        self.prefill_finish(prompt.end(), state)

    def prefill_chunk(
        self, params: dict[str, Tensor], chunk: PrefillChunk, state: dict[str, Tensor]
    ) -> dict[str, Tensor]:
        # Pairs (x_{p+1}, h_p) for the chunk's positions p, KV at p, rotary at p + 1 (as prefill() above).
        # The pair of the prompt's last position (its x is the first token, unknown yet) and those past
        # it write dead KV: the first step's catch-up rewrites the entry at L - 1 before reading it.
        cache, depth = state["mtp_cache"], state["mtp_cache"].shape[0]
        states = {name: state[name] for name in ("mtp_hidden", "mtp_tokens", "mtp_start")}
        hidden, tokens, kv_start = chunk.hidden, chunk.next_tokens, chunk.start_pos
        if depth > 1:
            # Several layers: the window is the d - 1 positions before the chunk (carried in the prior
            # rows) and the chunk's, so layers >= 1 rewrite the rows whose tokens lay past the last chunk.
            k = state["mtp_hidden"].shape[1] - depth
            prior = state["mtp_hidden"].index_select(0, chunk.slot_ids)[:, k + 1 :]
            hidden = torch.cat((prior, hidden.to(prior.dtype)), 1)
            tokens = torch.cat((state["mtp_tokens"].index_select(0, chunk.slot_ids)[:, k + 1 :], tokens), 1)
            first = kv_start - depth + 1
            skip = (-first).clamp(min=0, max=depth - 1)
            hidden, tokens, kv_start = window_from(hidden, skip), window_from(tokens, skip), first + skip
        seq = padded(tokens, depth - 1)
        positions = kv_start[:, None] + 1 + torch.arange(seq.shape[1], device=seq.device)
        cos, sin = self.target.rope(positions, params["inv_freq"])
        _, states["mtp_cache"] = self.catch_up(params, seq, hidden, kv_start, chunk.slot_ids, cache, cos, sin)
        if depth > 1:
            # Positions e - d .. e - 1 (e: one past the row's last position here) for the next chunk, or
            # for prefill_finish once the prompt has ended: window rows last_index + i (skip fewer when
            # the window started at position 0; rows before position 0 carry filler no window reads).
            last = ((chunk.last_index - skip)[:, None] + torch.arange(depth, device=seq.device)).clamp(min=0)
            rows, at = torch.arange(seq.shape[0], device=seq.device)[:, None], torch.full_like(kv_start, k)
            states["mtp_hidden"] = ops.slot_update(state["mtp_hidden"], chunk.slot_ids, at, hidden[rows, last])
            states["mtp_tokens"] = ops.slot_update(state["mtp_tokens"], chunk.slot_ids, at, tokens[rows, last])
        return states

    def prefill_finish(self, end: PrefillEnd, state: dict[str, Tensor]) -> None:
        depth = state["mtp_cache"].shape[0]
        # Prefill left positions P - d .. P - 1 in rows K .. K+d-1; the first step's prior rows are P - d .. P - 2.
        if depth > 1:
            k = state["mtp_hidden"].shape[1] - depth
            for name in ("mtp_hidden", "mtp_tokens"):
                state[name][end.slot_ids, k + 1 :] = state[name][end.slot_ids, k:-1].clone()
        # The first step's catch-up row 0: the first token (at position L) with the prompt's last hidden.
        state["mtp_tokens"][end.slot_ids, 0] = end.first
        state["mtp_hidden"][end.slot_ids, 0] = end.last_hidden.to(state["mtp_hidden"].dtype)
        state["mtp_start"][end.slot_ids, 0] = end.lengths


def padded(tokens: Tensor, columns: int) -> Tensor:
    """tokens [B, T] with `columns` zero columns after (valid ids for dead rows' embedding lookups)."""
    return tokens if columns == 0 else torch.cat((tokens, tokens.new_zeros(tokens.shape[0], columns)), 1)


def window_from(rows: Tensor, skip: Tensor) -> Tensor:
    """rows [B, W, ...] moved up by skip[b] rows (the last row repeated at the end): a window whose first
    rows lie before position 0 starts at position 0 instead."""
    index = (torch.arange(rows.shape[1], device=rows.device) + skip[:, None]).clamp(max=rows.shape[1] - 1)
    return rows.gather(1, index.view(*index.shape, *(1,) * (rows.dim() - 2)).expand(-1, -1, *rows.shape[2:]))


def plan_head(
    path: Path, config: Any, target: DecoderLM, own_checkpoint: bool = True
) -> tuple[MtpHead, dict[str, str], str, list[Path]]:
    """The head (on meta) for `target`, its parameter -> stored tensor names, the layout, and the weight
    files, with every count, name and shape checked against the file headers; reads no weights, so it
    also serves to refuse a bad checkpoint before the target's weights load (`target` may be on meta).
    own_checkpoint: `path` is the target's checkpoint (False: a NextN head directory, layers from 0)."""
    count = check_mtp(path, config, target.spec)
    first_layer = target.spec.num_layers if own_checkpoint else 0
    if not own_checkpoint:
        check_head_config(path, config, target.spec)
    files, available = checkpoint_tensors(path)
    layout = detect_layout(path, available, first_layer)
    if count > 1 and layout != "deepseek_v3":
        raise InputError(
            f"{path} declares {count} MTP layers in the Qwen3-Next layout (mtp.*), which holds one (a single "
            f"fc and norms); several MTP layers are read from the DeepSeek-V3 layout (model.layers.{{L + i}}.*)"
        )
    head = MtpHead(target, count)
    own = [name for name in checkpoint_state(head) if name.startswith("layers.")]
    names: dict[str, str] = {}
    for index in range(count):
        layer = [name for name in own if name.startswith(f"layers.{index}.")]
        names.update(layer_names(layout, index, first_layer, layer))
    check_shapes(path, head, names, available)
    return head, names, layout, files


def check_mtp(path: Path, config: Any, spec: ModelSpec) -> int:
    """The number of MTP layers `path` declares; refuses a checkpoint that declares none."""
    count = mtp_layer_count(config)
    if count == 0:
        raise InputError(
            f"draft='mtp' needs MTP weights, but {path}'s config declares no MTP layers (num_mtp_layers, "
            f"num_nextn_predict_layers or mtp_num_hidden_layers); use a draft model or 'ngram'"
        )
    return count


def check_head_config(path: Path, config: Any, spec: ModelSpec) -> None:
    """A head directory's config must describe the target's family, width and vocabulary."""
    head = ModelSpec.from_config(config)
    for field in ("model_type", "hidden_size", "vocab_size"):
        own, target = getattr(head, field), getattr(spec, field)
        if own != target:
            raise InputError(
                f"{path}: the MTP head's {field} {own!r} is not the target's {target!r}; the head must be "
                f"trained for this target"
            )


def detect_layout(path: Path, available: dict[str, Any], num_layers: int) -> str:
    if any(name.startswith("mtp.") for name in available):
        return "qwen3_next"
    if any(name.startswith(f"model.layers.{num_layers}.") for name in available):
        return "deepseek_v3"
    raise CheckpointError(
        f"{path}: the config declares MTP layers but the files hold no MTP tensors (neither mtp.* nor "
        f"model.layers.{num_layers}.*); this checkpoint cannot be used with draft='mtp'"
    )


def check_shapes(path: Path, head: MtpHead, names: dict[str, str], available: dict[str, Any]) -> None:
    own = {name: tuple(tensor.shape) for name, tensor in checkpoint_state(head).items()}
    # The head's tensors sit among the target's in the same files: other tensors are not unexpected.
    problems = tensor_problems({stored: own[name] for name, stored in names.items()}, available, ignore_unexpected=None)
    if problems:
        raise CheckpointError(f"{path}: the MTP head's tensors do not fit the target: " + "; ".join(problems))
