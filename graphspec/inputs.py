"""Validation of what callers pass to generate(), shared by Runtime and the reference decoder so both
refuse the same inputs with the same messages, before any work starts.

Token ids may be Python ints or anything with __index__ (numpy integers, 0-d integer tensors): users
often hand over ids straight from a tokenizer or a tensor. bool is refused even though it is an int.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence

import torch

from graphspec.errors import InputError


def token_id(value: object, what: str) -> int:
    """`value` as an int token id; InputError naming `what` when it is not an integer."""
    if isinstance(value, bool) or (isinstance(value, torch.Tensor) and value.is_floating_point()):
        raise InputError(f"{what} must hold int token ids, got {value!r}")
    try:
        return operator.index(value)
    except TypeError:
        raise InputError(f"{what} must hold int token ids, got {value!r}") from None


def check_prompts(prompts: object, vocab_size: int, tokenizer: object | None = None) -> list[list[int]]:
    """Prompts as lists of in-vocabulary int ids. Strings are encoded with `tokenizer` (a transformers
    tokenizer) and refused when there is none; a 2-D integer tensor or numpy array is one prompt per row."""
    # Duck-typed (ndim + tolist) so numpy stays optional; a 1-D array is one prompt, refused below.
    if getattr(prompts, "ndim", None) == 2 and callable(getattr(prompts, "tolist", None)):
        prompts = prompts.tolist()
    if isinstance(prompts, (str, bytes)) or not isinstance(prompts, Sequence) or len(prompts) == 0:
        raise InputError("prompts must be a non-empty list of token-id lists (or of strings, with a tokenizer)")
    checked = []
    for index, prompt in enumerate(prompts):
        if isinstance(prompt, str):
            if tokenizer is None:
                raise InputError(f"prompt {index} is a string but there is no tokenizer (the checkpoint has none)")
            prompt = tokenizer(prompt)["input_ids"]
        # Lists and tuples, tensors and numpy arrays (duck-typed by __array__, so numpy stays optional).
        if isinstance(prompt, bytes) or not (isinstance(prompt, Sequence) or hasattr(prompt, "__array__")):
            raise InputError(f"prompt {index} must be a list of token ids, got {type(prompt).__name__}")
        try:
            items = list(prompt)
        except TypeError:  # a 0-d tensor or array: one id where a list of them belongs
            raise InputError(f"prompt {index} must be a list of token ids, got {prompt!r}") from None
        ids = [token_id(t, f"prompt {index}") for t in items]
        if not ids:
            raise InputError(f"prompt {index} is empty; every prompt needs at least one token")
        bad = [t for t in ids if not 0 <= t < vocab_size]
        if bad:
            raise InputError(f"prompt {index} has token ids outside [0, {vocab_size}): {bad[:5]}")
        checked.append(ids)
    return checked


def check_stop_token_ids(stop_token_ids: object, vocab_size: int) -> set[int]:
    """A collection of in-vocabulary int ids (empty: no stop tokens) as a set. A bare id is refused
    rather than guessed at: stop_token_ids=5 is most likely a slip for [5]."""
    if isinstance(stop_token_ids, (str, bytes)) or not (
        isinstance(stop_token_ids, (Sequence, set, frozenset)) or hasattr(stop_token_ids, "__array__")
    ):
        raise InputError(
            f"stop_token_ids must be a list of token ids (or None for the EOS ids, [] for none), "
            f"got {stop_token_ids!r}{'; for one id write [id]' if _is_int(stop_token_ids) else ''}"
        )
    try:
        items = list(stop_token_ids)
    except TypeError:  # a 0-d tensor or array
        raise InputError(f"stop_token_ids must be a list of token ids, got {stop_token_ids!r}") from None
    ids = {token_id(t, "stop_token_ids") for t in items}
    bad = sorted(t for t in ids if not 0 <= t < vocab_size)
    if bad:
        raise InputError(
            f"stop_token_ids has ids outside the vocabulary [0, {vocab_size}): {bad[:5]}; they could never stop a row"
        )
    return ids


def _is_int(value: object) -> bool:
    try:
        operator.index(value)
    except TypeError:
        return False
    return not isinstance(value, bool)


def check_max_new_tokens(max_new_tokens: object) -> int:
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise InputError(f"max_new_tokens must be an int >= 1, got {max_new_tokens!r}")
    return max_new_tokens


def check_sampling(temperature: object, top_k: object, top_p: object) -> None:
    """temperature finite and >= 0 (0: greedy); top_k None or an int >= 0 (0: off); top_p None or in (0, 1]."""
    if (
        isinstance(temperature, bool)
        or not isinstance(temperature, (int, float))
        or not math.isfinite(temperature)
        or temperature < 0
    ):
        raise InputError(f"temperature must be a finite number >= 0, got {temperature!r}")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 0):
        raise InputError(f"top_k must be None or an int >= 0, got {top_k!r}")
    if top_p is not None and (isinstance(top_p, bool) or not isinstance(top_p, (int, float)) or not 0 < top_p <= 1):
        raise InputError(f"top_p must be None or in (0, 1], got {top_p!r}")
