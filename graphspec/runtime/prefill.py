"""Run prompts through the compiled prefill chunk programs (trace_prefill.py), chunk by chunk, into cache slots.

One PrefillProgram per (batch bucket, chunk size): the chunk program bound to static inputs (tokens, next
tokens, start positions, slots, last indices; allocated once), the weights and the step's state (KV
caches, drafter state; shared with the step graphs), run as two parts (prefill_split.py): the target's,
which the first token needs, then the drafter's prefill of the chunk. On CUDA each part is warmed up and
captured as a CUDA graph once (Runtime start-up), then every chunk of every prompt replays them; elsewhere
they run eagerly, on the CPU as a copy with the CPU table's kernels (as a CPU step does). The first token
is sampled and sent to the host before the drafter parts that can wait: every chunk's when they read only
the chunk's inputs (a draft model, n-gram), else the last chunk's.
A prompt of L tokens takes chunks of a bucket's few sizes (trace_prefill.chunk_plan), so a few programs
serve every prompt length and memory stays bounded by the largest chunk.

What stays static across replays: the static inputs, the weights, the state. What is copied per chunk:
the chunk's tokens and per-row positions (device to device, from one upload per group of prompts); out
of it: the logits and hidden state of the rows whose prompt ends in the chunk.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.fx as fx

from graphspec import ops
from graphspec.counters import COUNTERS, timed
from graphspec.drafters.base import Drafter, PrefillEnd
from graphspec.runtime.buffers import pick_bucket
from graphspec.runtime.graphs import (
    TRITON_COMPILES,
    WARM_UP_RUNS,
    CudaGraphRecorder,
    Recorder,
    cpu_table_copy,
    pieces,
)
from graphspec.runtime.node_program import runner
from graphspec.runtime.prefill_split import split_first_token
from graphspec.trace_prefill import FEATURE_OUTPUT, PREFILL_INPUTS, PREFILL_OUTPUTS, chunk_plan, new_prefill_inputs

# Rows of the per-chunk table uploaded once per group of prompts: [chunks, len(ROW_TABLE), bucket].
ROW_TABLE = ("start_pos", "slot_ids", "last_index")


class PrefillProgram:
    """One bucket's chunk program over its static inputs, the weights and the shared state."""

    def __init__(
        self,
        gm: fx.GraphModule,
        chunk: int,
        params: list[torch.Tensor],
        state: dict[str, torch.Tensor],
        bucket: int,
        spare_slot: int,
        capture: bool,
        pool: object | None = None,
        recorder: Callable[[object | None], Recorder] | None = None,
        cpu_draft_dtype: torch.dtype = torch.float32,
    ) -> None:
        self.chunk, self.bucket, self.spare_slot = chunk, bucket, spare_slot
        device = state[next(iter(state))].device
        # On the CPU the program runs its own copy with the CPU table's kernels, as a CPU step does
        # (runtime/graphs.py): prefill attention over each row's visible prefix instead of the whole
        # cache, the projections over packed weights, the small ops as composites of torch ops. A piecewise
        # program keeps its references.
        self.cpu_kernels = 0
        self.packed_weights: list[Any] = []  # the CPU mm kernel's packed weights, alive while this program is
        if device.type == "cpu" and not pieces(gm):
            gm, self.cpu_kernels, self.packed_weights = cpu_table_copy(gm, params, cpu_draft_dtype)
        self.gm = gm
        self.inputs = new_prefill_inputs(bucket, chunk, device)
        names = [node.meta["gs_input"] for node in gm.graph.find_nodes(op="placeholder")][len(params) :]
        if tuple(names[: len(PREFILL_INPUTS)]) != PREFILL_INPUTS:
            raise ValueError(f"prefill graph inputs {names[: len(PREFILL_INPUTS)]} are not {PREFILL_INPUTS}")
        self.args = [*params, *(self.inputs[n] if n in self.inputs else state[n] for n in names)]
        states = tuple(names[len(PREFILL_INPUTS) :])
        # Programs of drafters that read target features also return them at last_index (FEATURE_OUTPUT).
        returned = len(gm.graph.find_nodes(op="output")[0].args[0])
        extra = (FEATURE_OUTPUT,) if returned == len(PREFILL_OUTPUTS) + 1 + len(states) else ()
        self.output_names = PREFILL_OUTPUTS + extra  # what the first token needs (the states follow)
        # Two parts (prefill_split.py): the target's, which the first token needs, and the drafter's,
        # which the caller runs (rest()) once the first token is on its way; one where nothing splits off.
        split = None if pieces(gm) else split_first_token(gm, len(self.output_names))
        self.first_part, self.rest_part = (gm, None) if split is None else (split.first, split.rest)
        # A rest that reads nothing of the first part's (a draft model's, n-gram's prefill) can run after
        # the first token, from a copy of its chunk's inputs; one that reads the target's hidden states
        # (MTP, EAGLE-3, DFlash) runs before the next chunk overwrites them.
        self.rest_reads_inputs_only = split is not None and split.crossing == 0
        self.crossing: tuple[torch.Tensor, ...] = ()  # what the rest reads from the first part's last run
        self.capture = capture
        if capture and recorder is None and device.type != "cuda":
            raise ValueError("CUDA-graph capture needs CUDA tensors; pass recorder=HostRecorder to emulate it")
        self.new_recorder = recorder or CudaGraphRecorder
        self.pool = pool
        self.recorder: Recorder | None = None  # the first part's
        self.rest_recorder: Recorder | None = None
        self.outputs: Any = None
        self.compiles_during_capture: int | None = None
        if capture and device.type == "cuda":
            TRITON_COMPILES.install()

    def park(self) -> None:
        """Point every row at the spare slot, position 0: a run then writes nothing a real row owns."""
        self.inputs["slot_ids"].fill_(self.spare_slot)
        self.inputs["start_pos"].zero_()
        self.inputs["last_index"].zero_()

    @functools.cached_property
    def part_runners(self) -> tuple[Callable[..., Any], Callable[..., Any] | None]:
        """What the warm-up and the capture call for the first part and the rest (node_program.runner)."""
        return runner(self.first_part), None if self.rest_part is None else runner(self.rest_part)

    def warm_up(self) -> None:
        """Run the parts over the parked inputs, as a capture will (Triton JIT, cuBLAS setup): the whole
        program never runs, so a loaded one (built lazily, artifact.decode_graph_module) never generates
        its code, and the parts (lazy too) run through node_program here and in the capture."""
        self.park()
        first, rest = self.part_runners
        with torch.inference_mode():
            for _ in range(WARM_UP_RUNS):
                outputs = first(*self.args)
                if rest is not None:
                    rest(*self.args, *outputs[len(self.output_names) :])

    def warm_up_and_capture(self) -> None:
        """Warm up (warm_up) on a side stream, then capture each part, every row parked; the rest's
        capture reads the first part's captured outputs (static, as its inputs)."""
        self.park()
        if self.inputs["tokens"].is_cuda:
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream), timed("warm_up_runs"):
                self.warm_up()
            torch.cuda.current_stream().wait_stream(stream)
        compiles = TRITON_COMPILES.count
        recorder = self.new_recorder(self.pool)
        first, rest = self.part_runners
        with torch.inference_mode():
            self.outputs = recorder.capture(first, self.args)
            if rest is not None:
                rest_recorder = self.new_recorder(self.pool)
                rest_recorder.capture(rest, [*self.args, *self.outputs[len(self.output_names) :]])
                self.rest_recorder = rest_recorder
                COUNTERS.captures += 1
        self.recorder = recorder
        COUNTERS.captures += 1
        self.compiles_during_capture = TRITON_COMPILES.count - compiles

    def __call__(self) -> dict[str, torch.Tensor]:
        """The first part of one chunk over what the static inputs hold now: the outputs the first token
        needs, valid until the next call. rest() must follow before the next call."""
        if not self.capture:
            with torch.inference_mode():
                outputs = self.first_part(*self.args)
            self.crossing = tuple(outputs[len(self.output_names) :]) if self.rest_part is not None else ()
        else:
            if self.recorder is None:
                self.warm_up_and_capture()
            self.recorder.replay()
            outputs = self.outputs
        COUNTERS.prefill_chunks += 1
        return dict(zip(self.output_names, outputs[: len(self.output_names)], strict=True))

    def chunk_inputs(self) -> dict[str, torch.Tensor]:
        """A copy of the static inputs (the chunk the last call ran), for a later rest()."""
        return {name: tensor.clone() for name, tensor in self.inputs.items()}

    def rest(self, chunk_inputs: dict[str, torch.Tensor] | None = None) -> None:
        """The rest of the chunk the last call ran (the drafter's prefill of it), or of the chunk whose
        chunk_inputs() are given (only when rest_reads_inputs_only)."""
        if self.rest_part is None:
            return
        if chunk_inputs is not None:
            assert self.rest_reads_inputs_only, "this rest reads the first part's outputs of its own chunk"
            for name, tensor in chunk_inputs.items():
                self.inputs[name].copy_(tensor)
        if not self.capture:
            with torch.inference_mode():
                self.rest_part(*self.args, *self.crossing)
            self.crossing = ()
        else:
            self.rest_recorder.replay()


