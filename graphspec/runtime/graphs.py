"""Run one compiled step per (mode, bucket): eagerly, or as CUDA graphs captured on the first call.

StepGraph.mode records what a bucket runs as:
- "full": the whole step is one CUDA graph (the default; every graphspec op is static-shape and
  host-sync free, so capture="auto" and "full" both end here).
- "piecewise": split_attention cut the graph (capture="piecewise"); every non-attention piece is its
  own CUDA graph and the attention pieces run eagerly between them.
- "eager": nothing is captured (CPU, or capture="none").

On the CPU a flat step (eager, or captured through HostRecorder) runs a copy of the graph with the
CPU table's kernels in place of the reference ops (lowering/lower_kernels.py lower_for_cpu: attention
over each row's visible prefix, the projections over weights packed once for oneDNN (pack_mm_weights,
kernels/mm_cpu.py), the small ops as composites of torch ops). With compile_cpu=True an eager CPU step
runs that copy through torch.compile (Inductor): elementwise ops and views fuse into a few C++ kernels
around the GEMMs and the opaque attention ops; it compiles at start-up (Runtime.warm_up) or on its first
call (Inductor's cache on disk makes later processes quicker) and gives the same tokens.

What stays static across replays: the weights, the bucket's StepBuffers and the KV caches (the
graph's placeholders: captured against their addresses and never copied), the outputs of every
captured graph (referenced for the StepGraph's lifetime, so no later capture into the shared memory
pool can place its buffers on them), and, in piecewise mode, one static input buffer per activation
that an eager piece hands to a captured one.
What is copied each step: the runtime writes the next step's per-row values into StepBuffers
(device to device) before calling the step; in piecewise mode each eager attention output is copied
into its static buffer right before the next captured piece replays.
"""

from __future__ import annotations

import copy
import logging
import operator
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Protocol

import torch
import torch.fx as fx
from torch.utils._pytree import tree_flatten

from graphspec import trace
from graphspec.counters import COUNTERS, timed
from graphspec.input_names import is_draft_weight
from graphspec.lowering import lower_kernels
from graphspec.op_nodes import is_attention
from graphspec.runtime.buffers import StepBuffers
from graphspec.runtime.node_program import runner, with_code
from graphspec.triton_binaries import RECORDER as TRITON_KERNELS

# Eager runs of a program on a side stream before its capture: the first loads every Triton kernel and
# sets up cuBLAS's handles and workspaces, so the capture records launches only; a capture that did
# compile anyway is logged (compiles_during_capture). A second run, as there used to be, cost about a
# second of an 8B artifact's start-up with 14 programs (docs/BENCHMARKS.md, cold start, ff7d22e).
WARM_UP_RUNS = 1

log = logging.getLogger("graphspec")

MODES = ("full", "piecewise", "eager")


# --------------------------------------------------------------------------------------------------
# Recorders: something that captures a callable once and replays it into the same output tensors.
# --------------------------------------------------------------------------------------------------


class Recorder(Protocol):
    def capture(self, module: Callable[..., Any], inputs: Sequence[torch.Tensor]) -> Any:
        """Record module(*inputs) and return its outputs; their contents are undefined until replay()."""

    def replay(self) -> None:
        """Recompute the recorded work from what the captured input tensors hold now."""


class CudaGraphRecorder:
    """One torch.cuda.CUDAGraph captured into `pool`. Capture only records kernels, it runs nothing.

    The capture ends without instantiating the graph (keep_graph), so that recording and instantiating
    are timed apart (counters.PHASE_SECONDS; on an H200, an 8B/1B artifact's 22 captures recorded in
    0.8 s and instantiated in 0.05 s, after 1.8 s of eager warm-up runs: docs/BENCHMARKS.md)."""

    def __init__(self, pool: object | None) -> None:
        self.graph = torch.cuda.CUDAGraph(keep_graph=True)
        self.pool = pool

    def capture(self, module: Callable[..., Any], inputs: Sequence[torch.Tensor]) -> Any:
        with timed("record"), torch.cuda.graph(self.graph, pool=self.pool):
            outputs = module(*inputs)
        with timed("instantiate"):
            self.graph.instantiate()
        return outputs

    def replay(self) -> None:
        self.graph.replay()


