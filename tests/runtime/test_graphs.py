"""StepGraph: the mode recorded per bucket, capture once then replay, piecewise plumbing, counters.

On CPU the capture/replay path runs through HostRecorder (same contract as a CUDA graph: outputs are
garbage until replayed, replay reads only the captured input tensors). Under the gpu marker the same
checks run with real CUDA graphs, plus generate() end to end against the eager runtime.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable

import pytest
import torch

import graphspec
from graphspec.compiled import Compiled
from graphspec.counters import COUNTERS
from graphspec.runtime.buffers import StepBuffers
from graphspec.runtime.graphs import TRITON_COMPILES, HostRecorder, StepGraph, pieces
from graphspec.runtime.requests import SamplingParams
from graphspec.trace import FEEDBACK

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU machines without Triton skip the JIT-hook check
    triton = None

if triton is not None:

    @triton.jit
    def add_one_kernel(x_ptr, n, block: tl.constexpr):
        offsets = tl.program_id(0) * block + tl.arange(0, block)
        mask = offsets < n  # the tail block covers past n
        tl.store(x_ptr + offsets, tl.load(x_ptr + offsets, mask=mask) + 1, mask=mask)


K = 3
MAX_SEQ = {"cpu": 64, "cuda": 128}
CPU_BUCKETS, GPU_BUCKETS = (4,), (1, 4, 8)


@pytest.fixture(scope="module")
def compiled_for(checkpoint_factory) -> Callable[..., Compiled]:
    """(device, capture, lowering) -> a tiny llama pair compiled once per module (both sampling modes)."""
    cache: dict[tuple[str, str, str], Compiled] = {}

    def get(device: str, capture: str = "auto", lowering: str = "auto") -> Compiled:
        if (device, capture, lowering) not in cache:
            cache[(device, capture, lowering)] = graphspec.compile(
                checkpoint_factory("llama", seed=5),
                checkpoint_factory("llama", seed=6, num_hidden_layers=1, hidden_size=32, intermediate_size=64),
                k=K,
                batch_sizes=CPU_BUCKETS if device == "cpu" else GPU_BUCKETS,
                dtype="float32" if device == "cpu" else "bfloat16",
                device=device,
                max_seq_len=MAX_SEQ[device],
                capture=capture,
                lowering=lowering,
            )
        return cache[(device, capture, lowering)]

    return get


def without_capture(compiled: Compiled) -> Compiled:
    """The same graphs and weights with capture="none": the eager reference for replays."""
    return dataclasses.replace(compiled, config=dataclasses.replace(compiled.config, capture="none"))


class Lane:
    """A StepGraph over its own buffers and caches, fed rows and fed back its outputs like the runtime."""

    def __init__(self, compiled: Compiled, mode: str, bucket: int, capture: bool, recorder=None) -> None:
        self.device = compiled.config.device
        self.caches = compiled.new_state()
        self.buffers = StepBuffers.allocate(bucket, self.device)
        gm = compiled.graphs[(mode, bucket)]
        self.graph = StepGraph(gm, compiled.weights(), self.buffers, self.caches, capture, recorder=recorder)

    def load(self, rows: dict[str, torch.Tensor], caches: dict[str, torch.Tensor]) -> None:
        for name, cache in self.caches.items():
            cache.copy_(caches[name])
        self.buffers.load_rows(rows)

    def step(self) -> dict[str, torch.Tensor]:
        outputs = self.graph()
        for name, target in FEEDBACK.items():
            self.buffers.inputs[target].copy_(outputs[name])
        return {name: value.clone() for name, value in outputs.items() if not name.endswith("cache")}


def random_rows(rows: int, vocab: int, seed: int, device: str) -> dict[str, torch.Tensor]:
    """Per-row step inputs of `rows` new requests: lengths leave room for 6 steps of K+1 tokens."""
    max_seq = MAX_SEQ["cuda" if device.startswith("cuda") else device]
    generator = torch.Generator().manual_seed(seed)
    values = {
        "last_tokens": torch.randint(0, vocab, (rows, 2), generator=generator),
        "committed_len": torch.randint(2, max_seq - 6 * (K + 1) - 1, (rows,), generator=generator),
        "slot_ids": torch.randperm(rows, generator=generator),
        "temperature": torch.rand(rows, generator=generator) * 1.5,
        "top_k": torch.randint(0, 20, (rows,), generator=generator),
        "top_p": 0.5 + torch.rand(rows, generator=generator) / 2,
        "seed": torch.randint(0, 2**40, (rows,), generator=generator),
        "step_counter": torch.randint(1, 100, (rows,), generator=generator),
    }
    return {name: value.to(device) for name, value in values.items()}


def random_caches(lane: Lane, seed: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator(device=lane.device).manual_seed(seed)
    return {
        name: torch.randn(cache.shape, generator=generator, device=lane.device).to(cache.dtype)
        for name, cache in lane.caches.items()
    }


def assert_lanes_agree(replayed: Lane, eager: Lane, rows: list[int], rounds: int, steps: int, seed: int) -> int:
    """Run both lanes over `rounds` fresh batches (new rows, new cache contents) of `steps` steps each
    and require bit-identical outputs and cache slots; returns the number of steps compared."""
    vocab = 128
    compared = 0
    for round_index in range(rounds):
        count = rows[round_index % len(rows)]
        new_rows = random_rows(count, vocab, seed + round_index, replayed.device)
        caches = random_caches(eager, seed + round_index)
        replayed.load(new_rows, caches)
        eager.load(new_rows, caches)
        for step in range(steps):
            got, want = replayed.step(), eager.step()
            for name, value in want.items():
                assert torch.equal(got[name], value), f"round {round_index} step {step} {name}:\n{got[name]}\n{value}"
            compared += 1
        slots = list(range(eager.caches["target_cache"].shape[2] - 1))  # the spare slot holds padding junk
        for name, cache in eager.caches.items():
            assert torch.equal(replayed.caches[name][:, :, slots], cache[:, :, slots]), f"round {round_index} {name}"
    return compared


# --------------------------------------------------------------------------------------------------
# CPU: modes, emulated capture/replay, counters
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("capture", "replay", "mode"),
    [("auto", False, "eager"), ("auto", True, "full"), ("piecewise", False, "eager"), ("piecewise", True, "piecewise")],
)
def test_mode_is_recorded_per_bucket(compiled_for, capture: str, replay: bool, mode: str) -> None:
    lane = Lane(compiled_for("cpu", capture), "greedy", 4, replay, HostRecorder if replay else None)
    assert lane.graph.mode == mode
    assert lane.graph.describe()["mode"] == mode
    assert lane.graph.describe()["bucket"] == 4


def test_runtime_on_cpu_runs_every_bucket_eagerly(compiled_for) -> None:
    runtime = graphspec.Runtime(compiled_for("cpu"))
    assert {graph.mode for graph in runtime.graphs.values()} == {"eager"}


def test_capture_without_cuda_or_a_recorder_is_refused(compiled_for) -> None:
    with pytest.raises(ValueError, match="CUDA-graph capture needs CUDA tensors"):
        Lane(compiled_for("cpu"), "greedy", 4, capture=True)


@pytest.mark.parametrize("capture", ["auto", "piecewise"])
@pytest.mark.parametrize("mode", ["greedy", "sample"])
def test_emulated_replay_matches_eager_over_changing_rows(compiled_for, capture: str, mode: str) -> None:
    compiled = compiled_for("cpu", capture)
    replayed = Lane(compiled, mode, 4, capture=True, recorder=HostRecorder)
    eager = Lane(compiled, mode, 4, capture=False)
    assert assert_lanes_agree(replayed, eager, rows=[3, 1], rounds=2, steps=3, seed=10) == 6


def test_full_capture_happens_once_then_every_step_replays(compiled_for) -> None:
    lane = Lane(compiled_for("cpu"), "greedy", 4, capture=True, recorder=HostRecorder)
    lane.load(random_rows(2, 128, 0, "cpu"), random_caches(lane, 0))
    COUNTERS.reset()
    for _ in range(4):
        lane.step()
    COUNTERS.expect(captures=1, replays=4, eager_steps=0)
    assert lane.graph.describe()["graphs"] == 1


def test_piecewise_captures_each_non_attention_piece_once(compiled_for) -> None:
    compiled = compiled_for("cpu", "piecewise")
    lane = Lane(compiled, "greedy", 4, capture=True, recorder=HostRecorder)
    split = pieces(compiled.graphs[("greedy", 4)])
    captured = sum(not eager for _, eager in split)
    attention_calls = K * compiled.drafter.model.spec.num_layers + compiled.target.model.spec.num_layers
    assert len(split) == 2 * attention_calls + 1 and captured == attention_calls + 1
    lane.load(random_rows(2, 128, 0, "cpu"), random_caches(lane, 0))
    COUNTERS.reset()
    for _ in range(3):
        lane.step()
    COUNTERS.expect(captures=captured, replays=3 * captured, eager_steps=0)
    assert lane.graph.describe() | {"compiles_during_capture": None} == {
        "bucket": 4,
        "mode": "piecewise",
        "pieces": len(split),
        "eager_pieces": attention_calls,
        "graphs": captured,
        "compiles_during_capture": None,
    }


# --------------------------------------------------------------------------------------------------
# GPU: real CUDA graphs
# --------------------------------------------------------------------------------------------------


# On a GPU the step runs the Triton kernels lower_kernels picks ("auto"); "reference" keeps the torch
# reference ops, so capture of every reference op is covered too.
LOWERINGS = ("auto", "reference")


@pytest.mark.gpu
@pytest.mark.parametrize("lowering", LOWERINGS)
@pytest.mark.parametrize("mode", ["greedy", "sample"])
def test_captured_step_matches_eager_step_bitwise(compiled_for, mode: str, lowering: str) -> None:
    compiled = compiled_for("cuda", lowering=lowering)
    for bucket, rows in ((1, [1]), (4, [3, 4, 2]), (8, [5, 8, 1])):
        replayed = Lane(compiled, mode, bucket, capture=True)
        eager = Lane(compiled, mode, bucket, capture=False)
        assert replayed.graph.mode == "full"
        assert assert_lanes_agree(replayed, eager, rows=rows, rounds=3, steps=6, seed=bucket) == 18


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["greedy", "sample"])
def test_piecewise_capture_replays_like_eager(compiled_for, mode: str) -> None:
    compiled = compiled_for("cuda", "piecewise")
    COUNTERS.reset()
    replayed = Lane(compiled, mode, 8, capture=True)
    eager = Lane(compiled, mode, 8, capture=False)
    assert replayed.graph.mode == "piecewise"
    assert assert_lanes_agree(replayed, eager, rows=[5, 8, 3], rounds=3, steps=6, seed=3) == 18
    captured = sum(not eager for _, eager in pieces(compiled.graphs[(mode, 8)]))
    COUNTERS.expect(captures=captured, replays=18 * captured, eager_steps=18)


@pytest.mark.gpu
def test_piecewise_and_full_capture_generate_the_same_tokens(compiled_for) -> None:
    full = graphspec.Runtime(compiled_for("cuda"))
    piecewise = graphspec.Runtime(compiled_for("cuda", "piecewise"))
    assert {g.mode for g in piecewise.graphs.values()} == {"piecewise"}
    prompts = [[random.Random(row).randrange(128) for _ in range(5 + row)] for row in range(5)]
    want = [r.token_ids for r in full.generate(prompts, max_new_tokens=40, stop_token_ids=())]
    got = [r.token_ids for r in piecewise.generate(prompts, max_new_tokens=40, stop_token_ids=())]
    assert got == want


@pytest.mark.gpu
@pytest.mark.parametrize("lowering", LOWERINGS)
@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_captured_generate_matches_eager_generate_at_batch_1_3_5_8(
    compiled_for, temperature: float, lowering: str
) -> None:
    compiled = compiled_for("cuda", lowering=lowering)
    captured, eager = graphspec.Runtime(compiled), graphspec.Runtime(without_capture(compiled))
    COUNTERS.reset()
    rng = random.Random(0)
    for round_index in range(3):  # new prompts every round: rows land in different slots and lengths
        for batch in (1, 3, 5, 8):
            prompts = [[rng.randrange(128) for _ in range(rng.randrange(2, 30))] for _ in range(batch)]
            options = dict(max_new_tokens=40, temperature=temperature, seed=round_index, stop_token_ids=())
            got = [r.token_ids for r in captured.generate(prompts, **options)]
            want = [r.token_ids for r in eager.generate(prompts, **options)]
            assert got == want, f"round {round_index}, batch {batch}"
    assert {captured.graphs[key].mode for key in captured.graphs if captured.graphs[key].captured} == {"full"}
    # Every step and prefill program was captured when the Runtime was built: none during requests,
    # one replay per captured step, never an eager step there.
    COUNTERS.expect(
        captures=0, replays=captured.stats.graph_steps, eager_steps=eager.stats.graph_steps, prefills=2 * 3 * 4
    )
    assert captured.stats.captures_during_requests == 0 and captured.stats.triton_compiles_during_requests == 0
    assert captured.stats.graph_steps >= 3 * 4 * 40 // (K + 1)


@pytest.mark.gpu
@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_continuous_batching_on_captured_graphs_matches_the_eager_engine(compiled_for, temperature: float) -> None:
    """24 requests of mixed lengths through 8 slots: rows join and leave between replays of captured
    buckets (1, 4, 8) and every request gets the tokens the uncaptured engine gives it."""
    compiled = compiled_for("cuda")
    captured, eager = graphspec.Runtime(compiled), graphspec.Runtime(without_capture(compiled))
    rng = random.Random(7)
    requests = []
    for index in range(24):
        prompt = [rng.randrange(128) for _ in range(rng.randrange(2, 40))]
        params = SamplingParams(max_tokens=rng.randrange(1, 60), temperature=temperature, seed=index, stop_token_ids=())
        requests.append((prompt, params, index))

    def serve(runtime: graphspec.Runtime) -> list[list[int]]:
        return [handle.result().token_ids for handle in runtime.engine.submit_all(requests)]

    assert serve(captured) == serve(eager)
    assert {key[1] for key, graph in captured.graphs.items() if graph.captured} == set(GPU_BUCKETS)


@pytest.mark.gpu
def test_nothing_compiles_after_warm_up(compiled_for) -> None:
    if triton is None:
        pytest.skip("needs Triton")
    assert TRITON_COMPILES.install()
    # The probe itself must see a compile, or a zero below would prove nothing.
    before = TRITON_COMPILES.count
    probe = torch.zeros(100, device="cuda")
    add_one_kernel[(2,)](probe, 100, block=64)
    assert TRITON_COMPILES.count == before + 1 and probe.eq(1).all()

    compiled = compiled_for("cuda")
    lane = Lane(compiled, "greedy", 8, capture=True)
    lane.load(random_rows(6, 128, 1, "cuda"), random_caches(lane, 1))
    lane.step()  # warm-up, capture, first replay
    assert lane.graph.compiles_during_capture == 0
    after_capture = TRITON_COMPILES.count
    for _ in range(20):
        lane.step()
    torch.cuda.synchronize()
    assert TRITON_COMPILES.count == after_capture
