"""Drafters: one file per kind. `open_drafter` turns what a user passes as `draft` into a Drafter,
checking everything the configs can tell before any weight is read."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from graphspec.drafters.base import Drafter, Proposal, State, StepView
from graphspec.drafters.draft_model import DraftModel
from graphspec.drafters.ngram import NGram
from graphspec.errors import InputError
from graphspec.models.loading import load_config, load_model
from graphspec.models.spec import ModelSpec

# kind -> class; `draft` strings that name a kind without a checkpoint.
KINDS: dict[str, type[Drafter]] = {"draft_model": DraftModel, "ngram": NGram}
MODEL_FREE = ("ngram",)
NOT_YET = {"mtp": "MTP heads", "eagle3": "EAGLE-3 heads"}


def drafter_kind(draft: str | Path, drafter: str | None = None) -> str:
    """The drafter kind for `draft` (a checkpoint directory or a model-free kind's name)."""
    name = str(draft)
    if drafter is None:
        drafter = name if name in (*MODEL_FREE, *NOT_YET) else "draft_model"
    if drafter in NOT_YET:
        raise InputError(
            f"drafter {drafter!r} ({NOT_YET[drafter]}) is not implemented yet; use a draft model or 'ngram'"
        )
    if drafter not in KINDS:
        raise InputError(f"unknown drafter {drafter!r}; choose one of {', '.join(KINDS)}")
    if drafter in MODEL_FREE and name != drafter:
        raise InputError(f"drafter {drafter!r} takes no checkpoint; pass draft={drafter!r}, got {name!r}")
    if drafter not in MODEL_FREE and name in MODEL_FREE:
        raise InputError(f"drafter {drafter!r} needs a checkpoint directory, got draft={name!r}")
    return drafter


def check_drafter(
    draft: str | Path, kind: str, target: ModelSpec, max_seq_len: int, settings: dict[str, Any]
) -> Drafter | None:
    """Validate the drafter against the target from configs alone (no weights read). Returns the
    drafter when it needs no weights, else None (open_drafter loads it)."""
    if kind == "ngram":
        unknown = sorted(set(settings) - {"ngram_min", "ngram_max"})
        if unknown:
            raise InputError(
                f"unknown n-gram option(s) {', '.join(unknown)}; the n-gram drafter takes ngram_min, ngram_max"
            )
        return NGram(**settings)
    if settings:
        raise InputError(f"drafter {kind!r} takes no settings, got {', '.join(sorted(settings))}")
    spec = ModelSpec.from_config(load_config(draft))
    if spec.vocab_size != target.vocab_size:
        raise InputError(
            f"draft and target vocabularies differ: target vocab_size {target.vocab_size}, draft {draft} has "
            f"{spec.vocab_size}; speculative decoding needs a shared vocabulary"
        )
    check_context(draft, spec, max_seq_len)
    return None


def check_context(path: str | Path, spec: ModelSpec, max_seq_len: int) -> None:
    """max_seq_len within the model's position limit and (without rolling windows) its sliding window."""
    if max_seq_len > spec.max_position_embeddings:
        raise InputError(
            f"max_seq_len={max_seq_len} exceeds {path}'s max_position_embeddings={spec.max_position_embeddings}"
        )
    if spec.sliding_window is not None and max_seq_len > spec.sliding_window:
        raise InputError(f"max_seq_len={max_seq_len} exceeds {path}'s sliding_window={spec.sliding_window}")


def open_drafter(
    draft: str | Path, kind: str, settings: dict[str, Any], dtype: str, device: str, checked: Drafter | None = None
) -> Drafter:
    """The drafter, weights loaded (after check_drafter passed)."""
    if checked is not None:
        return checked
    return DraftModel(load_model(draft, dtype, device))


__all__ = ["KINDS", "Drafter", "Proposal", "State", "StepView", "check_drafter", "drafter_kind", "open_drafter"]
