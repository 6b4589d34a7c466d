"""Runtime: the compiled step's buffers, caches and graphs, and generate()/stream() as clients of the
continuous-batching engine (runtime/engine.py), which owns the loop between graph replays.
"""

from __future__ import annotations

import inspect
import queue
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from graphspec import ops
from graphspec.compiled import Compiled
from graphspec.compiler import compile
from graphspec.counters import COUNTERS, PHASE_SECONDS
from graphspec.cublas import use_no_workspace
from graphspec.drafters.base import PrefillView
from graphspec.errors import InputError
from graphspec.gc_pause import paused_gc
from graphspec.inputs import check_max_new_tokens, check_prompts
from graphspec.models.target import target_forward, target_state_names
from graphspec.runtime.buffers import StepBuffers
from graphspec.runtime.engine import Engine
from graphspec.runtime.graphs import StepGraph
from graphspec.runtime.prefill import Prefiller, PrefillProgram
from graphspec.runtime.requests import Delta, GenerationResult, RequestStats, SamplingParams
from graphspec.trace import TARGET_CACHE, model_inputs

__all__ = ["GenerationResult", "RequestStats", "Runtime", "RuntimeStats", "SamplingParams"]


CPU_DRAFT_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def check_cpu_draft_dtype(value: str, device: str, dtype: str) -> torch.dtype:
    """The torch dtype of Runtime's cpu_draft_dtype, refused (before any work) unless it is one of
    CPU_DRAFT_DTYPES, anything but "float32" is asked of a float32 artifact on the CPU, and a bfloat16
    copy is asked of a CPU that multiplies bfloat16."""
    if value not in CPU_DRAFT_DTYPES:
        raise InputError(f"cpu_draft_dtype must be one of {', '.join(CPU_DRAFT_DTYPES)}, got {value!r}")
    if value != "float32" and (device != "cpu" or dtype != "float32"):
        raise InputError(
            f"cpu_draft_dtype={value!r} is for float32 artifacts on the CPU (it packs the drafter's weights "
            f"for the CPU's matmul kernel); this one is {dtype} on {device}"
        )
    if value == "bfloat16":
        from graphspec.kernels import mm_cpu  # on first use, as the CPU table imports its kernels

        if not mm_cpu.bfloat16_supported():
            raise InputError(
                "cpu_draft_dtype='bfloat16' needs a CPU whose oneDNN multiplies bfloat16 (AVX512-BF16, AMX, "
                "AVX-NE-CONVERT or AVX512 BW/VL/DQ); this one has none of them: leave it at float32"
            )
    return CPU_DRAFT_DTYPES[value]


@dataclass
class RuntimeStats:
    """Totals over every generate() call since the Runtime was made (or reset)."""

    k: int
    steps: int = 0  # row-steps: one per real row per speculation step
    accepted: int = 0
    emitted: int = 0
    step_seconds: float = 0.0  # wall time of the step loops (host reads included)
    graph_steps: int = 0  # step-graph invocations (one per bucket step, all rows together)
    prefill_seconds: float = 0.0  # wall time of prefill() calls (until the first tokens are on the host)
    # Work that belongs to start-up but happened inside generate()/stream() calls (both must stay 0:
    # the Runtime warms up and captures every step and prefill program when it is built).
    triton_compiles_during_requests: int = 0
    cpu_compiles_during_requests: int = 0  # torch.compile graphs (compile_cpu)
    captures_during_requests: int = 0
    accepted_histogram: list[int] = field(default_factory=list)  # [K+1]: row-steps that accepted n
    # [K]: row-steps that drafted position i + 1 (all of them unless a bucket drafts fewer: k_by_bucket)
    drafted_at: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.accepted_histogram = self.accepted_histogram or [0] * (self.k + 1)
        self.drafted_at = self.drafted_at or [0] * self.k

    def record(self, drafted: int, accepted: int) -> None:
        """One row-step that drafted `drafted` tokens and accepted `accepted` of them."""
        self.steps += 1
        self.accepted += accepted
        self.accepted_histogram[accepted] += 1
        for position in range(drafted):
            self.drafted_at[position] += 1

    @property
    def acceptance_rate(self) -> float:
        """Accepted drafts over proposed drafts."""
        drafted = sum(self.drafted_at)
        return self.accepted / drafted if drafted else 0.0

    @property
    def mean_accepted(self) -> float:
        return self.accepted / self.steps if self.steps else 0.0

    @property
    def mean_tokens_per_step(self) -> float:
        return (self.accepted + self.steps) / self.steps if self.steps else 0.0

    @property
    def acceptance_by_position(self) -> list[float]:
        """P(draft position i is accepted), i = 1..K: the share of the row-steps drafting position i that
        accepted >= i."""
        return [
            sum(self.accepted_histogram[i:]) / drafted if drafted else 0.0
            for i, drafted in enumerate(self.drafted_at, start=1)
        ]

    @property
    def mean_step_ms(self) -> float:
        return 1e3 * self.step_seconds / self.graph_steps if self.graph_steps else 0.0


