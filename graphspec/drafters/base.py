"""What a drafter declares: the state it keeps between steps, how it proposes K tokens, and how it fills
its state from a prompt. trace, the passes, checks, the runtime and the artifact read these
declarations; none of them knows a drafter by name (see DESIGN.md, "The speculation step").
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor

from graphspec import ops
from graphspec.drafters.token_map import scatter_to_vocab

# Declared in graphspec.state (the target declares state too); drafters import them from here.
from graphspec.state import COMMIT_AT, COMMIT_VALUES, ROLLBACKS, CommitWrite, State  # noqa: F401


@dataclass
class Proposal:
    """What a drafter's propose() returns inside the traced step."""

    tokens: Tensor  # [B, K] int64: the drafts, always valid token ids
    state: dict[str, Tensor]  # every declared state, as updated by the proposal (functional values)
    # [B, K, V] draft logits: rejection sampling's draft distribution q (processed with the row's
    # temperature/top-k/top-p). None: the drafts are deterministic, q is one-hot at each draft.
    logits: Tensor | None = None
    # [B] int64: how many of the K drafts are real per row (the rest are filler that is never
    # accepted). None: all K are real.
    length: Tensor | None = None


# pick(logits [B, V], draft index) -> [B] token ids: greedy argmax or a sample with the row's
# parameters and the draft lane of that index (trace.speculate builds it for the sampling mode).
Pick = Callable[[Tensor, int], Tensor]


@dataclass
class PrefillView:
    """What prefill() may read: right-padded prompts and what the target's prefill computed for them."""

    tokens: Tensor  # [rows, T] int64, right-padded
    slot_ids: Tensor  # [rows]
    lengths: Tensor  # [rows] real prompt lengths
    hidden: Tensor  # [rows, T, H] the target's final (normed) hidden states
    first: Tensor  # [rows] the target's first token (at position lengths)
    features: Tensor | None = None  # [rows, T, F] the drafter's target_features, when it declares any

    def end(self) -> PrefillEnd:
        """What prefill_finish() reads, taken at each prompt's last position (so a drafter's reference
        prefill can end the way the compiled one does)."""
        last = torch.arange(self.tokens.shape[0], device=self.tokens.device), self.lengths - 1
        features = None if self.features is None else self.features[last]
        return PrefillEnd(self.slot_ids, self.lengths, self.first, self.hidden[last], features)


@dataclass
class PrefillChunk:
    """What prefill_chunk() may read inside the traced prefill program: one chunk of C positions per row
    (right-padded; positions at or past a row's prompt length are dead, as in the step)."""

    tokens: Tensor  # [B, C] int64: the prompt's tokens at positions start_pos .. start_pos + C - 1
    next_tokens: Tensor  # [B, C] int64: the token one position later (0 where the prompt has none)
    start_pos: Tensor  # [B] int64: the chunk's first position
    slot_ids: Tensor  # [B]
    last_index: Tensor  # [B] int64: the row's last prompt position in the chunk (C - 1 if the prompt goes on)
    hidden: Tensor  # [B, C, H] the target's final (normed) hidden states over the chunk
    features: Tensor | None = None  # [B, C, F] the target features the drafter declares (target_features)


@dataclass
class PrefillEnd:
    """What prefill_finish() may read once every chunk of the prompts has run."""

    slot_ids: Tensor  # [rows]
    lengths: Tensor  # [rows] prompt lengths
    first: Tensor  # [rows] the target's first token (at position lengths)
    last_hidden: Tensor  # [rows, H] the target's final hidden state at position lengths - 1
    last_features: Tensor | None = None  # [rows, F] the declared target features there (None: none declared)


