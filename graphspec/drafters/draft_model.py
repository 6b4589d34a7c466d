"""A separate draft model: its own KV cache, K single-token forwards per step (chain drafting)."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from graphspec.drafters.base import Drafter, PrefillChunk, PrefillView, Proposal, State, StepView
from graphspec.models.decoder import kv_cache_shape


class DraftModel(Drafter):
    kind = "draft_model"

    def __init__(self, loaded: Any) -> None:
        self.loaded = loaded  # models.LoadedModel of the draft checkpoint (the artifact records its files)
        self.settings = {}

    def states(self, slots: int, max_seq_len: int, k: int, dtype: torch.dtype) -> tuple[State, ...]:
        spec = self.model.spec
        shape = kv_cache_shape(spec, spec.num_layers, slots, max_seq_len)
        return (State("draft_cache", shape, dtype, rollback="length"),)

    def propose(self, params: dict[str, Tensor], step: StepView, state: dict[str, Tensor]) -> Proposal:
        draft, k, inputs = self.model, step.k, step.inputs
        committed_len, last_tokens, slot_ids = inputs["committed_len"], inputs["last_tokens"], inputs["slot_ids"]
        cache = state["draft_cache"]

        def forward(tokens: Tensor, start: Tensor, cache: Tensor, first: int) -> tuple[Tensor, Tensor]:
            rows = slice(first, first + tokens.shape[1])  # position L-2+first onwards
            rope = (cos[:, rows], sin[:, rows])
            return torch.func.functional_call(
                draft, params, (tokens, start, slot_ids, cache, "last_logits"), {"rope": rope}
            )

        # 0. The rotary tables for every position the draft sees this step (L-2 .. L-2+K), computed
        #    once; each forward takes its rows (the values it would compute for itself).
        positions = (committed_len - 2)[:, None] + torch.arange(k + 1, device=committed_len.device)
        cos, sin = draft.rope(positions, params["inv_freq"])  # [B, K+1, D]
        # 1. Catch-up + first proposal: the last two committed tokens at positions L-2, L-1 cover the
        #    case where the previous step accepted every draft (the draft never saw d_K); otherwise the
        #    first of the two rewrites an identical KV entry.
        logits, cache = forward(last_tokens, committed_len - 2, cache, 0)  # [B, V]
        proposals, proposal_logits = [step.pick(logits, 0)], [logits]
        # 2. Proposals 2..K, unrolled: d_i sits at position L - 1 + i.
        for index in range(1, k):
            logits, cache = forward(proposals[-1][:, None], committed_len - 1 + index, cache, index + 1)
            proposals.append(step.pick(logits, index))
            proposal_logits.append(logits)
        tokens = torch.stack(proposals, dim=1)  # [B, K]
        return Proposal(tokens, {"draft_cache": cache}, logits=torch.stack(proposal_logits, dim=1))  # [B, K, V]

    def prefill(self, prompt: PrefillView, state: dict[str, Tensor]) -> None:
        start = torch.zeros_like(prompt.slot_ids)
        # The cache cut to the prompt (a view): reference attention scores T positions, not max_seq_len.
        cache = state["draft_cache"][..., : prompt.tokens.shape[1], :]
        self.model(prompt.tokens, start, prompt.slot_ids, cache, in_place=True)

    def prefill_chunk(
        self, params: dict[str, Tensor], chunk: PrefillChunk, state: dict[str, Tensor]
    ) -> dict[str, Tensor]:
        # The draft model reads the same chunk as the target, into its own cache; its outputs are unused.
        _, cache = torch.func.functional_call(
            self.model, params, (chunk.tokens, chunk.start_pos, chunk.slot_ids, state["draft_cache"])
        )
        return {"draft_cache": cache}