class HostRecorder:
    """CPU stand-in with the CUDA-graph contract, so CPU tests exercise capture/replay plumbing.

    capture() returns outputs poisoned (NaN, huge ints) as a CUDA capture leaves them, and replay()
    recomputes from the captured input tensors and copies into exactly those output tensors: a step
    that reads an output before its first replay, or feeds a piece anything but its static inputs,
    computes something different from the eager step and fails the comparison tests.
    """

    def __init__(self, pool: object | None = None) -> None:
        self.module: Callable[..., Any] | None = None
        self.inputs: Sequence[torch.Tensor] = ()
        self.outputs: list[torch.Tensor | None] = []

    def capture(self, module: Callable[..., Any], inputs: Sequence[torch.Tensor]) -> Any:
        self.module, self.inputs = module, inputs
        result = module(*inputs)
        input_storages = {t.untyped_storage().data_ptr() for t in inputs if isinstance(t, torch.Tensor)}
        # Outputs that alias an input (returned caches, views of weights) are not graph-owned memory:
        # a CUDA capture leaves them intact, so they are neither poisoned nor copied back.
        self.outputs = [
            t if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in input_storages else None
            for t in tree_flatten(result)[0]
        ]
        for tensor in self.outputs:
            if tensor is not None:
                poison(tensor)
        return result

    def replay(self) -> None:
        assert self.module is not None, "replay() before capture()"
        fresh = tree_flatten(self.module(*self.inputs))[0]
        for static, value in zip(self.outputs, fresh, strict=True):
            if static is not None:
                static.copy_(value)


