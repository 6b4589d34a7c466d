"""Region tags and region timing: every op of a compiled step is in one region (draft, verify,
accept, in that order), and a step instrumented with marks at the region boundaries computes exactly
what the plain step computes, while its regions add up to the step's time.

On CPU the marks read the host clock, eagerly or through HostRecorder (the CUDA-graph contract);
under the gpu marker they are CUDA events recorded inside the captured graph.
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Callable

import pytest
import torch
import torch.fx as fx

import graphspec
from graphspec import checks, trace
from graphspec.compiled import Compiled
from graphspec.runtime import region_timing
from graphspec.runtime.buffers import StepBuffers
from graphspec.runtime.graphs import HostRecorder, StepGraph
from graphspec.runtime.region_timing import Marks, instrument, region_starts, time_regions
from graphspec.trace import FEEDBACK

K = 3
MAX_SEQ = 64


@pytest.fixture(scope="module")
def compiled_for(checkpoint_factory) -> Callable[..., Compiled]:
    """(device, capture) -> a tiny llama pair compiled once per module, both sampling modes, bucket 4."""
    cache: dict[tuple[str, str], Compiled] = {}

    def get(device: str, capture: str = "auto") -> Compiled:
        if (device, capture) not in cache:
            cache[(device, capture)] = graphspec.compile(
                checkpoint_factory("llama", seed=5),
                checkpoint_factory("llama", seed=6, num_hidden_layers=1, hidden_size=32, intermediate_size=64),
                k=K,
                batch_sizes=(4,),
                dtype="float32" if device == "cpu" else "bfloat16",
                device=device,
                max_seq_len=MAX_SEQ,
                capture=capture,
            )
        return cache[(device, capture)]

    return get


def bind(compiled: Compiled, gm: fx.GraphModule, capture: bool, recorder=None) -> StepGraph:
    """A StepGraph of `gm` over its own buffers and caches (zeroed), bucket 4."""
    device = compiled.config.device
    return StepGraph(
        gm, compiled.weights(), StepBuffers.allocate(4, device), compiled.new_state(), capture, recorder=recorder
    )


def load(step: StepGraph, seed: int) -> None:
    """Three real rows and random caches, the same for every StepGraph given the same seed."""
    generator = torch.Generator().manual_seed(seed)
    device = step.buffers.inputs["slot_ids"].device
    for cache in step.state.values():
        cache.copy_(torch.randn(cache.shape, generator=generator).to(cache.dtype))
    rows = {
        "last_tokens": torch.randint(0, 128, (3, 2), generator=generator),
        "committed_len": torch.tensor([5, 20, 33]),
        "slot_ids": torch.tensor([2, 0, 1]),
        "temperature": torch.tensor([0.0, 0.7, 1.2]),
        "top_k": torch.tensor([0, 5, 0]),
        "top_p": torch.tensor([1.0, 1.0, 0.8]),
        "seed": torch.tensor([3, 4, 5]),
        "step_counter": torch.tensor([1, 7, 2]),
    }
    step.buffers.load_rows({name: value.to(device) for name, value in rows.items()})


def run_steps(step: StepGraph, steps: int) -> list[dict[str, torch.Tensor]]:
    """`steps` steps fed back like the runtime does; the outputs of each, and the caches at the end."""
    results = []
    for _ in range(steps):
        outputs = step()
        for name, target in FEEDBACK.items():
            step.buffers.inputs[target].copy_(outputs[name])
        results.append({name: value.clone() for name, value in outputs.items() if not name.endswith("cache")})
    results.append({name: cache.clone() for name, cache in step.state.items()})
    return results


def assert_same_steps(got: list[dict[str, torch.Tensor]], want: list[dict[str, torch.Tensor]]) -> None:
    assert len(got) == len(want)
    for index, (g, w) in enumerate(zip(got, want, strict=True)):
        for name, value in w.items():
            assert torch.equal(g[name], value), f"step {index}: {name} differs"


# --------------------------------------------------------------------------------------------------
# Region tags
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["greedy", "sample"])
def test_tracing_tags_every_op_draft_or_verify_in_that_order(step_case, mode: str) -> None:
    gm = step_case.traced(mode)
    regions = [node.meta.get("gs_region") for node in gm.graph.nodes if node.op == "call_function"]
    assert None not in regions
    first_verify = regions.index("verify")
    assert set(regions[:first_verify]) == {"draft"} and set(regions[first_verify:]) == {"verify"}
    # The tags are all that tracing adds to the meta: no torch annotation keys are left behind.
    assert not any({"custom", "seq_nr", "original_aten"} & set(node.meta) for node in gm.graph.nodes)


@pytest.mark.parametrize("capture", ["auto", "piecewise"])
@pytest.mark.parametrize("mode", ["greedy", "sample"])
def test_every_compiled_op_has_a_region_and_regions_run_in_order(compiled_for, mode: str, capture: str) -> None:
    gm = compiled_for("cpu", capture).graphs[(mode, 4)]
    checks.regions_run_in_order(gm)  # the pipeline runs it too, under GRAPHSPEC_CHECK=1
    ops = checks.step_ops(gm)
    verify_op = next(node for node in ops if "verify" in str(node.target))
    assert verify_op.meta["gs_region"] == "accept"
    # Each layer's cache write, fused with its rotary (fuse_rotary_kv) and then its attention (fuse_kv_attention).
    kv_writes = [node for node in ops if node.target == torch.ops.graphspec.rotary_kv_attention.default]
    draft_layers = compiled_for("cpu").drafter.model.spec.num_layers
    assert [node.meta["gs_region"] for node in kv_writes].count("draft") == K * draft_layers


def test_the_region_check_rejects_interleaved_and_untagged_ops() -> None:
    graph = fx.Graph()
    x = graph.placeholder("x")
    nodes = [graph.call_function(operator.neg, (x,)) for _ in range(4)]
    graph.output(nodes[-1])
    gm = fx.GraphModule(torch.nn.Module(), graph)
    for node, region in zip(nodes, ["draft", "verify", "draft", "accept"], strict=True):
        node.meta["gs_region"] = region
    with pytest.raises(AssertionError, match="regions run as"):
        checks.regions_run_in_order(gm)
    with pytest.raises(ValueError, match="runs twice"):
        region_starts(gm)
    del nodes[2].meta["gs_region"]
    with pytest.raises(AssertionError, match="without a region"):
        checks.regions_run_in_order(gm)
    with pytest.raises(ValueError, match="has no region"):
        region_starts(gm)


# --------------------------------------------------------------------------------------------------
# Instrumentation and timing (CPU: host clock)
# --------------------------------------------------------------------------------------------------


def test_instrument_marks_each_region_start_and_the_end_and_leaves_the_step_alone(compiled_for) -> None:
    gm = compiled_for("cpu").graphs[("greedy", 4)]
    code = gm.code
    marks = Marks(len(trace.REGIONS) + 1, cuda=False)
    copy = instrument(gm, marks)
    assert gm.code == code
    nodes = list(copy.graph.nodes)
    mark_at = [i for i, node in enumerate(nodes) if node.op == "call_function" and node.target == marks.mark]
    assert [nodes[i].args for i in mark_at] == [(0,), (1,), (2,), (3,)]
    for index, region in enumerate(trace.REGIONS):
        assert nodes[mark_at[index] + 1].meta["gs_region"] == region
        assert nodes[mark_at[index] - 1].meta.get("gs_region") != region
    assert nodes[mark_at[-1] + 1].op == "output"


@pytest.mark.parametrize("recorder", [None, HostRecorder], ids=["eager", "host-recorder"])
@pytest.mark.parametrize("mode", ["greedy", "sample"])
def test_instrumented_step_computes_exactly_the_plain_step(compiled_for, mode: str, recorder) -> None:
    compiled = compiled_for("cpu")
    gm = compiled.graphs[(mode, 4)]
    marks = Marks(len(trace.REGIONS) + 1, cuda=False)
    plain = bind(compiled, gm, capture=recorder is not None, recorder=recorder)
    timed = bind(compiled, instrument(gm, marks), capture=recorder is not None, recorder=recorder)
    load(plain, seed=1)
    load(timed, seed=1)
    assert_same_steps(run_steps(timed, 4), run_steps(plain, 4))
    assert all(ms >= 0 for ms in marks.intervals_ms())


def test_region_times_add_up_to_the_marked_step(compiled_for, monkeypatch) -> None:
    """With a clock that advances one millisecond per reading, every interval between two marks is 1 ms:
    the regions and the marked step are exact counts, not wall-clock measurements a busy machine skews."""
    readings = itertools.count()
    monkeypatch.setattr(region_timing.time, "perf_counter", lambda: next(readings) * 1e-3)
    compiled = compiled_for("cpu")
    step = bind(compiled, compiled.graphs[("greedy", 4)], capture=False)
    load(step, seed=2)
    timing = time_regions(step, runs=5, warmup=1)
    assert (timing.mode, timing.clock, timing.runs) == ("eager", "host_clock", 5)
    assert tuple(timing.regions_ms) == trace.REGIONS
    assert all(ms == pytest.approx(1.0) for ms in timing.regions_ms.values())
    assert sum(timing.regions_ms.values()) == pytest.approx(timing.marked_ms)
    numbers = timing.as_dict(wall_ms_per_step=timing.step_ms + 1.0)
    assert numbers["host_ms"] == pytest.approx(1.0)
    assert {"draft_ms", "verify_ms", "accept_ms", "step_ms", "mode"} <= set(numbers)


def test_time_regions_leaves_the_step_as_it_was(compiled_for) -> None:
    """The plain StepGraph keeps its graph and capture; its next call still replays its own graph."""
    compiled = compiled_for("cpu")
    gm = compiled.graphs[("greedy", 4)]
    step = bind(compiled, gm, capture=True, recorder=HostRecorder)
    load(step, seed=3)
    time_regions(step, runs=2, warmup=0)
    assert step.gm is gm and len(step.recorders) == 1


def test_region_timing_refuses_a_piecewise_step(compiled_for) -> None:
    compiled = compiled_for("cpu", "piecewise")
    step = bind(compiled, compiled.graphs[("greedy", 4)], capture=True, recorder=HostRecorder)
    with pytest.raises(ValueError, match="flat step graph"):
        time_regions(step, runs=1)


# --------------------------------------------------------------------------------------------------
# GPU: CUDA events recorded inside the captured graph
# --------------------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["greedy", "sample"])
def test_captured_instrumented_step_matches_the_plain_captured_step(compiled_for, mode: str) -> None:
    compiled = compiled_for("cuda")
    gm = compiled.graphs[(mode, 4)]
    marks = Marks(len(trace.REGIONS) + 1, cuda=True)
    plain = bind(compiled, gm, capture=True)
    timed = bind(compiled, instrument(gm, marks), capture=True)
    load(plain, seed=1)
    load(timed, seed=1)
    assert_same_steps(run_steps(timed, 6), run_steps(plain, 6))
    assert timed.mode == plain.mode == "full" and timed.captured
    assert all(ms > 0 for ms in marks.intervals_ms())  # the events ran inside the replays


@pytest.mark.gpu
def test_captured_region_times_come_from_cuda_events_for_every_region(compiled_for) -> None:
    # How the medians relate to the plain step's time is a benchmark's to report (a busy GPU moves them
    # apart); the arithmetic of adding regions up is checked on a fake clock above.
    compiled = compiled_for("cuda")
    step = bind(compiled, compiled.graphs[("greedy", 4)], capture=True)
    load(step, seed=2)
    timing = time_regions(step, runs=30, warmup=3)
    assert (timing.mode, timing.clock) == ("full", "cuda_events")
    assert tuple(timing.regions_ms) == trace.REGIONS
    assert all(ms > 0 for ms in timing.regions_ms.values())
    assert timing.marked_ms > 0 and timing.step_ms > 0
