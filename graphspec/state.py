"""State a step keeps across steps, declared as data with its rollback rule: the target's (KV cache, and
for hybrid models the linear-attention states) and the drafter's (drafters/base.py). trace, the passes,
checks, the runtime and the artifact read these declarations; none of them knows a model or drafter by
name (see DESIGN.md, "The speculation step")."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

TARGET_CACHE = "target_cache"  # [L, 2, SLOTS, Hkv, S, D]: the target's KV cache, first of the step's states
# How a state tensor is rolled back when drafts are rejected. None needs work at rollback time:
# - "length": position-indexed per slot; entries at or past a row's committed length are dead, and the
#   step rewrites every entry before it reads it (KV caches, token history).
# - "verified": one row per position of the last verify (K+1 per slot); rows past that step's accepted
#   count are dead, and the drafter reads only the accepted ones (feature rows for heads). Rows after
#   the K+1 are the drafter's own, written in its proposal and live (a several-layer MTP head keeps there
#   the committed positions its next catch-up window starts from).
# - "snapshot": a whole state per slot that every position advances (Gated DeltaNet conv and recurrent
#   state, [L, SLOTS, ...]). The verify forward does not advance it: it returns the state after each of
#   its K+1 positions (snapshot_name(name), [L, B, K+1, ...]) and the accept region writes each row's
#   snapshot at its accepted count into the row's slot (graphspec::select_update); padded and stopped
#   rows write only the spare slot. Only the target may keep such state: a drafter that advanced it
#   could not be rolled back (drafts are rejected after the fact).
ROLLBACKS = ("length", "verified", "snapshot")
# Values the accept region can write into a drafter state after verify (see CommitWrite):
# "tokens" [B, K+1] the step's tokens, "target_features" [B, K+1, F] what the drafter captures from the
# verify forward (Drafter.target_features) at the verify positions, "committed_len" [B, 1] the committed
# length the step started from.
COMMIT_VALUES = ("tokens", "target_features", "committed_len")
# Where a commit write lands in each row's slot: "committed_len": positions L .. L+T-1 (after the
# committed tokens); "start": positions 0 .. T-1 (the slot's row is replaced).
COMMIT_AT = ("committed_len", "start")


@dataclass(frozen=True)
class CommitWrite:
    """After verify/accept, write `value` ([B, T, ...], one row per step row) into the state at each
    row's slot, from position `at` on (entries past the accepted ones are dead by the state's rollback
    rule). insert_verify adds these writes: they are how a drafter sees what verify produced."""

    value: str  # one of COMMIT_VALUES
    at: str = "committed_len"  # one of COMMIT_AT


@dataclass(frozen=True)
class State:
    """A tensor the target or a drafter keeps across steps: a graph input and output of the step (mutated in place
    after defunctionalize_kv), allocated once by the runtime and shared by every bucket."""

    name: str  # the step input/output name
    shape: tuple[int, ...]
    dtype: torch.dtype
    rollback: str  # one of ROLLBACKS
    commit: CommitWrite | None = None

    def __post_init__(self) -> None:
        assert self.rollback in ROLLBACKS, self.rollback
        assert self.commit is None or (self.commit.value in COMMIT_VALUES and self.commit.at in COMMIT_AT), self.commit

    def allocate(self, device: torch.device | str, zeroed: bool = True) -> Tensor:
        """The tensor, zeroed unless only its shape matters (tracing)."""
        make = torch.zeros if zeroed else torch.empty
        return make(self.shape, dtype=self.dtype, device=device)


def snapshot_name(state: str) -> str:
    """The traced step's output holding a "snapshot" state's per-position snapshots [L, B, K+1, ...]."""
    return f"{state}.snapshots"
