"""Known replay traps, one test each: padded rows must not leak into real rows or real cache slots,
a stopped row must keep its state, and warm-up/capture must touch nothing but the spare slot.

Each runs a compiled bucket-4 step of a tiny pair three ways: eager and through the emulated
capture/replay path on CPU (HostRecorder), and as real CUDA graphs under the gpu marker.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

import graphspec
from graphspec.compiled import Compiled
from graphspec.runtime.buffers import StepBuffers
from graphspec.runtime.graphs import HostRecorder, StepGraph

BUCKET, K, MAX_SEQ = 4, 2, 64
MODES = ("greedy", "sample")
# (device, capture, recorder): eager and emulated replay on CPU, real CUDA graphs on a GPU.
RUNNERS = [
    pytest.param("cpu", False, None, id="cpu-eager"),
    pytest.param("cpu", True, HostRecorder, id="cpu-replay"),
    pytest.param("cuda", True, None, id="cuda-graph", marks=pytest.mark.gpu),
]
# Real rows 0 and 1 own slots 0 and 1; the bucket's padding rows are 2 and 3.
REAL_ROWS = {
    "last_tokens": [[17, 42], [99, 5]],
    "committed_len": [9, 21],
    "slot_ids": [0, 1],
    "temperature": [0.7, 1.1],
    "top_k": [0, 5],
    "top_p": [1.0, 0.9],
    "seed": [11, 12],
    "step_counter": [3, 4],
}
DTYPES = {"temperature": torch.float32, "top_p": torch.float32}


@pytest.fixture(scope="module")
def compiled_for(checkpoint_factory) -> Callable[[str], Compiled]:
    cache: dict[str, Compiled] = {}

    def get(device: str) -> Compiled:
        if device not in cache:
            cache[device] = graphspec.compile(
                checkpoint_factory("llama", seed=3),
                checkpoint_factory("llama", seed=4, num_hidden_layers=1),
                k=K,
                batch_sizes=(BUCKET,),
                dtype="float32",
                device=device,
                max_seq_len=MAX_SEQ,
            )
        return cache[device]

    return get


class Bucket:
    """One bucket's StepGraph over caches reset to the same random contents before every run."""

    def __init__(self, compiled: Compiled, mode: str, device: str, capture: bool, recorder) -> None:
        generator = torch.Generator(device=device).manual_seed(0)
        self.device = device
        self.vocab = compiled.target.model.spec.vocab_size
        self.spare = compiled.slots - 1
        self.initial = {
            name: torch.randn(state.shape, generator=generator, device=device)
            for name, state in compiled.new_state().items()
        }
        self.caches = {name: cache.clone() for name, cache in self.initial.items()}
        self.buffers = StepBuffers.allocate(BUCKET, device)
        self.graph = StepGraph(
            compiled.graphs[(mode, BUCKET)], compiled.weights(), self.buffers, self.caches, capture, recorder=recorder
        )
        self.clean_padding = {name: value[2:].clone() for name, value in self.buffers.inputs.items()}

    def rows(self, valid: list[bool], padding: dict[str, list] | None = None) -> dict[str, torch.Tensor]:
        """All BUCKET rows: REAL_ROWS in rows 0-1, then `padding` (default: the clean allocation)."""
        rows = {"row_valid": torch.tensor(valid, device=self.device)}
        for name, real in REAL_ROWS.items():
            real = torch.tensor(real, dtype=DTYPES.get(name, torch.int64), device=self.device)
            pad = self.clean_padding[name] if padding is None else torch.tensor(padding[name]).to(real)
            rows[name] = torch.cat((real, pad))
        return rows

    def run(self, rows: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        for name, cache in self.caches.items():
            cache.copy_(self.initial[name])  # in place: a captured graph holds these addresses
        for name, value in rows.items():
            self.buffers.inputs[name].copy_(value)
        outputs = self.graph()
        return (
            {name: value.clone() for name, value in outputs.items() if not name.endswith("cache")},
            {name: cache.clone() for name, cache in self.caches.items()},
        )


@pytest.fixture
def bucket(compiled_for) -> Callable[..., Bucket]:
    def make(mode: str, device: str, capture: bool, recorder) -> Bucket:
        return Bucket(compiled_for(device), mode, device, capture, recorder)

    return make


def garbage_padding(vocab: int, real_slots: list[int]) -> dict[str, list]:
    """Padding rows as a careless host might leave them: ids at the vocab edge, lengths at the end of
    the cache, slots pointing at real rows, NaN/absurd sampling parameters, huge step counters."""
    return {
        "last_tokens": [[vocab - 1, vocab - 1]] * 2,
        "committed_len": [MAX_SEQ - 1] * 2,
        "slot_ids": real_slots[::-1],
        "temperature": [float("nan"), 1e9],
        "top_k": [-3, vocab + 5],
        "top_p": [3.0, -1.0],
        "seed": [-1, 2**62],
        "step_counter": [2**62, 2**61],
    }


def assert_rows_equal(got: dict, want: dict, rows: list[int]) -> None:
    for name, value in want.items():
        assert torch.equal(got[name][rows], value[rows]), f"{name} rows {rows}: {got[name][rows]} != {value[rows]}"


def assert_slots_equal(got: dict, want: dict, slots: list[int]) -> None:
    for name, cache in want.items():
        for slot in slots:
            assert torch.equal(got[name][:, :, slot], cache[:, :, slot]), f"{name} slot {slot} differs"


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(("device", "capture", "recorder"), RUNNERS)
def test_garbage_in_padded_rows_changes_no_real_output_or_cache_slot(bucket, mode, device, capture, recorder) -> None:
    step = bucket(mode, device, capture, recorder)
    valid = [True, True, False, False]
    clean_outputs, clean_caches = step.run(step.rows(valid))
    dirty_outputs, dirty_caches = step.run(step.rows(valid, garbage_padding(step.vocab, [0, 1])))
    assert_rows_equal(dirty_outputs, clean_outputs, [0, 1])
    assert_slots_equal(dirty_caches, clean_caches, [0, 1])
    # Slots no real row owns, the spare aside, are exactly as they were before either step.
    assert_slots_equal(dirty_caches, step.initial, [s for s in range(step.spare) if s not in (0, 1)])
    # And the step did run: real rows moved on.
    assert (dirty_outputs["next_committed_len"][:2] > torch.tensor([9, 21], device=device)).all()


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(("device", "capture", "recorder"), RUNNERS)
def test_real_rows_match_a_solo_run_in_the_same_bucket(bucket, mode, device, capture, recorder) -> None:
    step = bucket(mode, device, capture, recorder)
    together_outputs, together_caches = step.run(step.rows([True, True, False, False]))
    for row in (0, 1):
        alone = [r == row for r in range(BUCKET)]
        solo_outputs, solo_caches = step.run(step.rows(alone))
        assert_rows_equal(solo_outputs, together_outputs, [row])
        assert_slots_equal(solo_caches, together_caches, [row])


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(("device", "capture", "recorder"), RUNNERS)
def test_stopped_row_keeps_its_state_and_its_cache_slot(bucket, mode, device, capture, recorder) -> None:
    step = bucket(mode, device, capture, recorder)
    rows = step.rows([True, False, False, False])  # row 1 stopped: real state, slot 1, not valid
    outputs, caches = step.run(rows)
    assert (outputs["tokens"][1] == -1).all()
    assert outputs["num_accepted"][1].item() == 0
    assert outputs["next_committed_len"][1].item() == REAL_ROWS["committed_len"][1]
    assert outputs["next_last_tokens"][1].tolist() == REAL_ROWS["last_tokens"][1]
    assert outputs["next_step_counter"][1].item() == REAL_ROWS["step_counter"][1]
    assert_slots_equal(caches, step.initial, [1])
    assert outputs["next_committed_len"][0].item() > REAL_ROWS["committed_len"][0]


@pytest.mark.parametrize(
    ("device", "recorder"), [("cpu", HostRecorder), pytest.param("cuda", None, marks=pytest.mark.gpu)]
)
def test_warm_up_and_capture_write_only_the_spare_slot_and_restore_row_valid(bucket, device, recorder) -> None:
    step = bucket("greedy", device, True, recorder)
    rows = step.rows([True, True, False, False])
    for name, value in rows.items():
        step.buffers.inputs[name].copy_(value)
    step.graph.warm_up_and_capture()
    assert step.graph.captured
    assert_slots_equal(step.caches, step.initial, list(range(step.spare)))
    assert torch.equal(step.buffers.inputs["row_valid"], rows["row_valid"])