class Runtime:
    """Runs a Compiled speculative program. Build with Runtime.from_pretrained(target, draft, ...),
    Runtime.load(artifact_dir), or Runtime(graphspec.compile(...)).

    Safe to share between threads: generate() and stream() submit requests to the Runtime's engine
    (self.engine), whose one loop thread owns the buffers and caches and batches whatever is submitted,
    from any number of calls, into the compiled steps. A prompt's tokens do not depend on what runs
    beside it (greedy: the same tokens; sampling: the same tokens for the same seed).

    compile_cpu=True runs CPU steps through torch.compile (Inductor; see runtime/graphs.py): each
    (mode, bucket) step is compiled once per process (Inductor caches on disk across processes), and
    is then about 1.5x faster on the shipped demo pair. It changes no token.

    Start-up does the compiling: on CUDA (capture on) building the Runtime warms up and captures every
    (mode, bucket) step and every prefill chunk program, and on the CPU with compile_cpu it compiles
    every step, with a progress bar, so no request compiles a Triton kernel or a CPU step or captures
    a graph (RuntimeStats counts any that do). warm_up=False leaves it to each program's first call
    (tests, a one-off call that uses one bucket, or a caller that warms up later with warm_up()).

    cpu_draft_dtype="bfloat16" (a float32 artifact on the CPU): the drafter's projections multiply
    bfloat16 copies of its own weights (fp32 accumulation, kernels/mm_cpu.py), about 1.8x faster than
    fp32 on CPUs with AVX512-BF16; everything else, and the whole target, stays float32. The target
    verifies every draft in float32, so the output tokens are the same; acceptance may move a little."""

    @paused_gc()
    def __init__(
        self, compiled: Compiled, compile_cpu: bool = False, warm_up: bool = True, cpu_draft_dtype: str = "float32"
    ) -> None:
        began = time.perf_counter()
        draft_dtype = check_cpu_draft_dtype(cpu_draft_dtype, compiled.config.device, compiled.config.dtype)
        self.compiled = compiled
        self.config = compiled.config
        self.k = compiled.config.k
        self.device = compiled.config.device
        self.target = compiled.target.model
        self.drafter = compiled.drafter
        self.tokenizer = compiled.target.tokenizer
        self.eos_token_ids = compiled.target.eos_token_ids
        self.vocab_size = self.target.spec.vocab_size
        self.max_seq_len = compiled.config.max_seq_len
        # The step's state (the target's: KV cache first; then the drafter's), shared by every bucket.
        self.state = compiled.new_state()
        self.target_state_names = target_state_names(self.target)
        self.params = compiled.weights()
        if draft_dtype != torch.float32:
            # Runtimes over one Compiled share its weights, and a weight has one packed copy (kernels/mm_cpu.py):
            # this Runtime's drafter gets weights of its own to pack in draft_dtype.
            own = len(model_inputs(self.target))
            self.params = [*self.params[:own], *(weight.clone() for weight in self.params[own:])]
        capture = self.device.startswith("cuda") and compiled.config.capture != "none"
        pool = torch.cuda.graph_pool_handle() if capture else None
        self.buffers = {b: StepBuffers.allocate(b, self.device) for b in compiled.config.batch_sizes}
        cpu_options = {"compile_cpu": compile_cpu, "cpu_draft_dtype": draft_dtype}
        self.graphs = {
            (mode, bucket): StepGraph(gm, self.params, self.buffers[bucket], self.state, capture, pool, **cpu_options)
            for (mode, bucket), gm in compiled.graphs.items()
        }
        self.stats = RuntimeStats(self.k)
        # The compiled prefill chunk programs, by (bucket, chunk size), over the same weights and state;
        # artifacts written before prefill programs existed have none and prefill through reference_prefill.
        self.prefiller: Prefiller | None = None
        if compiled.prefill_graphs:
            programs = {
                (bucket, chunk): PrefillProgram(
                    gm,
                    chunk,
                    self.params,
                    self.state,
                    bucket,
                    compiled.slots - 1,
                    capture,
                    pool,
                    cpu_draft_dtype=draft_dtype,
                )
                for (bucket, chunk), gm in compiled.prefill_graphs.items()
            }
            self.prefiller = Prefiller(programs, self.drafter, self.state)
        self.engine = Engine(self)
        # Where start-up went, phase by phase (printed by `graphspec serve`, reported by bench_prefill).
        self.startup_seconds = {**compiled.load_seconds, "state_and_programs": time.perf_counter() - began}
        # Where warm_up's time went: seconds per kind of program prepared (host time: a capture's queued
        # work finishes in the next kind's), and the first requests'.
        self.warm_up_seconds: dict[str, float] = {}
        # Of which (CUDA): the eager warm-up runs, recording the captures, instantiating the graphs.
        self.capture_phase_seconds: dict[str, float] = {}
        if warm_up:
            warming = time.perf_counter()
            self.warm_up()
            if self.device.startswith("cuda"):
                torch.cuda.synchronize(self.device)
            self.startup_seconds["warm_up_and_capture"] = time.perf_counter() - warming

    def warm_up(self) -> None:
        """Warm up and capture every step and prefill program that has not been yet (CUDA graphs on), or
        compile every CPU step with Inductor (compile_cpu); elsewhere programs run as they are."""
        graphs = self.graphs.values()
        # (what it is, how to prepare it): the kinds name warm_up_seconds' entries.
        pending = [("steps", graph.warm_up_and_capture) for graph in graphs if graph.capture and not graph.captured]
        if self.prefiller is not None:
            programs = [p for p in self.prefiller.programs.values() if p.capture and p.recorder is None]
            pending += [("prefill_programs", program.warm_up_and_capture) for program in programs]
        pending += [("cpu_compiles", graph.compile_on_cpu) for graph in graphs if graph.awaits_cpu_compile]
        if not pending:
            return
        from tqdm.auto import tqdm  # here: importing graphspec should not pull it in

        what = "warm-up and capture" if self.device.startswith("cuda") else "compile CPU steps"
        phases_before = dict(PHASE_SECONDS)
        for kind, prepare in tqdm(pending, desc=f"graphspec: {what}", unit="graph"):
            began = time.perf_counter()
            prepare()
            self.warm_up_seconds[kind] = self.warm_up_seconds.get(kind, 0.0) + time.perf_counter() - began
        if self.device.startswith("cuda"):
            for phase in ("warm_up_runs", "record", "instantiate"):
                spent = PHASE_SECONDS[phase] - phases_before.get(phase, 0.0)
                self.capture_phase_seconds[phase] = self.capture_phase_seconds.get(phase, 0.0) + spent
            began = time.perf_counter()
            self._first_requests()
            torch.cuda.synchronize(self.device)
            self.warm_up_seconds["first_requests"] = time.perf_counter() - began

    def _first_requests(self) -> None:
        """One throwaway two-token request per compiled sampling mode, through the engine. CUDA loads a
        kernel on its first launch, and the request path (the engine thread, per-row inputs, host
        reads) launches eager kernels the captured programs never did; their loading belongs here,
        not in a user's first request. They are counted in statistics of their own, then dropped."""
        kept, self.stats = self.stats, RuntimeStats(self.k)
        try:
            for mode in sorted({mode for mode, _ in self.graphs}):
                self.generate([[0]], max_new_tokens=2, temperature=1.0 if mode == "sample" else 0.0, seed=0)
        finally:
            self.stats = kept

    @classmethod
    def from_pretrained(
        cls,
        target: str | Path,
        draft: str | Path,
        compile_cpu: bool = False,
        warm_up: bool = True,
        cpu_draft_dtype: str = "float32",
        **options: object,
    ) -> Runtime:
        """compile(target, draft, **options) and a Runtime over the result, in one call."""
        defaults = inspect.signature(compile).parameters  # compile's own defaults, where options leave them
        device, dtype = (options.get(name, defaults[name].default) for name in ("device", "dtype"))
        check_cpu_draft_dtype(cpu_draft_dtype, str(device), str(dtype))
        compiled = compile(target, draft, **options)
        return cls(compiled, compile_cpu=compile_cpu, warm_up=warm_up, cpu_draft_dtype=cpu_draft_dtype)

    @classmethod
    def load(
        cls,
        artifact_dir: str | Path,
        allow_mismatch: bool = False,
        compile_cpu: bool = False,
        warm_up: bool = True,
        cpu_draft_dtype: str = "float32",
    ) -> Runtime:
        """A Runtime over a `graphspec compile` artifact; verifies it before running anything."""
        from graphspec.artifact import load_artifact, read_manifest

        use_no_workspace()  # before the load starts CUDA (graphspec/cublas.py)
        if cpu_draft_dtype != "float32":  # refused before the weights are read, from what the manifest says
            config = read_manifest(artifact_dir).get("config", {})
            check_cpu_draft_dtype(cpu_draft_dtype, str(config.get("device")), str(config.get("dtype")))
        compiled = load_artifact(artifact_dir, allow_mismatch=allow_mismatch)
        return cls(compiled, compile_cpu=compile_cpu, warm_up=warm_up, cpu_draft_dtype=cpu_draft_dtype)

    # ---------------------------------------------------------------------------------------------
    # Input validation: everything is checked before any work starts.
    # ---------------------------------------------------------------------------------------------

    def check_length(self, prompt: list[int], max_new_tokens: int, index: int = 0) -> None:
        """Refuse a prompt that with max_new_tokens would run past the cache."""
        check_max_new_tokens(max_new_tokens)
        # A step writes KV up to position committed_len - 1 + K, so the cache needs K + 1 spare positions.
        need = len(prompt) + max_new_tokens + self.k + 1
        if need > self.max_seq_len:
            raise InputError(
                f"prompt {index} ({len(prompt)} tokens) + max_new_tokens {max_new_tokens} + k+1 {self.k + 1} "
                f"= {need} exceeds max_seq_len {self.max_seq_len}; shorten it or compile with a larger "
                f"max_seq_len"
            )

    # ---------------------------------------------------------------------------------------------

    def generate(
        self,
        prompts: Sequence[str | Sequence[int]],
        max_new_tokens: int = 64,
        temperature: float = 0.0,
        top_k: int | None = None,
        top_p: float | None = None,
        seed: int | Sequence[int] | None = None,
        stop_token_ids: Sequence[int] | None = None,
    ) -> list[GenerationResult]:
        """Generate for every prompt; one GenerationResult per prompt, in order.

        Output includes the stop token (default: the checkpoint's EOS ids) and nothing after it,
        even when it falls inside an accepted block. A seed belongs to the request: an int seeds every
        prompt alike, a list gives one seed per prompt, and a (prompt, seed) pair gives the same
        tokens at any index and beside any other prompts."""
        results: dict[int, GenerationResult] = {}
        for index, token in self.stream(prompts, max_new_tokens, temperature, top_k, top_p, seed, stop_token_ids):
            if isinstance(token, GenerationResult):
                results[index] = token
        return [results[index] for index in range(len(results))]

    def stream(
        self,
        prompts: Sequence[str | Sequence[int]],
        max_new_tokens: int = 64,
        temperature: float = 0.0,
        top_k: int | None = None,
        top_p: float | None = None,
        seed: int | Sequence[int] | None = None,
        stop_token_ids: Sequence[int] | None = None,
    ) -> Iterator[tuple[int, int | GenerationResult]]:
        """Like generate(), but yields (prompt index, token id) as tokens are committed, and
        (prompt index, GenerationResult) when a prompt finishes. Closing the iterator early cancels
        the prompts still running (their slots are freed at the next step boundary)."""
        encoded = check_prompts(prompts, self.vocab_size, self.tokenizer)
        for index, prompt in enumerate(encoded):
            self.check_length(prompt, max_new_tokens, index)
        ops.row_seeds(seed, len(encoded))  # refuses bad seeds before anything is submitted
        seeds = list(seed) if isinstance(seed, Sequence) else [seed] * len(encoded)
        params = [
            SamplingParams(
                max_tokens=max_new_tokens,
                temperature=temperature,
                top_k=top_k or 0,
                top_p=1.0 if top_p is None else top_p,
                seed=row_seed,
                stop_token_ids=stop_token_ids,
            )
            for row_seed in seeds
        ]
        return self._follow(encoded, params)

    def _follow(
        self, encoded: list[list[int]], params: list[SamplingParams]
    ) -> Iterator[tuple[int, int | GenerationResult]]:
        out: queue.SimpleQueue = queue.SimpleQueue()
        handles = self.engine.submit_all(
            [
                (prompt, row_params, index)
                for index, (prompt, row_params) in enumerate(zip(encoded, params, strict=True))
            ],
            out,
        )
        try:
            running = len(handles)
            while running:
                index, item = out.get()
                if isinstance(item, BaseException):
                    raise item
                if isinstance(item, Delta):
                    for token in item.token_ids:
                        yield index, token
                else:
                    running -= 1
                    yield index, item
        finally:
            for handle in handles:  # no-op for the finished ones
                handle.cancel()

    # ---------------------------------------------------------------------------------------------
    # Called by the engine's loop thread only
    # ---------------------------------------------------------------------------------------------

    def _check_prefill(self, prompts: Sequence[Sequence[int]], slot_ids: Sequence[int]) -> None:
        slots = self.compiled.slots - 1  # the last slot is the spare one padding rows write
        if len(slot_ids) != len(prompts) or not prompts:
            raise InputError(f"prefill needs one slot id per prompt, got {len(prompts)} prompts, {len(slot_ids)} slots")
        if len(set(slot_ids)) != len(slot_ids) or not all(isinstance(s, int) and 0 <= s < slots for s in slot_ids):
            raise InputError(f"slot ids must be distinct ints in [0, {slots}), got {list(slot_ids)}")
        for index, prompt in enumerate(prompts):
            if not 1 <= len(prompt) <= self.max_seq_len - self.k - 1:
                raise InputError(
                    f"prompt {index} has {len(prompt)} tokens; a prompt needs 1 to max_seq_len - k - 1 = "
                    f"{self.max_seq_len - self.k - 1} tokens (room for one step)"
                )

    def prefill(
        self, prompts: Sequence[Sequence[int]], slot_ids: Sequence[int], row_params: dict[str, torch.Tensor]
    ) -> torch.Tensor:
        """Fill the target's KV cache and the drafter's state of cache slots `slot_ids` with `prompts`
        (token id lists, one slot each) and return the target's first token per prompt ([rows] int64,
        on the host, as soon as the target's prefill has run: on a GPU the drafter's prefill of the last
        chunk is still running, and whatever is queued next follows it), drawn with row_params
        ("temperature", "top_k", "top_p", "seed", "step_counter": [rows] tensors, as the step takes
        them; the first token uses step_counter's lane 0). Other
        slots are untouched (but the spare one, which no row owns). Runs the compiled prefill chunk
        programs (reference_prefill for artifacts without them). The slots are then ready for a step at
        committed_len = len(prompt) + 1."""
        self._check_prefill(prompts, slot_ids)
        start = time.perf_counter()
        if self.prefiller is None:
            first = self.reference_prefill(prompts, slot_ids, row_params).cpu()
        else:
            first = self.prefiller(prompts, list(slot_ids), row_params)
        self.stats.prefill_seconds += time.perf_counter() - start
        return first

    @torch.inference_mode()
    def reference_prefill(
        self, prompts: Sequence[Sequence[int]], slot_ids: Sequence[int], row_params: dict[str, torch.Tensor]
    ) -> torch.Tensor:
        """prefill() eagerly through the reference ops, whole prompts at once (full fp32 attention
        scores; memory grows with the prompt length squared): the oracle of the compiled prefill."""
        self._check_prefill(prompts, slot_ids)
        rows = len(prompts)
        longest = max(len(p) for p in prompts)
        # Right padding: positions past a row's prompt write dead KV that later steps overwrite.
        tokens = torch.zeros((rows, longest), dtype=torch.int64)
        for row, prompt in enumerate(prompts):
            tokens[row, : len(prompt)] = torch.as_tensor(prompt, dtype=torch.int64)
        tokens = tokens.to(self.device)
        start = torch.zeros(rows, dtype=torch.int64, device=self.device)
        slots = torch.tensor(list(slot_ids), dtype=torch.int64, device=self.device)
        # The target cache cut to the prompt length (a view: writes land in the cache): the reference
        # attention then scores `longest` positions per row instead of all max_seq_len.
        states = {name: self.state[name] for name in self.target_state_names}
        states[TARGET_CACHE] = self.state[TARGET_CACHE][..., :longest, :]
        capture = self.drafter.target_features
        output = "hidden_and_features" if capture else "hidden"
        lengths = torch.tensor([len(p) for p in prompts], device=self.device)
        # lengths: right padding must not advance a "snapshot" state (linear attention).
        hidden, _ = target_forward(
            self.target, None, tokens, start, slots, states, output, capture, lengths=lengths, in_place=True
        )
        hidden, features = hidden if capture else (hidden, None)
        logits = self.target.logits(hidden[torch.arange(rows, device=self.device), lengths - 1])  # [rows, V]
        first = ops.sample(
            logits,
            row_params["temperature"],
            row_params["top_k"],
            row_params["top_p"],
            row_params["seed"],
            row_params["step_counter"],
            0,
        )
        self.drafter.prefill(PrefillView(tokens, slots, lengths, hidden, first, features), self.state)
        COUNTERS.prefills += 1
        return first

    @torch.inference_mode()
    def token_logprobs(self, slot: int, sequence: list[int], start: int) -> list[float]:
        """log p(sequence[i] | sequence[:i]) for i in start..len(sequence)-1 under the target's raw
        distribution (log-softmax of its logits in fp32: no temperature, top-k or top-p).

        One target forward over the new tokens' predecessors, reading the committed KV of `slot`
        (positions < start - 1) from a copy of that slot's prefix: the cache the step uses is never
        written, so asking for logprobs cannot change any token."""
        if len(self.target_state_names) > 1:  # the prefix's linear-attention state is not kept per position
            raise InputError("prompt logprobs are not supported for hybrid (linear-attention) targets yet")
        end = len(sequence)
        cache = self.state[TARGET_CACHE][:, :, slot : slot + 1, :, :end, :].clone()  # [L, 2, 1, Hkv, end, D]
        tokens = torch.tensor([sequence[start - 1 : end - 1]], dtype=torch.int64, device=self.device)
        begin = torch.tensor([start - 1], dtype=torch.int64, device=self.device)
        zero = torch.zeros(1, dtype=torch.int64, device=self.device)
        hidden, _ = self.target(tokens, begin, zero, cache, in_place=True)
        logprobs = torch.log_softmax(self.target.logits(hidden[0]).float(), dim=-1)  # [end - start, V]
        chosen = torch.tensor(sequence[start:end], device=self.device)
        return logprobs[torch.arange(end - start, device=self.device), chosen].tolist()
