"""Incremental detokenization for streaming: token ids in, text deltas out, such that the deltas joined
are exactly the final text (the engine's GenerationResult.text, already cut at a stop string).

Two things are held back until a later token settles them: a trailing incomplete UTF-8 sequence (a
byte-level token can end mid-character; the tokenizer shows it as U+FFFD) and a trailing partial
prefix of a stop string (it may complete, and a stop string is never shown).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from graphspec.runtime.requests import stop_string_cut


def partial_overlap(text: str, marker: str) -> int:
    """Length of the longest proper prefix of `marker` that `text` ends with (0: none)."""
    for size in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:size]):
            return size
    return 0


class TextStream:
    """Text deltas of one request's tokens (decoding the whole output each time: simple, and exact for
    any tokenizer whose decode of a longer sequence extends the shorter one's settled text)."""

    def __init__(self, tokenizer: Any, stops: Sequence[str] = ()) -> None:
        self.tokenizer = tokenizer
        self.stops = tuple(stops)
        self.ids: list[int] = []
        self.sent = ""

    def add(self, token_ids: Sequence[int]) -> str:
        """The text these tokens settle (may be empty while something is held back)."""
        self.ids.extend(token_ids)
        text = self.tokenizer.decode(self.ids)
        settled = text.rstrip("\ufffd")
        cut = stop_string_cut(settled, self.stops, 0) if self.stops else None
        if cut is not None:
            settled = settled[:cut]
        else:
            held = max((partial_overlap(settled, stop) for stop in self.stops), default=0)
            settled = settled[: len(settled) - held]
        return self._send(settled)

    def finish(self, final_text: str) -> str:
        """The rest of `final_text` (the request's whole text) not yet sent."""
        return self._send(final_text)

    def _send(self, settled: str) -> str:
        if not settled.startswith(self.sent) or len(settled) <= len(self.sent):
            return ""
        delta, self.sent = settled[len(self.sent) :], settled
        return delta
