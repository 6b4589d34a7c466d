"""n-gram (prompt lookup) drafting: no model. Each slot keeps its token history on the device; a step
matches the longest suffix n-gram (ngram_max down to ngram_min tokens) at its earliest earlier
occurrence in the history and proposes the up to K tokens that followed it: the rule of transformers'
PromptLookupCandidateGenerator and vLLM's n-gram proposer. All in the graph, on static shapes.

A row whose match is followed by fewer than K committed tokens (or that finds none) proposes fewer:
Proposal.length says how many, and the filler after them is never accepted.
"""

from __future__ import annotations

import torch
from torch import Tensor

from graphspec import ops
from graphspec.drafter_kinds import DEFAULT_NGRAM
from graphspec.drafters.base import CommitWrite, Drafter, PrefillChunk, PrefillView, Proposal, State, StepView
from graphspec.errors import InputError

MAX_NGRAM = 16


class NGram(Drafter):
    kind = "ngram"

    def __init__(self, ngram_min: int = DEFAULT_NGRAM[0], ngram_max: int = DEFAULT_NGRAM[1]) -> None:
        for name, value in (("ngram_min", ngram_min), ("ngram_max", ngram_max)):
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_NGRAM:
                raise InputError(f"{name} must be an int between 1 and {MAX_NGRAM}, got {value!r}")
        if ngram_min > ngram_max:
            raise InputError(f"ngram_min ({ngram_min}) must not exceed ngram_max ({ngram_max})")
        self.ngram_min, self.ngram_max = ngram_min, ngram_max
        self.settings = {"ngram_min": ngram_min, "ngram_max": ngram_max}

    def states(self, slots: int, max_seq_len: int, k: int, dtype: torch.dtype) -> tuple[State, ...]:
        # Position p of a slot holds the token committed at p; the accept region writes the step's
        # tokens at committed_len onwards, so the history always holds every committed token.
        history = State("token_history", (slots, max_seq_len), torch.int64, "length", commit=CommitWrite("tokens"))
        return (history,)

    def propose(self, params: dict[str, Tensor], step: StepView, state: dict[str, Tensor]) -> Proposal:
        inputs, k = step.inputs, step.k
        length, slot_ids = inputs["committed_len"], inputs["slot_ids"]  # L [B]
        # The last two committed tokens are in the history already unless this is the first step after
        # prefill (the target's first token); rewriting them is harmless either way.
        history = ops.slot_update(state["token_history"], slot_ids, length - 2, inputs["last_tokens"])
        rows = history.index_select(0, slot_ids)  # [B, S]; positions >= L are dead
        starts = torch.arange(rows.shape[1], device=rows.device)  # [S]
        follow = torch.zeros_like(length)  # position of the first proposed token per row
        found = torch.zeros_like(length, dtype=torch.bool)
        for n in range(self.ngram_max, self.ngram_min - 1, -1):
            # The suffix n-gram (positions L-n .. L-1; clamped where L < n, and then never valid below).
            suffix = rows.gather(1, (length[:, None] - n + torch.arange(n, device=rows.device)).clamp(min=0))
            windows = rows.unfold(1, n, 1)  # [B, S-n+1, n]: window i covers positions i .. i+n-1
            # A window counts if it matches and something committed follows it (i + n < L), which also
            # leaves out the suffix itself.
            match = (windows == suffix[:, None, :]).all(dim=-1) & (
                starts[None, : windows.shape[1]] < (length - n)[:, None]
            )
            first = match.to(torch.int8).argmax(dim=1)  # the earliest match (0 when none)
            take = match.any(dim=1) & ~found  # the longest n that matches wins
            follow = torch.where(take, first + n, follow)
            found = found | match.any(dim=1)
        offsets = torch.arange(k, device=rows.device)  # [K]
        proposed = torch.where(found, (length - follow).clamp(max=k), 0)  # [B]: committed tokens after the match
        positions = (follow[:, None] + offsets).clamp(max=rows.shape[1] - 1)
        tokens = torch.where(offsets < proposed[:, None], rows.gather(1, positions), 0)  # [B, K]; filler 0
        return Proposal(tokens, {"token_history": history}, length=proposed)

    def prefill(self, prompt: PrefillView, state: dict[str, Tensor]) -> None:
        tokens = prompt.tokens  # right padding lands past L: dead
        state["token_history"][prompt.slot_ids, : tokens.shape[1]] = tokens

    def prefill_chunk(
        self, params: dict[str, Tensor], chunk: PrefillChunk, state: dict[str, Tensor]
    ) -> dict[str, Tensor]:
        history = ops.slot_update(state["token_history"], chunk.slot_ids, chunk.start_pos, chunk.tokens)
        return {"token_history": history}
