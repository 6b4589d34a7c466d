"""Runtime: the compiled step's buffers, caches and graphs, and generate()/stream() as clients of the
continuous-batching engine (runtime/engine.py), which owns the loop between graph replays.
"""

from __future__ import annotations

import queue
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from graphspec import ops
from graphspec.compiler import Compiled, compile
from graphspec.counters import COUNTERS
from graphspec.drafters.base import PrefillView
from graphspec.errors import InputError
from graphspec.inputs import check_max_new_tokens, check_prompts
from graphspec.runtime.buffers import StepBuffers
from graphspec.runtime.engine import Engine
from graphspec.runtime.graphs import StepGraph
from graphspec.runtime.requests import Delta, GenerationResult, RequestStats, SamplingParams
from graphspec.trace import TARGET_CACHE

__all__ = ["GenerationResult", "RequestStats", "Runtime", "RuntimeStats", "SamplingParams"]


@dataclass
class RuntimeStats:
    """Totals over every generate() call since the Runtime was made (or reset)."""

    k: int
    steps: int = 0  # row-steps: one per real row per speculation step
    accepted: int = 0
    emitted: int = 0
    step_seconds: float = 0.0  # wall time of the step loops (host reads included)
    graph_steps: int = 0  # step-graph invocations (one per bucket step, all rows together)
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

    Safe to share between threads: generate() and stream() submit requests to the Runtime's engine
    (self.engine), whose one loop thread owns the buffers and caches and batches whatever is submitted,
    from any number of calls, into the compiled steps. A prompt's tokens do not depend on what runs
    beside it (greedy: the same tokens; sampling: the same tokens for the same seed).

    compile_cpu=True runs CPU steps through torch.compile (Inductor; see runtime/graphs.py): each
    (mode, bucket) step compiles on its first call, once per process (cached on disk across
    processes), and is then about 1.5x faster on the shipped demo pair. It changes no token."""

    def __init__(self, compiled: Compiled, compile_cpu: bool = False) -> None:
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
        self.engine = Engine(self)

    @classmethod
    def from_pretrained(
        cls, target: str | Path, draft: str | Path, compile_cpu: bool = False, **options: object
    ) -> Runtime:
        """compile(target, draft, **options) and a Runtime over the result, in one call."""
        return cls(compile(target, draft, **options), compile_cpu=compile_cpu)

    @classmethod
    def load(cls, artifact_dir: str | Path, allow_mismatch: bool = False, compile_cpu: bool = False) -> Runtime:
        """A Runtime over a `graphspec compile` artifact; verifies it before running anything."""
        from graphspec.artifact import load_artifact

        return cls(load_artifact(artifact_dir, allow_mismatch=allow_mismatch), compile_cpu=compile_cpu)

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

    @torch.inference_mode()
    def _prefill(
        self, prompts: list[list[int]], params: dict[str, torch.Tensor], slots: Sequence[int] | None = None
    ) -> torch.Tensor:
        """Fill the target's cache and the drafter's state of `slots` (default 0..n-1), one per prompt;
        return the target's first token per row."""
        rows = len(prompts)
        longest = max(len(p) for p in prompts)
        # Right padding: positions past a row's prompt write dead KV that later steps overwrite.
        tokens = torch.zeros((rows, longest), dtype=torch.int64)
        for row, prompt in enumerate(prompts):
            tokens[row, : len(prompt)] = torch.tensor(prompt)
        tokens = tokens.to(self.device)
        start = torch.zeros(rows, dtype=torch.int64, device=self.device)
        slot_ids = torch.arange(rows) if slots is None else torch.tensor(list(slots), dtype=torch.int64)
        slot_ids = slot_ids.to(self.device)
        # The target cache cut to the prompt length (a view: writes land in the cache): the reference
        # attention then scores `longest` positions per row instead of all max_seq_len.
        target_cache = self.state[TARGET_CACHE][..., :longest, :]
        hidden, _ = self.target(tokens, start, slot_ids, target_cache, in_place=True)
        lengths = torch.tensor([len(p) for p in prompts], device=self.device)
        logits = self.target.logits(hidden[torch.arange(rows, device=self.device), lengths - 1])  # [rows, V]
        first = ops.sample(
            logits, params["temperature"], params["top_k"], params["top_p"], params["seed"], params["step_counter"], 0
        )
        self.drafter.prefill(PrefillView(tokens, slot_ids, lengths, hidden, first), self.state)
        COUNTERS.prefills += 1
        return first

    @torch.inference_mode()
    def token_logprobs(self, slot: int, sequence: list[int], start: int) -> list[float]:
        """log p(sequence[i] | sequence[:i]) for i in start..len(sequence)-1 under the target's raw
        distribution (log-softmax of its logits in fp32: no temperature, top-k or top-p).

        One target forward over the new tokens' predecessors, reading the committed KV of `slot`
        (positions < start - 1) from a copy of that slot's prefix: the cache the step uses is never
        written, so asking for logprobs cannot change any token."""
        end = len(sequence)
        cache = self.state[TARGET_CACHE][:, :, slot : slot + 1, :, :end, :].clone()  # [L, 2, 1, Hkv, end, D]
        tokens = torch.tensor([sequence[start - 1 : end - 1]], dtype=torch.int64, device=self.device)
        begin = torch.tensor([start - 1], dtype=torch.int64, device=self.device)
        zero = torch.zeros(1, dtype=torch.int64, device=self.device)
        hidden, _ = self.target(tokens, begin, zero, cache, in_place=True)
        logprobs = torch.log_softmax(self.target.logits(hidden[0]).float(), dim=-1)  # [end - start, V]
        chosen = torch.tensor(sequence[start:end], device=self.device)
        return logprobs[torch.arange(end - start, device=self.device), chosen].tolist()
