"""Reduced ("hot") draft vocabularies: a draft head scores only N chosen target ids and its logits are
scattered onto the target vocabulary with -inf elsewhere, so greedy drafts and rejection sampling's q
are over target ids and never pick an id outside the map (the verify's residual still emits those).

EAGLE-3 heads ship their map (d2t, eagle3.py); a drafter that shares the target's lm_head (MTP heads,
DFlash drafters) takes one from a token-map file, FR-Spec (arXiv 2502.14856) and SGLang's
--speculative-token-map: its lm_head rows are sliced to those ids once, at load (attach_hot_head), and
each draft reads N x H of them instead of V x H (draft_scores). An EAGLE-3 head takes a token-map file
too (SGLang applies its map to EAGLE heads the same way): its draft vocabulary shrinks to the draft ids
whose target ids the map holds (restrict_map), and its own lm_head to their rows.
A token-map file is a safetensors file holding one 1-D int64 tensor `hot_token_ids` of distinct target
token ids (`graphspec token-map` writes one from text).
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file
from torch import Tensor, nn

from graphspec.errors import InputError

TENSOR = "hot_token_ids"  # the one tensor a token-map file holds


def read_token_map(path: str | Path, vocab_size: int) -> Tensor:
    """The ids of a token-map file, checked to be a non-empty 1-D int64 tensor of distinct ids in
    0..vocab_size - 1; anything else is refused with an InputError naming the file and the problem."""
    if not isinstance(path, (str, Path)):
        raise InputError(f"token_map must be a path to a token-map file, got {type(path).__name__} {path!r}")
    path = Path(path)
    fix = f"write one with `graphspec token-map TARGET CORPUS --size N --out FILE` (one int64 tensor {TENSOR!r})"
    if not path.is_file():
        raise InputError(f"token map {path}: no such file; {fix}")
    try:
        with safe_open(str(path), framework="pt", device="cpu") as handle:
            names = list(handle.keys())
            if names != [TENSOR]:
                raise InputError(f"token map {path} holds tensors {names}, not exactly one named {TENSOR!r}; {fix}")
            ids = handle.get_tensor(TENSOR)
    except (SafetensorError, OSError) as error:
        raise InputError(f"token map {path} is not a readable safetensors file ({error}); {fix}") from None
    if ids.dtype != torch.int64:
        raise InputError(f"token map {path}: {TENSOR} must be int64, found {ids.dtype}")
    if ids.dim() != 1:
        raise InputError(f"token map {path}: {TENSOR} must be 1-D, found shape {list(ids.shape)}")
    if ids.numel() == 0:
        raise InputError(f"token map {path}: {TENSOR} is empty; a draft vocabulary needs at least one id")
    bad = ((ids < 0) | (ids >= vocab_size)).nonzero().flatten().tolist()
    if bad:
        shown = ", ".join(f"[{i}]={int(ids[i])}" for i in bad[:5])
        raise InputError(
            f"token map {path}: {len(bad)} id(s) outside the target vocabulary 0..{vocab_size - 1} ({shown})"
        )
    unique, counts = ids.unique(return_counts=True)
    if unique.numel() != ids.numel():
        repeated = unique[counts > 1][:5].tolist()
        raise InputError(f"token map {path}: ids repeat ({repeated}); each id may appear once")
    return ids


def write_token_map(path: str | Path, ids: Tensor | list[int]) -> Path:
    """Save `ids` as a token-map file (the order is kept; it means nothing to the drafter)."""
    path = Path(path)
    save_file({TENSOR: torch.as_tensor(ids, dtype=torch.int64).contiguous()}, str(path))
    return path


def scatter_to_vocab(logits: Tensor, draft_to_target: Tensor | None, vocab_size: int) -> Tensor:
    """[..., V] target-vocabulary logits from [..., N] draft-vocabulary ones: logits[..., d] at target id
    draft_to_target[d], -inf at every other id (no draft and no draft probability lands there). None: the
    logits are over the target vocabulary already."""
    if draft_to_target is None:
        return logits
    rows = logits.reshape(-1, logits.shape[-1])
    full = rows.new_full((rows.shape[0], vocab_size), float("-inf"))
    full = full.scatter(-1, draft_to_target.expand(rows.shape[0], -1), rows)
    return full.view(*logits.shape[:-1], vocab_size)


def restrict_map(draft_to_target: Tensor, ids: Tensor, what: str) -> Tensor:
    """The draft ids (rows of a head's own lm_head) whose target ids draft_to_target[d] are among `ids`
    (a token map's), ordered by target id (see attach_hot_head for why ascending); an InputError naming
    `what` (the map and the head) when none are."""
    kept = torch.isin(draft_to_target, ids.to(draft_to_target.device)).nonzero().flatten()
    if kept.numel() == 0:
        raise InputError(f"{what}: none of the token map's {ids.numel()} ids is in the head's draft vocabulary")
    return kept[draft_to_target[kept].argsort()]


def attach_hot_head(module: nn.Module, lm_head_weight: Tensor, token_map: str | Path, vocab_size: int) -> int:
    """Give `module` the token map's rows of `lm_head_weight` as a parameter `hot_lm_head` [N, H] (a
    copy made once: the target's lm_head is untouched and still scores the verify) and its ids as the
    buffer `draft_to_target`, which draft_scores reads. Returns N."""
    # Sorted: the order means nothing to the drafter, and ascending ids let greedy drafts take the first
    # maximum over the map's columns (StepView.pick_mapped).
    ids = read_token_map(token_map, vocab_size).sort().values.to(lm_head_weight.device)
    module.hot_lm_head = nn.Parameter(lm_head_weight.detach().index_select(0, ids), requires_grad=False)
    module.register_buffer("draft_to_target", ids, persistent=False)
    return ids.numel()


def draft_scores(out: Tensor, params: dict[str, Tensor], lm_head: str) -> tuple[Tensor, Tensor | None]:
    """(logits, ids) of head outputs [..., H]: through the attached hot_lm_head, [..., N] with the map's
    target ids [N]; without a map through params[lm_head], [..., V] and None (every id). The draft
    distribution is scatter_to_vocab of them (StepView.pick_mapped picks from them)."""
    if "hot_lm_head" in params:
        return F.linear(out, params["hot_lm_head"]), params["draft_to_target"]
    return F.linear(out, params[lm_head]), None
