"""Drafters: one file per kind. `drafter_kind`, `check_drafter` and `open_drafter` turn what a user
passes as `draft` into a Drafter, checking everything configs and file headers can tell before any
weight is read."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from transformers import PretrainedConfig

from graphspec.drafters.base import Drafter, Proposal, State, StepView
from graphspec.drafters.draft_model import DraftModel
from graphspec.drafters.mtp import Mtp, plan_head
from graphspec.drafters.ngram import NGram
from graphspec.errors import InputError
from graphspec.models.loading import LoadedModel, build_model, load_config, load_model
from graphspec.models.spec import ModelSpec

# kind -> class. NAMED_KINDS: `draft` strings that name a kind with no checkpoint of its own (n-gram has
# no model; MTP reads the target checkpoint's head).
KINDS: dict[str, type[Drafter]] = {"draft_model": DraftModel, "ngram": NGram, "mtp": Mtp}
NAMED_KINDS = ("ngram", "mtp")
NOT_YET = {"eagle3": "EAGLE-3 heads"}
SETTINGS = {"draft_model": (), "ngram": ("ngram_min", "ngram_max"), "mtp": ()}


def drafter_kind(draft: str | Path, drafter: str | None = None) -> str:
    """The drafter kind for `draft` (a checkpoint directory or the name of a kind without one)."""
    name = str(draft)
    if drafter is None:
        drafter = name if name in (*NAMED_KINDS, *NOT_YET) else "draft_model"
    if drafter in NOT_YET:
        raise InputError(
            f"drafter {drafter!r} ({NOT_YET[drafter]}) is not implemented yet; use a draft model, 'ngram' or 'mtp'"
        )
    if drafter not in KINDS:
        raise InputError(f"unknown drafter {drafter!r}; choose one of {', '.join(KINDS)}")
    if drafter in NAMED_KINDS and name != drafter:
        raise InputError(f"drafter {drafter!r} takes no checkpoint of its own; pass draft={drafter!r}, got {name!r}")
    if drafter not in NAMED_KINDS and name in NAMED_KINDS:
        raise InputError(f"drafter {drafter!r} needs a checkpoint directory, got draft={name!r}")
    return drafter


def check_drafter(
    draft: str | Path,
    kind: str,
    target: str | Path,
    target_config: PretrainedConfig,
    max_seq_len: int,
    settings: dict[str, Any],
) -> Drafter | None:
    """Validate the drafter against the target checkpoint (its directory and config) from configs and
    file headers alone (no weights read). Returns the drafter when it needs no weights, else None
    (open_drafter loads it)."""
    unknown = sorted(set(settings) - set(SETTINGS[kind]))
    if unknown:
        takes = ", ".join(SETTINGS[kind]) or "none"
        raise InputError(f"unknown option(s) {', '.join(unknown)} for drafter {kind!r} (it takes: {takes})")
    if kind == "ngram":
        return NGram(**settings)
    target_spec = ModelSpec.from_config(target_config)
    if kind == "mtp":  # names and shapes from the headers, against a meta-device target
        plan_head(Path(target), target_config, build_model(target_config))
        return None
    spec = ModelSpec.from_config(load_config(draft))
    if spec.vocab_size != target_spec.vocab_size:
        raise InputError(
            f"draft and target vocabularies differ: target vocab_size {target_spec.vocab_size}, draft {draft} has "
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
    draft: str | Path, kind: str, target: LoadedModel, dtype: str, device: str, checked: Drafter | None = None
) -> Drafter:
    """The drafter with its weights loaded (after check_drafter passed and the target is loaded)."""
    if checked is not None:
        return checked
    if kind == "mtp":
        return Mtp(target, target.model.model.embed_tokens.weight.dtype, device)
    return DraftModel(load_model(draft, dtype, device))


__all__ = [
    "KINDS",
    "NAMED_KINDS",
    "Drafter",
    "Proposal",
    "State",
    "StepView",
    "check_drafter",
    "drafter_kind",
    "open_drafter",
]