class Prefiller:
    """Prefill prompts into given cache slots with the per-(bucket, chunk size) chunk programs."""

    def __init__(
        self, programs: dict[tuple[int, int], PrefillProgram], drafter: Drafter, state: dict[str, torch.Tensor]
    ) -> None:
        self.programs = programs
        self.buckets = tuple(sorted({bucket for bucket, _ in programs}))
        self.drafter = drafter
        self.state = state  # the programs' (and the step graphs') shared state

    @torch.inference_mode()
    def __call__(
        self, prompts: Sequence[Sequence[int]], slot_ids: Sequence[int], row_params: dict[str, torch.Tensor]
    ) -> torch.Tensor:
        """The target's first token per prompt ([rows] int64, on the host); the slots' target cache
        and drafter state are filled for the first step (on a GPU, still being filled when this returns:
        the drafter's parts that can wait run after the first token has left for the host, and work
        queued later follows them). At most the largest bucket's rows (the
        cache has no more slots than that). All rows advance together, chunk by chunk (chunk_plan
        over the longest prompt); a row whose prompt has ended is parked on the spare slot."""
        rows = len(prompts)
        bucket = pick_bucket(rows, self.buckets)
        sizes = tuple(sorted((chunk for b, chunk in self.programs if b == bucket), reverse=True))
        some = self.programs[(bucket, sizes[0])]
        device, spare = some.inputs["tokens"].device, some.spare_slot
        lengths = [len(prompt) for prompt in prompts]
        plan = chunk_plan(max(lengths), sizes)
        starts = [sum(plan[:index]) for index in range(len(plan))]
        # Every chunk's tokens in one upload, one column more for next_tokens; zeros past each prompt.
        tokens = torch.zeros((bucket, sum(plan) + 1), dtype=torch.int64)
        for row, prompt in enumerate(prompts):
            tokens[row, : len(prompt)] = torch.as_tensor(prompt, dtype=torch.int64)
        # Per chunk and row: start position, slot, and the index of the row's last prompt token in the
        # chunk (a "snapshot" state, linear attention, stops there); rows whose prompt ended before the
        # chunk (and bucket padding) are parked.
        table = torch.zeros((len(plan), len(ROW_TABLE), bucket), dtype=torch.int64)
        table[:, 1] = spare
        ending: list[list[int]] = [[] for _ in plan]  # rows whose prompt ends in each chunk
        for index, (start, size) in enumerate(zip(starts, plan, strict=True)):
            for row, length in enumerate(lengths):
                if length > start:  # last_index: the row's last prompt position in the chunk
                    table[index, :, row] = torch.tensor([start, slot_ids[row], min(length - start, size) - 1])
                if start < length <= start + size:
                    ending[index].append(row)
        # Everything the device needs is uploaded before any chunk is queued: a copy from pageable memory
        # waits for the work queued before it, and one after the last chunk's first part would hold the
        # first token back until the drafter's part had run.
        tokens, table = tokens.to(device), table.to(device)
        done_rows = torch.tensor([row for rows in ending for row in rows], device=device).split(
            [len(rows) for rows in ending]
        )
        slots, prompt_lengths = torch.tensor([list(slot_ids), lengths], device=device)
        logits = hidden = features = None
        last = len(plan) - 1
        # Drafter parts that run after the first token has left, in chunk order (a draft model's chunk
        # attends to the draft KV its earlier chunks wrote): every chunk's where they read only the
        # chunk's inputs, else the last chunk's.
        later: list[tuple[PrefillProgram, dict[str, torch.Tensor] | None]] = []
        for index, (start, size) in enumerate(zip(starts, plan, strict=True)):
            program = self.programs[(bucket, size)]
            inputs = program.inputs
            inputs["tokens"].copy_(tokens[:, start : start + size])
            inputs["next_tokens"].copy_(tokens[:, start + 1 : start + size + 1])
            for position, name in enumerate(ROW_TABLE):
                inputs[name].copy_(table[index, position])
            outputs = program()
            if logits is None:
                logits = outputs["last_logits"].new_empty((rows, outputs["last_logits"].shape[1]))
                hidden = outputs["last_hidden"].new_empty((rows, outputs["last_hidden"].shape[1]))
                if FEATURE_OUTPUT in outputs:
                    features = outputs[FEATURE_OUTPUT].new_empty((rows, outputs[FEATURE_OUTPUT].shape[1]))
            if ending[index]:
                done = done_rows[index]
                logits[done] = outputs["last_logits"][done]
                hidden[done] = outputs["last_hidden"][done]
                if features is not None:
                    features[done] = outputs[FEATURE_OUTPUT][done]
            if program.rest_reads_inputs_only:
                later.append((program, program.chunk_inputs()))
            elif index < last:
                program.rest()
            else:
                later.append((program, None))
        first = ops.sample(
            logits,
            row_params["temperature"],
            row_params["top_k"],
            row_params["top_p"],
            row_params["seed"],
            row_params["step_counter"],
            0,
        )
        # The first token leaves for the host before the drafter parts in `later` are queued, so the host
        # has it while the device still runs them (and prefill_finish).
        on_host, copied = first, None
        if first.is_cuda:
            on_host = torch.empty(first.shape, dtype=first.dtype, pin_memory=True)
            on_host.copy_(first, non_blocking=True)
            copied = torch.cuda.Event()
            copied.record()
        for program, chunk_inputs in later:
            program.rest(chunk_inputs)
        end = PrefillEnd(slots, prompt_lengths, first, hidden, features)
        self.drafter.prefill_finish(end, self.state)
        if copied is not None:
            copied.synchronize()
        COUNTERS.prefills += 1
        return on_host
