"""Time the regions of one compiled speculation step (draft, verify, accept) from inside the step.

Opt-in instrumentation for benchmarks; the Runtime never uses it and production graphs never carry
it. instrument() copies a step's graph and puts a mark before the first op of each region
(meta["gs_region"], trace.REGIONS) and one before the output. time_regions() runs that copy as the
bucket runs its own graph (captured as a CUDA graph, or eagerly) over the same weights, buffers and
caches, interleaved with calls of the plain step.

On CUDA a mark records a timing event. Under capture, torch.cuda.Event(external=True) turns the
record into an event node of the CUDA graph, so every replay timestamps each region boundary on the
device, with no host involvement and nothing waiting inside the step. (A non-external record under
capture only expresses a cross-stream dependency and carries no time.) On CPU a mark reads the host
clock. Marks take no tensor and return nothing: the instrumented step computes exactly what the
plain step computes, bit for bit (tests/runtime/test_region_timing.py).
"""

from __future__ import annotations

import itertools
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx as fx

from graphspec.runtime.graphs import StepGraph

NAME = "region_timing"  # meta["gs_pass"] of the mark nodes


class Marks:
    """Timestamps at region boundaries: one slot per mark index, overwritten by every run."""

    def __init__(self, count: int, cuda: bool) -> None:
        self.cuda = cuda
        self.events = [torch.cuda.Event(enable_timing=True, external=True) for _ in range(count)] if cuda else []
        self.clock = [0.0] * count

    def mark(self, index: int) -> None:
        if self.cuda:
            self.events[index].record()
        else:
            self.clock[index] = time.perf_counter()

    def intervals_ms(self) -> list[float]:
        """Milliseconds between consecutive marks of the last run (on CUDA, waits for that run)."""
        if self.cuda:
            self.events[-1].synchronize()
            return [start.elapsed_time(end) for start, end in itertools.pairwise(self.events)]
        return [(end - start) * 1e3 for start, end in itertools.pairwise(self.clock)]


def region_starts(gm: fx.GraphModule) -> list[tuple[str, fx.Node]]:
    """(region, its first op) in graph order. Refuses a split graph (its pieces span regions) and a
    graph whose ops lack a region or whose regions are not one contiguous run each."""
    if any(node.op == "call_module" for node in gm.graph.nodes):
        raise ValueError(
            "region timing needs a flat step graph; a piecewise (split_attention) graph's pieces span "
            "regions: compile with capture='auto'"
        )
    starts: list[tuple[str, fx.Node]] = []
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        region = node.meta.get("gs_region")
        if region is None:
            raise ValueError(f"{node.name} has no region (meta['gs_region']); was the graph traced by graphspec?")
        if starts and starts[-1][0] == region:
            continue
        if any(seen == region for seen, _ in starts):
            raise ValueError(f"region {region!r} runs twice ({[seen for seen, _ in starts]} then {region!r})")
        starts.append((region, node))
    return starts


def instrument(gm: fx.GraphModule, marks: Marks) -> fx.GraphModule:
    """A copy of gm (sharing its constants) that calls marks.mark(i) right before the first op of
    region i and marks.mark(len(regions)) right before the output. gm itself is not changed."""
    starts = {node: index for index, (_, node) in enumerate(region_starts(gm))}
    graph = fx.Graph()
    copies: dict[fx.Node, fx.Node] = {}
    for node in gm.graph.nodes:
        if node in starts or node.op == "output":
            mark = graph.call_function(marks.mark, (starts.get(node, len(starts)),))
            mark.meta["gs_pass"] = NAME
        copies[node] = graph.node_copy(node, lambda value: copies[value])
    return fx.GraphModule(gm, graph)


@dataclass(frozen=True)
class RegionTiming:
    """Per-region medians over `runs` instrumented calls; they add up to (about: medians) marked_ms,
    the instrumented step from its first mark to its last. step_ms is the plain step per call over
    `runs` calls back to back, so on CUDA each launch hides behind the previous replay and step_ms is
    device time, comparable with marked_ms."""

    mode: str  # how the bucket runs: "full" (one CUDA graph, or its CPU emulation) or "eager"
    clock: str  # "cuda_events" (device timestamps) or "host_clock"
    regions_ms: dict[str, float]
    marked_ms: float
    step_ms: float
    runs: int

    def as_dict(self, wall_ms_per_step: float | None = None) -> dict[str, Any]:
        """JSON-ready: <region>_ms, marked_ms, step_ms, mode, clock, runs; given the wall time of one
        generate() step, also host_ms = wall - step_ms: the loop's own share (launching the step,
        feeding outputs back, the one host read per step, Python), which never shows inside the step."""
        out: dict[str, Any] = {f"{region}_ms": ms for region, ms in self.regions_ms.items()}
        out.update(marked_ms=self.marked_ms, step_ms=self.step_ms, mode=self.mode, clock=self.clock, runs=self.runs)
        if wall_ms_per_step is not None:
            out["wall_ms_per_step"] = wall_ms_per_step
            out["host_ms"] = wall_ms_per_step - self.step_ms
        return out


def time_calls_ms(fn: Callable[[], Any], calls: int, cuda: bool) -> float:
    """Milliseconds per call of fn over `calls` calls back to back: device time between two events on
    CUDA (nothing waits in between), the host clock on CPU."""
    if cuda:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / calls
    begin = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - begin) * 1e3 / calls


def time_regions(step: StepGraph, runs: int = 20, warmup: int = 3) -> RegionTiming:
    """Time each region of `step`'s compiled graph from inside the step, and the plain step.

    Runs on what step.buffers and the caches hold now (load rows first) and feeds nothing back, so
    every call does the same work. The instrumented sibling is captured on its own, into its own
    pool, and dropped on return; `step` itself is only called.
    """
    starts = region_starts(step.gm)
    marks = Marks(len(starts) + 1, cuda=step.on_cuda)
    timed = step.sibling(instrument(step.gm, marks))
    for _ in range(1 + warmup):  # the first call of each warms up and captures
        step()
        timed()
    step_ms = time_calls_ms(step, runs, step.on_cuda)
    samples: dict[str, list[float]] = {region: [] for region, _ in starts}
    marked = []
    for _ in range(runs):
        timed()
        intervals = marks.intervals_ms()  # waits for this run: the events are reused by the next
        for (region, _), ms in zip(starts, intervals, strict=True):
            samples[region].append(ms)
        marked.append(sum(intervals))
    return RegionTiming(
        mode=timed.mode,
        clock="cuda_events" if step.on_cuda else "host_clock",
        regions_ms={region: statistics.median(values) for region, values in samples.items()},
        marked_ms=statistics.median(marked),
        step_ms=step_ms,
        runs=runs,
    )
