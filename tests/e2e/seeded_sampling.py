"""The seeded-sampling check every drafter's end-to-end tests run on their runtime."""

from __future__ import annotations

import graphspec
from graphspec.runtime.requests import GenerationResult


def assert_seeded_sampling_repeats_and_top_k_1_is_greedy(
    runtime: graphspec.Runtime, batch: list[list[int]]
) -> list[GenerationResult]:
    """The same seed gives the same samples, and temperature 1 with top_k 1 gives the greedy tokens (no
    stop tokens, so every row runs its 16 steps). Returns the first seeded results."""
    first = runtime.generate(batch, max_new_tokens=16, temperature=0.9, seed=123)
    again = runtime.generate(batch, max_new_tokens=16, temperature=0.9, seed=123)
    assert [r.token_ids for r in first] == [r.token_ids for r in again]
    greedy_like = runtime.generate(batch, max_new_tokens=16, temperature=1.0, top_k=1, seed=5, stop_token_ids=[])
    greedy = runtime.generate(batch, max_new_tokens=16, stop_token_ids=[])
    assert [r.token_ids for r in greedy_like] == [r.token_ids for r in greedy]
    return first
