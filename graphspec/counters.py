"""Counters tests assert on: what the compiler and runtime actually did."""

from __future__ import annotations

import sys
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass


@dataclass
class Counters:
    traces: int = 0  # step programs traced
    pipeline_runs: int = 0  # pass pipelines run (loading an artifact must leave this at 0)
    captures: int = 0  # CUDA graphs captured
    replays: int = 0  # CUDA graph replays
    eager_steps: int = 0  # steps run without a captured graph (CPU, or capture disabled)
    cpu_compiles: int = 0  # CPU steps handed to torch.compile (Runtime(compile_cpu=True))
    prefills: int = 0  # prefill() calls (each fills a group of prompts' slots)
    prefill_chunks: int = 0  # prefill chunk programs run (replayed or eager)

    def expect(self, **expected: int) -> None:
        """Assert the named counters have exactly these values; the message shows all of them."""
        actual = asdict(self)
        wrong = {name: (actual[name], value) for name, value in expected.items() if actual[name] != value}
        assert not wrong, f"counters differ (actual, expected): {wrong}; all: {actual}"

    def reset(self) -> None:
        for name in asdict(self):
            setattr(self, name, 0)


# One process-wide instance: compile() and Runtime add to it; tests reset it.
COUNTERS = Counters()

# Host seconds spent in named phases of start-up, process-wide (what a Runtime's warm-up reports by
# phase: the eager warm-up runs, recording the captures, instantiating the CUDA graphs).
PHASE_SECONDS: defaultdict[str, float] = defaultdict(float)


@contextmanager
def timed(phase: str) -> Iterator[None]:
    """Add the host time the block takes to PHASE_SECONDS[phase]."""
    began = time.perf_counter()
    try:
        yield
    finally:
        PHASE_SECONDS[phase] += time.perf_counter() - began


def compiled_graphs() -> int:
    """Graphs torch.compile has compiled in this process (torch._dynamo's own count, recompiles
    included); 0 while torch._dynamo is not imported: only Runtime(compile_cpu=True) uses it, and
    nothing else may import it (seconds of start-up)."""
    utils = sys.modules.get("torch._dynamo.utils")
    return 0 if utils is None else utils.counters["stats"]["unique_graphs"]
