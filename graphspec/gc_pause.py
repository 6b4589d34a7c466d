"""Python's cyclic garbage collector paused while graphspec rebuilds graphs: artifact load and a Runtime's
start-up (splitting the prefill programs, warm-up and capture).

Rebuilding stored graphs makes fx nodes by the tens of thousands, each with dicts and lists the collector
tracks. A collection runs every few hundred new container objects, and each collection of an older
generation walks everything built so far, so the collector's share grows with the size of the graphs:
with it paused, Runtime.load of an artifact with an 8B/1B pair's graph sizes (6 steps, 9 prefill
programs) takes 2.2 s on the CPU instead of 3.5 s (docs/BENCHMARKS.md). Objects freed by reference
counting go as always; cycles made meanwhile wait for the first collection after the pause. compile is
not paused: its passes discard whole graphs (cycles) that may hold traced example tensors, which would
then stay allocated until it returns, for 4-9% of its time on the CPU. Imports only the standard library.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def paused_gc() -> Iterator[None]:
    """Disable the cyclic collector inside (a context manager or a decorator); restore what it was on
    exit, so pauses nest."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
