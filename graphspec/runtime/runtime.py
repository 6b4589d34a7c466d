"""Runtime.generate(): prefill, then compiled speculation steps until every row has stopped.

The loop between graph replays is all that lives here. Per step the host reads one small tensor
(emitted tokens and accepted counts), streams tokens, and stops rows at a stop token or length by
clearing their row_valid flag; nothing inside the step waits for the host.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from graphspec import ops
from graphspec.compiled import Compiled
from graphspec.compiler import compile
from graphspec.counters import COUNTERS
from graphspec.drafters.base import PrefillView
from graphspec.errors import InputError, RuntimeBusyError
from graphspec.inputs import check_max_new_tokens, check_prompts, check_sampling, check_stop_token_ids, token_id
from graphspec.runtime.buffers import StepBuffers, pick_bucket, split_batch
from graphspec.runtime.graphs import TRITON_COMPILES, StepGraph
from graphspec.runtime.prefill import Prefiller, PrefillProgram
from graphspec.trace import FEEDBACK, TARGET_CACHE


@dataclass
class RequestStats:
    steps: int = 0
    accepted_per_step: list[int] = field(default_factory=list)

    @property
    def tokens_per_step(self) -> list[int]:
        return [n + 1 for n in self.accepted_per_step]


@dataclass
class GenerationResult:
    token_ids: list[int]
    text: str | None
    finish_reason: str  # "stop" or "length"
    stats: RequestStats


@dataclass
class RuntimeStats:
    """Totals over every generate() call since the Runtime was made (or reset)."""

    k: int
    steps: int = 0  # row-steps: one per real row per speculation step
    accepted: int = 0
    emitted: int = 0
    step_seconds: float = 0.0  # wall time of the step loops (host reads included)
    graph_steps: int = 0  # step-graph invocations (one per bucket step, all rows together)
    prefill_seconds: float = 0.0  # wall time of prefill() calls (on a GPU: until the work is queued)
    # Work that belongs to start-up but happened inside generate()/stream() calls (both must stay 0:
    # the Runtime warms up and captures every step and prefill program when it is built).
    triton_compiles_during_requests: int = 0
    captures_during_requests: int = 0
    accepted_histogram: list[int] = field(default_factory=list)  # [K+1]: row-steps that accepted n

    def __post_init__(self) -> None:
        self.accepted_histogram = self.accepted_histogram or [0] * (self.k + 1)

    @property
    def acceptance_rate(self) -> float:
        """Accepted drafts over proposed drafts."""
        return self.accepted / (self.steps * self.k) if self.steps else 0.0

    @property
    def mean_accepted(self) -> float:
        return self.accepted / self.steps if self.steps else 0.0

    @property
    def mean_tokens_per_step(self) -> float:
        return (self.accepted + self.steps) / self.steps if self.steps else 0.0

    @property
    def acceptance_by_position(self) -> list[float]:
        """P(draft position i is accepted), i = 1..K: the share of row-steps accepting >= i."""
        if not self.steps:
            return [0.0] * self.k
        return [sum(self.accepted_histogram[i:]) / self.steps for i in range(1, self.k + 1)]

    @property
    def mean_step_ms(self) -> float:
        return 1e3 * self.step_seconds / self.graph_steps if self.graph_steps else 0.0


class Runtime:
    """Runs a Compiled speculative program. Build with Runtime.from_pretrained(target, draft, ...),
    Runtime.load(artifact_dir), or Runtime(graphspec.compile(...)).

    One request batch at a time: every bucket's step buffers and the KV caches are shared state, so
    a generate() or stream() started while another is running (another thread, or an unfinished
    stream() iterator in this one) is refused with RuntimeBusyError instead of corrupting both.
    Refusing, not waiting: two stream() iterators advanced in turn by one thread would wait on each
    other forever, and a server should queue requests where it can see the queue. Run batches one
    after another, pass all prompts to one call, or use one Runtime per thread.

    compile_cpu=True runs CPU steps through torch.compile (Inductor; see runtime/graphs.py): each
    (mode, bucket) step compiles on its first call, once per process (cached on disk across
    processes), and is then about 1.5x faster on the shipped demo pair. It changes no token.

    Start-up does the compiling: on CUDA (capture on) building the Runtime warms up and captures every
    (mode, bucket) step and every prefill chunk program, with a progress bar, so no request
    compiles a Triton kernel or captures a graph (RuntimeStats counts any that do). warm_up=False
    leaves it to each program's first call (tests, or a caller that warms up later with warm_up())."""

    def __init__(self, compiled: Compiled, compile_cpu: bool = False, warm_up: bool = True) -> None:
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
        # The step's state (target KV cache, then the drafter's), shared by every bucket.
        self.state = compiled.new_state()
        self.params = compiled.weights()
        capture = self.device.startswith("cuda") and compiled.config.capture != "none"
        pool = torch.cuda.graph_pool_handle() if capture else None
        self.buffers = {b: StepBuffers.allocate(b, self.device) for b in compiled.config.batch_sizes}
        self.graphs = {
            (mode, bucket): StepGraph(
                gm, self.params, self.buffers[bucket], self.state, capture, pool, compile_cpu=compile_cpu
            )
            for (mode, bucket), gm in compiled.graphs.items()
        }
        self.stats = RuntimeStats(self.k)
        self._busy = threading.Lock()  # held from a call's first token to its last (see the class docstring)
        # The compiled prefill chunk programs, by (bucket, chunk size), over the same weights and state;
        # artifacts written before prefill programs existed have none and prefill through reference_prefill.
        self.prefiller: Prefiller | None = None
        if compiled.prefill_graphs:
            programs = {
                (bucket, chunk): PrefillProgram(
                    gm, chunk, self.params, self.state, bucket, compiled.slots - 1, capture, pool
                )
                for (bucket, chunk), gm in compiled.prefill_graphs.items()
            }
            self.prefiller = Prefiller(programs, self.drafter, self.state)
        if warm_up:
            self.warm_up()

    def warm_up(self) -> None:
        """Warm up and capture every step and prefill program that has not been yet (CUDA graphs on;
        elsewhere there is nothing to capture and programs run as they are)."""
        pending = [graph for graph in self.graphs.values() if graph.capture and not graph.captured]
        if self.prefiller is not None:
            pending += [p for p in self.prefiller.programs.values() if p.capture and p.recorder is None]
        if not pending:
            return
        from tqdm.auto import tqdm  # here: importing graphspec should not pull it in

        for program in tqdm(pending, desc="graphspec: warm-up and capture", unit="graph"):
            program.warm_up_and_capture()

    @classmethod
    def from_pretrained(
        cls, target: str | Path, draft: str | Path, compile_cpu: bool = False, warm_up: bool = True, **options: object
    ) -> Runtime:
        """compile(target, draft, **options) and a Runtime over the result, in one call."""
        return cls(compile(target, draft, **options), compile_cpu=compile_cpu, warm_up=warm_up)

    @classmethod
    def load(
        cls, artifact_dir: str | Path, allow_mismatch: bool = False, compile_cpu: bool = False, warm_up: bool = True
    ) -> Runtime:
        """A Runtime over a `graphspec compile` artifact; verifies it before running anything."""
        from graphspec.artifact import load_artifact

        compiled = load_artifact(artifact_dir, allow_mismatch=allow_mismatch)
        return cls(compiled, compile_cpu=compile_cpu, warm_up=warm_up)

    # ---------------------------------------------------------------------------------------------
    # Input validation: everything is checked before any work starts.
    # ---------------------------------------------------------------------------------------------

    def _check_limits(self, prompts: list[list[int]], max_new_tokens: int) -> None:
        check_max_new_tokens(max_new_tokens)
        # A step writes KV up to position committed_len - 1 + K, so the cache needs K + 1 spare positions.
        for index, prompt in enumerate(prompts):
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
        (prompt index, GenerationResult) when a prompt finishes. The Runtime is busy from the
        first next() until the iterator is exhausted or closed."""
        if not self._busy.acquire(blocking=False):
            raise RuntimeBusyError(
                "this Runtime is already generating (in another thread, or an unfinished stream() iterator): "
                "a Runtime runs one generate()/stream() at a time; wait for it, close() the open stream, "
                "pass all prompts to one call, or use one Runtime per thread"
            )
        compiles, captures = TRITON_COMPILES.count, COUNTERS.captures
        try:
            yield from self._stream(prompts, max_new_tokens, temperature, top_k, top_p, seed, stop_token_ids)
        finally:
            self.stats.triton_compiles_during_requests += TRITON_COMPILES.count - compiles
            self.stats.captures_during_requests += COUNTERS.captures - captures
            self._busy.release()

    def _stream(
        self,
        prompts: Sequence[str | Sequence[int]],
        max_new_tokens: int,
        temperature: float,
        top_k: int | None,
        top_p: float | None,
        seed: int | Sequence[int] | None,
        stop_token_ids: Sequence[int] | None,
    ) -> Iterator[tuple[int, int | GenerationResult]]:
        encoded = check_prompts(prompts, self.vocab_size, self.tokenizer)
        self._check_limits(encoded, max_new_tokens)
        check_sampling(temperature, top_k, top_p)
        mode = "greedy" if temperature == 0 else "sample"
        if not any(m == mode for m, _ in self.graphs):
            raise InputError(f"this runtime was compiled without the {mode!r} step; recompile with modes including it")
        if stop_token_ids is None:
            stops = {token_id(t, "the checkpoint's EOS ids") for t in self.eos_token_ids}
        else:
            stops = check_stop_token_ids(stop_token_ids, self.vocab_size)
        seeds = ops.row_seeds(seed, len(encoded))
        largest = max(self.config.batch_sizes)
        for chunk in split_batch(len(encoded), largest):
            yield from self._run_chunk(
                [encoded[i] for i in chunk],
                list(chunk),
                max_new_tokens,
                float(temperature),
                top_k or 0,
                1.0 if top_p is None else float(top_p),
                seeds[chunk.start : chunk.stop],
                stops,
            )

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
        on the device), drawn with row_params ("temperature", "top_k", "top_p", "seed", "step_counter":
        [rows] tensors, as the step takes them; the first token uses step_counter's lane 0). Other
        slots are untouched (but the spare one, which no row owns). Runs the compiled prefill chunk
        programs (reference_prefill for artifacts without them). The slots are then ready for a step at
        committed_len = len(prompt) + 1."""
        self._check_prefill(prompts, slot_ids)
        start = time.perf_counter()
        if self.prefiller is None:
            first = self.reference_prefill(prompts, slot_ids, row_params)
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
        target_cache = self.state[TARGET_CACHE][..., :longest, :]
        capture = self.drafter.target_features
        output = "hidden_and_features" if capture else "hidden"
        hidden, _ = self.target(tokens, start, slots, target_cache, output, in_place=True, capture=capture)
        hidden, features = hidden if capture else (hidden, None)
        lengths = torch.tensor([len(p) for p in prompts], device=self.device)
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

    def _run_chunk(
        self,
        prompts: list[list[int]],
        indices: list[int],
        max_new_tokens: int,
        temperature: float,
        top_k: int,
        top_p: float,
        seeds: torch.Tensor,
        stops: set[int],
    ) -> Iterator[tuple[int, int | GenerationResult]]:
        rows = len(prompts)
        bucket = pick_bucket(rows, self.config.batch_sizes)
        mode = "greedy" if temperature == 0 else "sample"
        graph = self.graphs[(mode, bucket)]
        device = self.device
        row_params = {
            "temperature": torch.full((rows,), temperature, dtype=torch.float32, device=device),
            "top_k": torch.full((rows,), top_k, dtype=torch.int64, device=device),
            "top_p": torch.full((rows,), top_p, dtype=torch.float32, device=device),
            "seed": seeds.to(device),
            "step_counter": torch.zeros(rows, dtype=torch.int64, device=device),
        }
        first = self.prefill(prompts, list(range(rows)), row_params).cpu().tolist()
        emitted: list[list[int]] = [[] for _ in range(rows)]
        finished: list[str | None] = [None] * rows
        stats = [RequestStats() for _ in range(rows)]

        def accept(row: int, new_tokens: list[int]) -> Iterator[tuple[int, int | GenerationResult]]:
            for token in new_tokens:
                emitted[row].append(token)
                yield indices[row], token
                if token in stops or len(emitted[row]) >= max_new_tokens:
                    finished[row] = "stop" if token in stops else "length"
                    yield indices[row], self._result(emitted[row], finished[row], stats[row])
                    return

        for row in range(rows):
            yield from accept(row, [first[row]])
        if all(finished):
            return
        graph.buffers.load_rows(
            {
                **row_params,
                "last_tokens": torch.tensor([[p[-1], f] for p, f in zip(prompts, first, strict=True)], device=device),
                "committed_len": torch.tensor([len(p) + 1 for p in prompts], device=device),
                "slot_ids": torch.arange(rows, device=device),
                "step_counter": torch.ones(rows, dtype=torch.int64, device=device),
            }
        )
        valid = graph.buffers.inputs["row_valid"]
        for row in range(rows):
            if finished[row]:
                valid[row] = False
        start = time.perf_counter()
        while not all(finished):
            outputs = graph()
            for name, target in FEEDBACK.items():
                graph.buffers.inputs[target].copy_(outputs[name])
            # The one host read per step: emitted tokens and accepted counts together.
            host = torch.cat((outputs["tokens"], outputs["num_accepted"][:, None]), dim=1).cpu()
            self.stats.graph_steps += 1
            for row in range(rows):
                if finished[row]:
                    continue
                accepted = int(host[row, -1])
                stats[row].steps += 1
                stats[row].accepted_per_step.append(accepted)
                self.stats.steps += 1
                self.stats.accepted += accepted
                self.stats.accepted_histogram[accepted] += 1
                before = len(emitted[row])
                yield from accept(row, host[row, : accepted + 1].tolist())
                self.stats.emitted += len(emitted[row]) - before
                if finished[row]:
                    valid[row] = False
        self.stats.step_seconds += time.perf_counter() - start

    def _result(self, token_ids: list[int], reason: str, stats: RequestStats) -> GenerationResult:
        text = self.tokenizer.decode(token_ids) if self.tokenizer is not None else None
        return GenerationResult(list(token_ids), text, reason, stats)
