"""What a caller hands the engine (SamplingParams) and what it gets back (Delta, GenerationResult),
checked before the engine sees them: a refused request never reaches the loop, so it cannot disturb others.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from graphspec.errors import InputError
from graphspec.inputs import check_max_new_tokens, check_sampling, check_stop_token_ids


@dataclass(frozen=True)
class SamplingParams:
    """One request's settings. temperature 0 is greedy; top_k 0 and top_p 1 are off; seed None draws a
    fresh seed; stop_token_ids None means the checkpoint's EOS ids ([] turns stop tokens off); `stop` are
    stop strings (the emitted text ends before the first one, its tokens are kept up to the one that
    completed it); logprobs asks for the target's log-probability of each emitted token."""

    max_tokens: int = 64
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    stop_token_ids: tuple[int, ...] | None = None
    stop: tuple[str, ...] = ()
    logprobs: bool = False

    def checked(self, vocab_size: int) -> SamplingParams:
        """These settings, validated (InputError naming the field) and normalized."""
        check_max_new_tokens(self.max_tokens)
        if isinstance(self.temperature, float) and math.isnan(self.temperature):
            raise InputError("temperature must be a finite number >= 0, got nan")
        check_sampling(self.temperature, self.top_k, self.top_p)
        stops = None
        if self.stop_token_ids is not None:
            stops = tuple(sorted(check_stop_token_ids(self.stop_token_ids, vocab_size)))
        if isinstance(self.stop, str) or not all(isinstance(s, str) and s for s in self.stop):
            raise InputError(f"stop must be a list of non-empty strings, got {self.stop!r}")
        return SamplingParams(
            max_tokens=self.max_tokens,
            temperature=float(self.temperature),
            top_k=self.top_k or 0,
            top_p=1.0 if self.top_p is None else float(self.top_p),
            seed=self.seed,
            stop_token_ids=stops,
            stop=tuple(self.stop),
            logprobs=bool(self.logprobs),
        )


@dataclass
class RequestStats:
    steps: int = 0
    accepted_per_step: list[int] = field(default_factory=list)

    @property
    def tokens_per_step(self) -> list[int]:
        return [n + 1 for n in self.accepted_per_step]


@dataclass
class Delta:
    """Tokens one step committed for a request (1..K+1), with their log-probabilities when asked."""

    token_ids: list[int]
    logprobs: list[float] | None = None


@dataclass
class GenerationResult:
    token_ids: list[int]
    text: str | None
    finish_reason: str  # "stop", "length", or "cancelled"
    stats: RequestStats
    logprobs: list[float] | None = None
    prompt_tokens: int = 0


def stop_string_cut(text: str, stops: Sequence[str], searched: int) -> int | None:
    """Index in `text` where the earliest stop string starts, looking only at matches that end past
    `searched` (the text already checked); None when there is none."""
    best = None
    for stop in stops:
        index = text.find(stop, max(0, searched - len(stop) + 1))
        if index >= 0 and (best is None or index < best):
            best = index
    return best