def poison(tensor: torch.Tensor) -> None:
    """Fill with values that make any use before a replay visible (NaN, out-of-range ids)."""
    if tensor.dtype.is_floating_point:
        tensor.fill_(float("nan"))
    elif tensor.dtype == torch.bool:
        tensor.fill_(True)
    else:
        tensor.fill_(torch.iinfo(tensor.dtype).max // 2)


# --------------------------------------------------------------------------------------------------
# Triton JIT watch: proves that nothing compiles once a bucket is warm.
# --------------------------------------------------------------------------------------------------


class TritonCompiles:
    """Counts Triton kernel compilations in this process (misses of Triton's in-memory kernel cache,
    whether or not the on-disk cache had the binary) through Triton's post-compile hook."""

    def __init__(self) -> None:
        self.count = 0
        self.installed = False

    def install(self) -> bool:
        """Hook into Triton once (chaining any hook already set); False when Triton is unavailable. Also
        starts recording the kernels Triton loads or builds, which a saved artifact carries."""
        if self.installed:
            return True
        TRITON_KERNELS.install()
        try:
            import triton
        except ImportError:
            return False
        knobs = getattr(getattr(triton, "knobs", None), "runtime", None)
        if knobs is not None and hasattr(knobs, "jit_post_compile_hook"):
            previous = knobs.jit_post_compile_hook
            knobs.jit_post_compile_hook = self._hook(previous)
        else:  # HACK(triton<3.4): the hook was a JITFunction class attribute before triton.knobs
            from triton.runtime.jit import JITFunction

            previous = getattr(JITFunction, "compiled_hook", None)
            JITFunction.compiled_hook = self._hook(previous)
        self.installed = True
        return True

    def _hook(self, previous: Callable[..., Any] | None) -> Callable[..., Any]:
        def hook(*args: Any, **kwargs: Any) -> Any:
            self.count += 1
            return previous(*args, **kwargs) if previous else None

        return hook


TRITON_COMPILES = TritonCompiles()


# --------------------------------------------------------------------------------------------------
# The step
# --------------------------------------------------------------------------------------------------


def is_attention_piece(module: torch.nn.Module) -> bool:
    """A split_attention piece that must run eagerly: it holds a graphspec attention op."""
    return isinstance(module, fx.GraphModule) and any(is_attention(node) for node in module.graph.nodes)


def cpu_table_copy(
    gm: fx.GraphModule, params: Sequence[torch.Tensor], draft_dtype: torch.dtype = torch.float32
) -> tuple[fx.GraphModule, int, list[Any]]:
    """A copy of a flat graph that runs on the CPU with the CPU table's kernels in place of the reference
    ops (module docstring), how many it took, and the packed weights its mm kernels read (pack_mm_weights:
    the caller keeps them for as long as it runs the copy); `gm`, what an artifact stores, keeps its
    references."""
    table_copy = copy.deepcopy(gm)
    lowered = lower_kernels.lower_for_cpu(table_copy)
    return table_copy, lowered, pack_mm_weights(table_copy, params, draft_dtype)


def pack_mm_weights(
    gm: fx.GraphModule, params: Sequence[torch.Tensor], draft_dtype: torch.dtype = torch.float32
) -> list[Any]:
    """Pack, for the CPU table's mm kernel (kernels/mm_cpu.py), every weight whose transpose an mm of a
    CPU-table copy reads (its first len(params) placeholders are the weights): the drafter's own in
    `draft_dtype`, the target's in float32. The caller keeps the returned entries: the packed copies are
    used as long as it does."""
    from graphspec.kernels import mm_cpu  # on first use, as the CPU table imports its kernels

    weights = dict(zip(gm.graph.find_nodes(op="placeholder"), params, strict=False))
    entries = {}
    for node in gm.graph.find_nodes(op="call_function", target=mm_cpu.mm_cpu):
        operand = node.args[1]
        if isinstance(operand, fx.Node) and operand.target == torch.ops.aten.t.default and operand.args[0] in weights:
            placeholder = operand.args[0]
            dtype = draft_dtype if is_draft_weight(placeholder.meta["gs_input"]) else torch.float32
            entries[placeholder] = entries.get(placeholder) or mm_cpu.pack(weights[placeholder], dtype)
    return [entry for entry in entries.values() if entry is not None]


def pieces(gm: fx.GraphModule) -> list[tuple[str, bool]]:
    """(submodule name, runs eagerly) for each piece the top-level graph calls; [] for a flat graph."""
    return [
        (node.target, is_attention_piece(gm.get_submodule(node.target)))
        for node in gm.graph.nodes
        if node.op == "call_module"
    ]


def capture_mode(gm: fx.GraphModule, capture: bool) -> str:
    if not capture:
        return "eager"
    return "piecewise" if any(eager for _, eager in pieces(gm)) else "full"


@contextmanager
def every_row_invalid(buffers: StepBuffers) -> Iterator[None]:
    """Mark every row of the bucket invalid for a warm-up or compile run, then restore the flags: an
    invalid row writes only the spare cache slot, so such a run changes no request's state."""
    valid = buffers.inputs["row_valid"]
    saved = valid.clone()
    valid.zero_()
    try:
        yield
    finally:
        valid.copy_(saved)


class StepGraph:
    """One compiled step bound to its bucket's buffers and the shared state (KV caches, drafter state).

    The first call warms the step up (every row invalid, so only the spare cache slot is written),
    then captures it; every call after that replays. Call it after writing the step's inputs into
    `buffers`; the returned outputs stay valid until the next call.
    """

    def __init__(
        self,
        gm: fx.GraphModule,
        params: list[torch.Tensor],
        buffers: StepBuffers,
        state: dict[str, torch.Tensor],
        capture: bool,
        pool: object | None = None,
        recorder: Callable[[object | None], Recorder] | None = None,
        compile_cpu: bool = False,
        cpu_draft_dtype: torch.dtype = torch.float32,
    ) -> None:
        self.gm = gm
        self.compile_cpu = compile_cpu and not capture
        self.cpu_draft_dtype = cpu_draft_dtype  # what the CPU mm kernel packs the drafter's weights in
        self._compiled: Callable[..., Any] | None = None
        self.params = params
        self.buffers = buffers
        self.state = state
        # The graph's placeholders after the weights name its step inputs (per-row values, then states).
        names = [node.meta["gs_input"] for node in gm.graph.find_nodes(op="placeholder")][len(params) :]
        self.args = [*params, *(buffers.inputs[n] if n in buffers.inputs else state[n] for n in names)]
        self.output_names = trace.verified_outputs(gm)
        self.capture = capture
        self.mode = capture_mode(gm, capture)
        self.on_cuda = state[trace.TARGET_CACHE].is_cuda
        # What a CPU step runs, eager or emulating a full capture: its own copy with the CPU table's
        # kernels (module docstring). A piecewise graph keeps its references: its pieces are cut at
        # the reference attention ops, and its eager and captured runs must stay the same.
        # Made on the first call (cpu_step): a Runtime builds a StepGraph per (mode, bucket) up front.
        self.cpu_gm: fx.GraphModule | None = None
        self.cpu_kernels = 0
        self.packed_weights: list[Any] = []  # the CPU mm kernel's packed weights, alive while this step is
        self._on_cpu_table = not self.on_cuda and not pieces(gm)
        if capture and recorder is None and not self.on_cuda:
            raise ValueError("CUDA-graph capture needs CUDA tensors; pass recorder=HostRecorder to emulate it")
        self.new_recorder = recorder or CudaGraphRecorder
        # One pool for every captured graph of the step (and, from the Runtime, of every bucket).
        if pool is None and capture and self.on_cuda:
            pool = torch.cuda.graph_pool_handle()
        self.pool = pool
        self.recorders: list[Recorder] = []
        self.outputs: tuple[torch.Tensor, ...] | None = None
        self.compiles_during_capture: int | None = None
        # Piecewise state: the top-level graph's values, and the per-step program over them.
        self._values: dict[fx.Node, Any] = {}
        self._program: list[Callable[[], None]] = []
        self._output_nodes: tuple[fx.Node, ...] = ()
        self._keep_alive: list[Any] = []
        if capture and self.on_cuda:
            TRITON_COMPILES.install()

    def sibling(self, gm: fx.GraphModule) -> StepGraph:
        """Another compiled graph of the same step over this one's weights, buffers and caches, run the
        same way (captured or eager, same recorder) but captured on its own, into its own pool."""
        return StepGraph(
            gm, self.params, self.buffers, self.state, self.capture, recorder=self.new_recorder,
            compile_cpu=self.compile_cpu, cpu_draft_dtype=self.cpu_draft_dtype,
        )  # fmt: skip

    @property
    def cuda_graph(self) -> torch.cuda.CUDAGraph | None:
        """The full-step CUDA graph (mode "full", once captured)."""
        if self.mode == "full" and self.recorders and isinstance(self.recorders[0], CudaGraphRecorder):
            return self.recorders[0].graph
        return None

    @property
    def captured(self) -> bool:
        return bool(self.recorders)

    def describe(self) -> dict[str, Any]:
        """What this bucket runs as, for the runtime's reports and the dump's buckets.txt."""
        split = pieces(self.gm)
        return {
            "bucket": self.buffers.bucket,
            "mode": self.mode,
            "pieces": len(split),
            "eager_pieces": sum(eager for _, eager in split),
            "graphs": len(self.recorders),
            "compiles_during_capture": self.compiles_during_capture,
        }

    # ---------------------------------------------------------------------------------------------

    @property
    def awaits_cpu_compile(self) -> bool:
        """compile_cpu asked for an Inductor compilation of this CPU step, and it has not been made."""
        return self.compile_cpu and self._on_cpu_table and self._compiled is None

    def compile_on_cpu(self) -> None:
        """Compile this CPU step with Inductor now (compile_cpu) by running it once with every row
        invalid, so that no request pays the compile. It runs as every later call does (inference
        mode): a call in another grad mode would fail torch.compile's guards and compile again."""
        with every_row_invalid(self.buffers):
            self._run_eager()

    def warm_up_and_capture(self) -> None:
        """Warm up on a side stream, then capture, both with every row invalid; then restore row_valid.
        Triton JIT, cuBLAS handle and workspace setup all happen in the warm-up, never in a replay."""
        # A loaded graph has no generated code (artifact.decode_graph_module): its two runs in Python,
        # the warm-up and the capture, walk its nodes (node_program) instead of generating it.
        run = runner(self.gm)
        with every_row_invalid(self.buffers):
            if self.on_cuda:
                stream = torch.cuda.Stream()
                stream.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(stream), timed("warm_up_runs"):
                    for _ in range(WARM_UP_RUNS):
                        run(*self.args)
                torch.cuda.current_stream().wait_stream(stream)
            compiles = TRITON_COMPILES.count
            if self.mode == "piecewise":
                self._capture_pieces()
            else:
                recorder = self.new_recorder(self.pool)
                self.outputs = recorder.capture(self.cpu_step() or run, self.args)
                self.recorders.append(recorder)
                COUNTERS.captures += 1
            self.compiles_during_capture = TRITON_COMPILES.count - compiles
            if self.compiles_during_capture:
                bucket, count = self.buffers.bucket, self.compiles_during_capture
                log.warning("bucket %d: %d Triton compiles during capture (warm-up missed them)", bucket, count)

    def _capture_pieces(self) -> None:
        """Walk the split graph once: capture each non-attention piece, run attention pieces eagerly.

        A capture records without running, so each captured piece is replayed right away: the eager
        piece after it must see real values (ids it indexes with, above all), not pool garbage.
        """
        values: dict[fx.Node, Any] = {}
        static: set[fx.Node] = set()  # nodes whose value lives at the same address every step
        program: list[Callable[[], None]] = []
        args = iter(self.args)
        for node in self.gm.graph.nodes:
            if node.op == "placeholder":
                values[node] = next(args)
                static.add(node)
            elif node.op == "get_attr":  # a constant the split left at top level: fixed like a weight
                values[node] = operator.attrgetter(node.target)(self.gm)
                static.add(node)
            elif node.op == "call_module":
                module = self.gm.get_submodule(node.target)
                if node.kwargs or not all(isinstance(a, fx.Node) for a in node.args):
                    raise NotImplementedError(f"{node.target}: pieces take only graph values as positional args")
                if is_attention_piece(module):
                    values[node] = module(*(values[a] for a in node.args))
                    program.append(self._eager_step(node, module, values))
                    continue
                inputs, refresh = [], []
                for arg in node.args:
                    if arg in static:
                        inputs.append(values[arg])
                    else:  # an eager piece's output: give the graph its own buffer, refreshed each step
                        buffer = values[arg].clone()
                        refresh.append((buffer, arg))
                        inputs.append(buffer)
                recorder = self.new_recorder(self.pool)
                values[node] = recorder.capture(module, inputs)
                recorder.replay()
                static.add(node)
                self.recorders.append(recorder)
                self._keep_alive.append(inputs)
                COUNTERS.captures += 1
                program.append(self._graph_step(recorder, refresh, values))
            elif node.op == "call_function" and node.target is operator.getitem:
                source, index = node.args
                values[node] = values[source][index]
                if source in static:
                    static.add(node)
                else:
                    program.append(self._getitem_step(node, source, index, values))
            elif node.op == "output":
                self._output_nodes = tuple(node.args[0])
            else:
                raise NotImplementedError(f"piecewise replay does not handle {node.op} {node.target}")
        self._values, self._program = values, program

    @staticmethod
    def _eager_step(node: fx.Node, module: torch.nn.Module, values: dict[fx.Node, Any]) -> Callable[[], None]:
        args = node.args

        def run() -> None:
            values[node] = module(*(values[a] for a in args))

        return run

    @staticmethod
    def _getitem_step(node: fx.Node, source: fx.Node, index: int, values: dict[fx.Node, Any]) -> Callable[[], None]:
        def run() -> None:
            values[node] = values[source][index]

        return run

    @staticmethod
    def _graph_step(
        recorder: Recorder, refresh: list[tuple[torch.Tensor, fx.Node]], values: dict[fx.Node, Any]
    ) -> Callable[[], None]:
        def run() -> None:
            for buffer, source in refresh:
                buffer.copy_(values[source])
            recorder.replay()

        return run

    # ---------------------------------------------------------------------------------------------

    def cpu_step(self) -> fx.GraphModule | None:
        """The CPU-table copy of a flat step on the CPU (made on first use), None elsewhere."""
        if self.cpu_gm is None and self._on_cpu_table:
            self.cpu_gm, self.cpu_kernels, self.packed_weights = cpu_table_copy(
                self.gm, self.params, self.cpu_draft_dtype
            )
        return self.cpu_gm

    def _eager(self) -> Callable[..., Any]:
        """What an uncaptured step calls: the GraphModule (on the CPU its CPU-table copy), or that
        copy's Inductor compilation (compile_cpu)."""
        if self.cpu_step() is None:
            return self.gm
        if not self.compile_cpu:
            return self.cpu_gm
        if self._compiled is None:
            from graphspec.kernels import attention_cpu_native

            # Inductor is imported now anyway: the CPU attention's C++ row loop builds with its compiler.
            attention_cpu_native.build()
            # Static shapes (one graph per bucket), the whole step as one graph: a break would mean
            # something in the step is not traceable, which is a bug to see, not to run around.
            # A loaded graph's copy is lazy, whose forward torch.compile cannot trace (node_program.with_code).
            self._compiled = torch.compile(with_code(self.cpu_gm), dynamic=False, fullgraph=True)
            COUNTERS.cpu_compiles += 1
        return self._compiled

    def _run_eager(self) -> Any:
        # Nothing here needs autograd; inference mode skips its per-op bookkeeping (version counters,
        # view tracking), which on the CPU is a sixth of a small model's step.
        with torch.inference_mode():
            return self._eager()(*self.args)

    def __call__(self) -> dict[str, torch.Tensor]:
        if not self.capture:
            outputs = self._run_eager()
            COUNTERS.eager_steps += 1
        else:
            if not self.recorders:
                self.warm_up_and_capture()
            if self.mode == "piecewise":
                for step in self._program:
                    step()
                COUNTERS.replays += len(self.recorders)
                outputs = tuple(self._values[node] for node in self._output_nodes)
            else:
                self.recorders[0].replay()
                COUNTERS.replays += 1
                outputs = self.outputs
        return dict(zip(self.output_names, outputs, strict=True))
