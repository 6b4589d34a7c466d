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

# How a state tensor is rolled back when drafts are rejected. Both need no work at rollback time:
# - "length": position-indexed per slot; entries at or past a row's committed length are dead, and the
#   step rewrites every entry before it reads it (KV caches, token history).
ROLLBACKS = ("length",)
# Values the accept region can write into a drafter state after verify (see CommitWrite).
COMMIT_VALUES = ("tokens",)


@dataclass(frozen=True)
class CommitWrite:
    """After verify/accept, write `value` ([B, T, ...], one row per step row) into the state at each
    row's slot, positions committed_len .. committed_len + T - 1 (entries past the accepted ones are
    dead by the state's "length" rollback). insert_verify adds these writes; a drafter never sees the
    verified tokens otherwise."""

    value: str  # one of COMMIT_VALUES: "tokens" is the step's emitted tokens [B, K+1]


@dataclass(frozen=True)
class State:
    """A tensor a drafter keeps across steps: a graph input and output of the step (mutated in place
    after defunctionalize_kv), allocated once by the runtime and shared by every bucket."""

    name: str  # the step input/output name
    shape: tuple[int, ...]
    dtype: torch.dtype
    rollback: str  # one of ROLLBACKS
    slot_dim: int  # the dimension indexed by cache slot
    commit: CommitWrite | None = None
    zeroed: bool = True  # allocate with zeros (else empty: only the shape matters)

    def __post_init__(self) -> None:
        assert self.rollback in ROLLBACKS, self.rollback
        assert self.commit is None or self.commit.value in COMMIT_VALUES, self.commit

    def allocate(self, device: torch.device | str, zeroed: bool | None = None) -> Tensor:
        make = torch.zeros if (self.zeroed if zeroed is None else zeroed) else torch.empty
        return make(self.shape, dtype=self.dtype, device=device)


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
class StepView:
    """What propose() may read: the step's per-row inputs (trace.ROW_INPUTS) by name, K and the
    proposal rule. Positions: the last two committed tokens sit at committed_len - 2 and - 1."""

    inputs: dict[str, Tensor]
    k: int
    pick: Pick


class Drafter(ABC):
    """One drafter kind per file under graphspec/drafters/. Subclasses set `kind` and implement the
    abstract methods; a drafter with weights also sets `loaded` (its checkpoint)."""

    kind: ClassVar[str]
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
    def states(self, slots: int, max_seq_len: int, dtype: torch.dtype) -> tuple[State, ...]:
        """The state tensors this drafter keeps, for `slots` cache slots of `max_seq_len` positions."""

    @abstractmethod
    def propose(self, params: dict[str, Tensor], step: StepView, state: dict[str, Tensor]) -> Proposal:
        """K drafts per row, traced into the step's "draft" region. Must not branch on values."""

    @abstractmethod
    def prefill(self, tokens: Tensor, slot_ids: Tensor, lengths: Tensor, state: dict[str, Tensor]) -> None:
        """Fill the state of slots `slot_ids` from right-padded prompts tokens [rows, T] (eager, in place);
        lengths [rows] are the real prompt lengths."""

    def describe(self) -> dict[str, Any]:
        """Kind and settings as recorded in the artifact manifest and printed by `inspect`."""
        return {"kind": self.kind, **self.settings}
