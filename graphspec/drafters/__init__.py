"""Drafters: one file per kind. `drafter_kind`, `check_drafter` and `open_drafter` turn what a user
passes as `draft` into a Drafter, checking everything configs and file headers can tell before any
weight is read."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from transformers import PretrainedConfig

from graphspec import drafter_kinds
from graphspec.drafter_kinds import NAMED_KINDS
from graphspec.drafters import dflash, eagle3
from graphspec.drafters.base import Drafter, Proposal, State, StepView
from graphspec.drafters.dflash import DFlash
from graphspec.drafters.draft_model import DraftModel
from graphspec.drafters.eagle3 import Eagle3
from graphspec.drafters.mtp import Mtp, plan_head
from graphspec.drafters.ngram import NGram
from graphspec.drafters.token_map import read_token_map
from graphspec.errors import InputError
from graphspec.models.loading import LoadedModel, build_model, load_config, load_model
from graphspec.models.spec import ModelSpec

# kind -> class. NAMED_KINDS (graphspec/drafter_kinds.py): `draft` strings that name a kind with no checkpoint
# of its own. DIRECTORY_KINDS: kinds a `draft` directory can be (draft="mtp" or an MTP head directory are
# both MTP).
KINDS: dict[str, type[Drafter]] = {cls.kind: cls for cls in (DraftModel, NGram, Mtp, Eagle3, DFlash)}
# The CLI offers drafter_kinds.KINDS without importing this package: the two must name the same kinds.
assert tuple(KINDS) == drafter_kinds.KINDS, f"drafter_kinds.KINDS should be {tuple(KINDS)}"
DIRECTORY_KINDS = ("draft_model", "mtp", "eagle3", "dflash")
SETTINGS = {
    "draft_model": (),
    "ngram": ("ngram_min", "ngram_max"),
    "mtp": ("token_map",),
    "eagle3": ("token_map",),
    "dflash": ("token_map",),
}
# Settings that name a file: an artifact carries a copy (digest-checked) and loads from it, never from
# the path given at compile time.
FILE_SETTINGS = ("token_map",)
# Why a kind takes no token map (drafters/token_map.py): said instead of "unknown option".
NO_TOKEN_MAP = {
    "draft_model": "a draft model scores its own lm_head inside its forward; slicing it is not wired",
    "ngram": "n-gram drafts are copied from the history, no logits are computed",
}


def directory_kind(path: str | Path) -> str:
    """The kind a checkpoint directory's config.json architectures say: a name containing "Eagle3" is an
    EAGLE-3 head, one containing "DFlash" or "MuseGlimmerAssistant" (or model_type muse_glimmer_assistant)
    a DFlash drafter, one ending in "NextN" or "MTP" an MTP head (SGLang's standalone NextN convention),
    anything else a draft model. A directory without a readable config is left to the loader to refuse."""
    config = Path(path) / "config.json"
    try:
        raw = json.loads(config.read_text())
        architectures = raw.get("architectures") or []
    except (OSError, ValueError, AttributeError):
        return "draft_model"
    if dflash.is_dflash(raw):
        return "dflash"
    if eagle3.is_eagle3(architectures):
        return "eagle3"
    if any(str(name).endswith(("NextN", "MTP")) for name in architectures):
        return "mtp"
    return "draft_model"


def drafter_kind(draft: str | Path, drafter: str | None = None) -> str:
    """The drafter kind for `draft` (a checkpoint or head directory, or the name of a kind without one):
    `drafter` when given, else read from the directory's config (directory_kind)."""
    name = str(draft)
    if drafter is None and name in KINDS and name not in NAMED_KINDS and not Path(name).is_dir():
        raise InputError(f"draft={name!r} names a drafter kind that needs a checkpoint directory; pass the directory")
    if drafter is None:
        drafter = name if name in NAMED_KINDS else directory_kind(draft)
    if drafter not in KINDS:
        raise InputError(f"unknown drafter {drafter!r}; choose one of {', '.join(KINDS)}")
    if drafter not in DIRECTORY_KINDS and name != drafter:
        raise InputError(f"drafter {drafter!r} takes no checkpoint of its own; pass draft={drafter!r}, got {name!r}")
    if name in NAMED_KINDS and name != drafter:
        raise InputError(f"drafter {drafter!r} needs a checkpoint directory, got draft={name!r}")
    return drafter


def check_drafter(
    draft: str | Path,
    kind: str,
    target: str | Path,
    target_config: PretrainedConfig,
    max_seq_len: int,
    settings: dict[str, Any],
    k: int,
) -> Drafter | None:
    """Validate the drafter against the target checkpoint (its directory and config), the cache length
    and K, from configs and file headers alone (no weights read). Returns the drafter when it needs no
    weights, else None (open_drafter loads it)."""
    if settings.get("token_map") is not None and kind in NO_TOKEN_MAP:
        raise InputError(
            f"token_map applies to MTP heads, EAGLE-3 heads and DFlash drafters, not "
            f"drafter {kind!r}: "
            f"{NO_TOKEN_MAP[kind]}"
        )
    settings = {name: value for name, value in settings.items() if name not in FILE_SETTINGS or value is not None}
    unknown = sorted(set(settings) - set(SETTINGS[kind]))
    if unknown:
        takes = ", ".join(SETTINGS[kind]) or "none"
        raise InputError(f"unknown option(s) {', '.join(unknown)} for drafter {kind!r} (it takes: {takes})")
    if kind == "ngram":
        return NGram(**settings)
    target_spec = ModelSpec.from_config(target_config)
    if settings.get("token_map") is not None:  # the file, before any weight is read
        read_token_map(settings["token_map"], target_spec.vocab_size)
    if kind == "mtp":  # names and shapes from the headers, against a meta-device target
        if str(draft) == "mtp":
            plan_head(Path(target), target_config, build_model(target_config))
        else:
            plan_head(Path(draft), load_config(draft), build_model(target_config), own_checkpoint=False)
        return None
    if kind == "eagle3":  # config fields, names, shapes and d2t, against a meta-device target
        plan = eagle3.plan_head(Path(draft), target_config, build_model(target_config))
        if settings.get("token_map") is not None:  # its overlap with the head's draft vocabulary
            eagle3.mapped_rows(plan.target_ids(), settings["token_map"], draft, target_spec.vocab_size)
        return None
    if kind == "dflash":  # layer ids, block size vs K, mask token, window, names and shapes, on a meta target
        dflash.plan_head(Path(draft), build_model(target_config), k, max_seq_len)
        return None
    spec = ModelSpec.from_config(load_config(draft))
    if spec.linear is not None:  # the step re-feeds drafts (catch-up), which would advance a recurrent state twice
        raise InputError(
            f"draft model {draft} is a hybrid (linear-attention) model; draft models must be attention-only"
        )
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


def draft_config(draft: str | Path, kind: str) -> PretrainedConfig:
    """The config of a drafter directory as its drafter reads it (the artifact compares it with its record)."""
    return dflash.read_config(draft) if kind == "dflash" else load_config(draft)


def open_drafter(
    draft: str | Path,
    kind: str,
    target: LoadedModel,
    dtype: str,
    device: str,
    checked: Drafter | None = None,
    settings: dict[str, Any] | None = None,
    fold_norms: bool = False,
) -> Drafter:
    """The drafter with its weights loaded (after check_drafter passed on the same settings and the
    target is loaded). fold_norms: a draft model's, as load_model's."""
    if checked is not None:
        return checked
    settings = settings or {}
    if kind == "mtp":
        head_dir = None if str(draft) == "mtp" else Path(draft)
        embedding = target.model.model.embed_tokens.weight
        return Mtp(target, embedding.dtype, device, head_dir, settings.get("token_map"))
    if kind == "eagle3":
        return Eagle3(draft, target, target.model.model.embed_tokens.weight.dtype, device, settings.get("token_map"))
    if kind == "dflash":
        return DFlash(draft, target, target.model.model.embed_tokens.weight.dtype, device, settings.get("token_map"))
    return DraftModel(load_model(draft, dtype, device, fold_norms=fold_norms))


__all__ = [
    "DIRECTORY_KINDS",
    "FILE_SETTINGS",
    "KINDS",
    "NAMED_KINDS",
    "Drafter",
    "Proposal",
    "State",
    "StepView",
    "check_drafter",
    "draft_config",
    "drafter_kind",
    "open_drafter",
]
