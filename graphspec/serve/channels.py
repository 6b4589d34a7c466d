"""Streaming split of model text into reasoning, content and tool-call channels by marker strings
(think tags, tool-call tags), invariant to how the text is cut into deltas.

Speculative steps commit 1..K+1 tokens at once, so where a delta boundary falls inside a marker moves
with acceptance. The parser therefore decides only on what no later text can change: a complete marker
is acted on, and a trailing piece that is a proper prefix of a marker valid in the current channel is
held back until a later delta completes or refutes it (the bug of seed 003: `<tool` then `_calls>`
leaked the prefix as reasoning and lost the call). finish() flushes what is held to the current channel.
For any split of a text into deltas, the channels joined equal those of parsing the text whole.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from graphspec.serve.text import partial_overlap

REASONING, CONTENT, TOOL = "reasoning", "content", "tool"


@dataclass(frozen=True)
class Markers:
    """The marker strings of a chat template. starts_in_reasoning: the prompt already opened the think
    block (DeepSeek-R1/V4, Qwen3 thinking templates end the prompt with `<think>`). A tool-call start met
    while reasoning ends the reasoning implicitly (DeepSeek-V4 omits `</think>` before tool calls)."""

    think_start: str = "<think>"
    think_end: str = "</think>"
    tool_start: str = "<tool_call>"
    tool_end: str = "</tool_call>"
    starts_in_reasoning: bool = False

    def __post_init__(self) -> None:
        names = ("think_start", "think_end", "tool_start", "tool_end")
        if not all(isinstance(getattr(self, n), str) and getattr(self, n) for n in names):
            raise ValueError("every marker must be a non-empty string")

    def transitions(self, channel: str) -> dict[str, str]:
        """Marker -> the channel it switches to, for the markers that mean something in `channel`."""
        if channel == REASONING:
            return {self.think_end: CONTENT, self.tool_start: TOOL}
        if channel == CONTENT:
            return {self.think_start: REASONING, self.tool_start: TOOL}
        return {self.tool_end: CONTENT}


@dataclass
class ChannelDelta:
    reasoning: str = ""
    content: str = ""
    tool_calls: list[str] = field(default_factory=list)  # the text between a tool-call start and end marker

    def __bool__(self) -> bool:
        return bool(self.reasoning or self.content or self.tool_calls)


class ChannelParser:
    """is_tool_call(body) says whether a complete tool-call body is a call (say, JSON naming a function);
    one that is not stays in content where it was written, markers included."""

    def __init__(self, markers: Markers | None = None, is_tool_call: Callable[[str], bool] | None = None) -> None:
        self.markers = markers or Markers()
        self.is_tool_call = is_tool_call
        self.channel = REASONING if self.markers.starts_in_reasoning else CONTENT
        self.pending = ""  # text not yet given to a channel: at most a partial marker after each feed()
        self.tool_body = ""

    def feed(self, text: str) -> ChannelDelta:
        self.pending += text
        return self._scan(final=False)

    def finish(self) -> ChannelDelta:
        """End of stream: held text goes to the current channel; an unterminated tool call is returned
        as content, start marker included (it is not a call anyone can run)."""
        out = self._scan(final=True)
        if self.channel == TOOL:
            out.content += self.markers.tool_start + self.tool_body
            self.tool_body, self.channel = "", CONTENT
        return out

    def _scan(self, final: bool) -> ChannelDelta:
        out = ChannelDelta()
        while True:
            transitions = self.markers.transitions(self.channel)
            hit = None  # (start, marker): earliest complete marker, the longest at a tie
            for marker in transitions:
                index = self.pending.find(marker)
                if index >= 0 and (hit is None or (index, -len(marker)) < (hit[0], -len(hit[1]))):
                    hit = (index, marker)
            held = 0 if final else max(partial_overlap(self.pending, m) for m in transitions)
            partial_start = len(self.pending) - held
            if hit is None or (partial_start, -held) < (hit[0], -len(hit[1])):
                # Nothing complete before a piece that may still become a marker (or a longer marker
                # at the same start): keep that piece.
                self._emit(out, self.pending[:partial_start])
                self.pending = self.pending[partial_start:]
                return out
            index, marker = hit
            self._emit(out, self.pending[:index])
            self.pending = self.pending[index + len(marker) :]
            if self.channel == TOOL:
                if self.is_tool_call is None or self.is_tool_call(self.tool_body):
                    out.tool_calls.append(self.tool_body)
                else:
                    out.content += self.markers.tool_start + self.tool_body + self.markers.tool_end
                self.tool_body = ""
            self.channel = transitions[marker]

    def _emit(self, out: ChannelDelta, text: str) -> None:
        if self.channel == REASONING:
            out.reasoning += text
        elif self.channel == CONTENT:
            out.content += text
        else:
            self.tool_body += text
