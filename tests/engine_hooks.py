"""Run test code on the engine's loop thread between two steps, where it cannot race a step."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager


class BetweenSteps:
    """An engine listener calling fn(slots, committed lengths) of the live rows after every step
    (their next step's values: the step's feedback is already in the buffers)."""

    def __init__(self, fn: Callable[[list[int], list[int]], None]) -> None:
        self.fn = fn

    def on_step(self, buffers, rows: int, accepted: list[int]) -> None:
        self.fn(buffers.inputs["slot_ids"][:rows].tolist(), buffers.inputs["committed_len"][:rows].tolist())

    def on_finish(self, request) -> None:
        pass


@contextmanager
def between_steps(runtime, fn: Callable[[list[int], list[int]], None]) -> Iterator[None]:
    listener = BetweenSteps(fn)
    runtime.engine.listeners.append(listener)
    try:
        yield
    finally:
        runtime.engine.listeners.remove(listener)
