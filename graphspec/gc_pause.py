"""Python's cyclic garbage collector paused while graphspec builds graphs: compile, artifact load, and a
Runtime's start-up (splitting the prefill programs, warm-up and capture).

Tracing, the passes and rebuilding stored graphs make fx nodes by the tens of thousands, each with dicts
and lists the collector tracks. A collection runs every few hundred new container objects, and each
collection of an older generation walks everything built so far, so the collector's share grows with
the size of the graphs: with it paused, loading an artifact with an 8B/1B pair's graphs (6 steps, 9
prefill programs) took 1.9 s on the CPU instead of 3.3 s, and compiling them 39 s instead of 43 s
(docs/BENCHMARKS.md). Objects freed by reference counting go as always; cycles made meanwhile wait for the
first collection after the pause. Imports nothing but the standard library.
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