@dataclass
class StepView:
    """What propose() may read: the step's per-row inputs (trace.ROW_INPUTS) by name, K and the
    proposal rule. Positions: the last two committed tokens sit at committed_len - 2 and - 1."""

    inputs: dict[str, Tensor]
    k: int
    pick: Pick
    greedy: bool = False  # pick is the argmax (greedy drafts): every position can be picked in one launch

    def pick_positions(self, logits: Tensor) -> Tensor:
        """[B, K] drafts of logits [B, K, V] scored together (a block drafter's): the tokens pick gives
        at each position, in one argmax launch when greedy (not K)."""
        if self.greedy:
            return ops.argmax(logits)
        return torch.stack([self.pick(logits[:, index], index) for index in range(logits.shape[1])], dim=1)

    def pick_mapped(
        self, logits: Tensor, ids: Tensor | None, vocab_size: int, index: int | None = None
    ) -> tuple[Tensor, Tensor]:
        """(drafts, full logits) of reduced-vocabulary logits [B, N] (with index None: [B, K, N], every
        position as pick_positions) whose column d scores target id ids[d] (a token map, EAGLE-3's d2t;
        None: the logits are over the whole vocabulary). The full logits [..., V] are the drafts' q: the
        columns at their ids, -inf elsewhere. Greedy takes the first maximum over the N columns and maps
        it, so no [B, V] row of -inf is written and scattered onto (the full logits are dead code then):
        with ascending ids (token maps are kept sorted; public EAGLE-3 d2t maps are ascending) that is the
        full row's first maximum, torch.argmax's rule."""
        full = scatter_to_vocab(logits, ids, vocab_size)
        if self.greedy and ids is not None:
            drafts = ops.argmax(logits, ids)
        elif index is None:
            drafts = self.pick_positions(full)
        else:
            drafts = self.pick(full, index)
        return drafts, full


def rows_at(index: Tensor, *tensors: Tensor) -> tuple[Tensor, ...]:
    """x[arange(B), index] of each x [B, T, ...] of `tensors` (one T) for index [B]: each row's entry at its
    own position, as one row gather of the [B * T, ...] view (a lowered index_select: the advanced index's
    aten.index costs several times its launch at decode sizes on a GPU); the flat index is computed once."""
    batch, width = tensors[0].shape[:2]
    flat = torch.arange(batch, device=index.device) * width + index  # the arange is a constant (fold_constants)
    return tuple(x.flatten(0, 1).index_select(0, flat) for x in tensors)


class Drafter(ABC):
    """One drafter kind per file under graphspec/drafters/. Subclasses set `kind` and implement the
    abstract methods; a drafter with weights also sets `loaded` (its checkpoint)."""

    kind: ClassVar[str]
    # What the drafter reads from the target's forwards (models.decoder capture points, e.g. ("final",)
    # or three "layer_in:<i>"): the verify returns them (commit value "target_features") and prefill
    # passes them in PrefillView.features. Empty: the target's forward returns logits only.
    target_features: tuple[str, ...] = ()
    loaded: Any = None  # a models.LoadedModel when the drafter has its own checkpoint
    settings: dict[str, Any]  # the drafter's knobs, JSON-able (set by __init__)

    @property
    def model(self) -> torch.nn.Module | None:
        return None if self.loaded is None else self.loaded.model

    def params(self) -> dict[str, Tensor]:
        """Weights the step graph takes as inputs (named "draft.<name>"); tied weights appear once."""
        if self.model is None:
            return {}
        named = dict(self.model.named_parameters())
        named.update(self.model.named_buffers())
        return named

    @abstractmethod
    def states(self, slots: int, max_seq_len: int, k: int, dtype: torch.dtype) -> tuple[State, ...]:
        """The state tensors this drafter keeps, for `slots` cache slots of `max_seq_len` positions and
        at most K drafts per step (the largest K of any bucket's step: every bucket shares the states)."""

    @abstractmethod
    def propose(self, params: dict[str, Tensor], step: StepView, state: dict[str, Tensor]) -> Proposal:
        """step.k drafts per row, traced into the step's "draft" region. Must not branch on values.
        step.k may be below the K the states were laid out for (a bucket's own K, SpecConfig.k_by_bucket),
        and the previous step of a row may have had another K: whatever the state reads back (a catch-up
        over the last verify's rows) it sizes by the states' shapes, never by step.k."""

    @abstractmethod
    def prefill(self, prompt: PrefillView, state: dict[str, Tensor]) -> None:
        """Fill the state of the prompts' slots for their first step (eager, in place): the reference
        prefill, over whole prompts at once (the runtime's oracle for the compiled one)."""

    @abstractmethod
    def prefill_chunk(
        self, params: dict[str, Tensor], chunk: PrefillChunk, state: dict[str, Tensor]
    ) -> dict[str, Tensor]:
        """Every declared state after one prefill chunk (functional values), traced into the compiled
        prefill program after the target's forward over the chunk. Must not branch on values. Together
        with prefill_finish it must leave the state prefill() leaves, on every live position."""

    def prefill_finish(self, end: PrefillEnd, state: dict[str, Tensor]) -> None:
        """After a prompt's last chunk (eager, in place): what needs the target's first token. Default: nothing."""
        del end, state

    def describe(self) -> dict[str, Any]:
        """Kind and settings as recorded in the artifact manifest and printed by `inspect` (settings are
        what a user chose; loading passes them back)."""
        return {"kind": self.kind, **self.settings}
