"""The continuous-batching loop: one thread owns the device and runs compiled steps over whatever
requests are live; callers submit requests and read their tokens from queues.

Between two steps the loop
1. drops cancelled rows and frees their cache slots,
2. admits waiting requests into free slots: one prefill of the newcomers into their slots, their first
   token, then they join the step,
3. picks the step: the smallest compiled bucket that holds the live rows, "sample" when any row samples
   (a temperature-0 row of the sample step takes the argmax, as in the greedy step), else "greedy",
4. when the rows or the bucket changed, gathers the continuing rows' per-row values from the previous
   bucket's buffers (on the device: the step's own feedback, never recomputed on the host) and loads
   them, then the newcomers', into the chosen bucket's buffers,
5. replays the step, feeds next_* back, reads tokens and accepted counts once, and hands each row's
   committed tokens to its caller; rows that hit a stop token, a stop string or max_tokens leave.

Per-row state lives in cache slots (KV caches, drafter state) and in the bucket buffers; a row's
position in the batch carries nothing, so rows move between buckets and positions freely. Sampling is
keyed by (request seed, step counter), never by position, so a seeded request gives the same tokens
whatever else runs beside it.
"""

from __future__ import annotations

import atexit
import itertools
import logging
import queue
import threading
import time
import weakref
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from graphspec import ops
from graphspec.counters import COUNTERS, compiled_graphs
from graphspec.errors import InputError
from graphspec.inputs import check_prompts, token_id
from graphspec.runtime.buffers import pick_bucket
from graphspec.runtime.graphs import TRITON_COMPILES
from graphspec.runtime.requests import Delta, GenerationResult, RequestStats, SamplingParams, stop_string_cut
from graphspec.trace import FEEDBACK, TARGET_CACHE

if TYPE_CHECKING:
    from graphspec.runtime.runtime import Runtime

log = logging.getLogger("graphspec")

IDLE_EXIT_S = 2.0  # an idle loop thread ends after this long; the next submit starts a new one
EXIT_JOIN_S = 30.0  # at interpreter exit: how long to wait for a loop thread to finish its current step
_ENGINES: weakref.WeakSet[Engine] = weakref.WeakSet()


@atexit.register
def _stop_engines() -> None:
    """End every engine's loop thread before the interpreter finalizes. The thread is a daemon (it must
    not keep a process alive), and a daemon thread that wakes from its idle wait while the interpreter
    finalizes is killed inside the call (pthread_exit), which aborts the process ("terminate called
    without an active exception") on a machine slow enough to finalize for longer than IDLE_EXIT_S."""
    for engine in list(_ENGINES):
        engine.stop_at_exit()


# Per-row values a newcomer is given at admission and a continuing row carries between buckets.
_ROW_VALUES = ("last_tokens", "committed_len", "slot_ids", "temperature", "top_k", "top_p", "seed", "step_counter")


@dataclass
class Request:
    """One submitted prompt. The engine thread owns every field below `out` once it is submitted."""

    id: int
    prompt: list[int]
    params: SamplingParams
    stops: frozenset[int]
    seed: int  # the mixed 64-bit seed of the counter-based random stream (ops.row_seeds)
    out: queue.SimpleQueue
    tag: object
    cancelled: threading.Event = field(default_factory=threading.Event)
    slot: int = -1
    emitted: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    stats: RequestStats = field(default_factory=RequestStats)
    text_checked: int = 0  # characters of the decoded text already searched for stop strings
    text: str | None = None  # set when a stop string cut the text
    finish_reason: str | None = None
    submitted: float = field(default_factory=time.perf_counter)


class RequestHandle:
    """A submitted request: iterate it for Delta items, then one GenerationResult (or the engine's
    exception, raised). cancel() stops it at the next step boundary and frees its slot."""

    def __init__(self, request: Request) -> None:
        self._request = request

    @property
    def id(self) -> int:
        return self._request.id

    def cancel(self) -> None:
        self._request.cancelled.set()

    def __iter__(self) -> Iterator[Delta | GenerationResult]:
        while True:
            _, item = self._request.out.get()
            if isinstance(item, BaseException):
                raise item
            yield item
            if isinstance(item, GenerationResult):
                return

    def result(self) -> GenerationResult:
        for item in self:
            if isinstance(item, GenerationResult):
                return item
        raise AssertionError("unreachable: a request always ends with a GenerationResult")


class Engine:
    """The loop between graph replays (module docstring). Start-up costs nothing: the thread starts on
    the first submit and sleeps while no request is live."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self.buckets = tuple(sorted(runtime.config.batch_sizes))
        self.modes = {mode for mode, _ in runtime.graphs}
        self._ids = itertools.count()
        self._waiting: deque[Request] = deque()
        self._wake = threading.Condition()
        self._thread: threading.Thread | None = None
        self._exiting = False  # set once, at interpreter exit: the loop ends at its next turn
        _ENGINES.add(self)
        self._free = list(range(max(self.buckets)))  # slot max(buckets) is the spare slot padded rows write
        self._live: list[Request] = []
        self._loaded: tuple[str, int, tuple[int, ...]] | None = None  # (mode, bucket, request ids) in buffers
        # Called on the loop thread: on_step(buffers, live rows, accepted counts) after each step's tokens are
        # handed out, on_finish(request) when a request ends (metrics, tests).
        self.listeners: list[object] = []
        # "Type: message" of the last failed step, None once a step has run since (or none ever failed):
        # a server's /health reports it, so a balancer stops routing to an engine whose every step fails.
        self.failure: str | None = None

    # ---------------------------------------------------------------------------------------------
    # Caller side (any thread)
    # ---------------------------------------------------------------------------------------------

    def check(self, prompt: object, params: SamplingParams) -> tuple[list[int], SamplingParams]:
        """The prompt as ids and the params normalized; InputError before anything is queued."""
        runtime = self.runtime
        [ids] = check_prompts([prompt], runtime.vocab_size, runtime.tokenizer)
        params = params.checked(runtime.vocab_size)
        mode = "greedy" if params.temperature == 0 else "sample"
        if mode not in self.modes and not (mode == "greedy" and "sample" in self.modes):
            raise InputError(f"this runtime was compiled without the {mode!r} step; recompile with modes including it")
        if params.stop and runtime.tokenizer is None:
            raise InputError("stop strings need a tokenizer and the checkpoint has none; use stop_token_ids")
        runtime.check_length(ids, params.max_tokens)
        return ids, params

    def submit(
        self, prompt: object, params: SamplingParams, out: queue.SimpleQueue | None = None, tag: object = None
    ) -> RequestHandle:
        """Queue one request; its items go to `out` (a fresh queue by default) as (tag, item)."""
        return self.submit_all([(prompt, params, tag)], out)[0]

    def submit_all(
        self, items: list[tuple[object, SamplingParams, object]], out: queue.SimpleQueue | None = None
    ) -> list[RequestHandle]:
        """Queue (prompt, params, tag) requests together (admitted together when slots allow: one prefill);
        all are checked first, so a bad one queues none."""
        requests = []
        for prompt, params, tag in items:
            ids, params = self.check(prompt, params)
            if params.stop_token_ids is None:
                stops = frozenset(token_id(t, "the checkpoint's EOS ids") for t in self.runtime.eos_token_ids)
            else:
                stops = frozenset(params.stop_token_ids)
            seed = int(ops.row_seeds(params.seed, 1)[0])
            requests.append(Request(next(self._ids), ids, params, stops, seed, out or queue.SimpleQueue(), tag))
        with self._wake:
            if self._exiting:  # its loop has ended for good: queueing would wait forever
                raise RuntimeError("the graphspec engine has stopped: the interpreter is exiting")
            self._waiting.extend(requests)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._loop, name="graphspec-engine", daemon=True)
                self._thread.start()
            self._wake.notify()
        return [RequestHandle(request) for request in requests]

    @property
    def load(self) -> tuple[int, int]:
        """(cache slots in use, waiting requests), for /metrics and /health."""
        return max(self.buckets) - len(self._free), len(self._waiting)

    # ---------------------------------------------------------------------------------------------
    # Engine side (the loop thread only)
    # ---------------------------------------------------------------------------------------------

    def stop_at_exit(self) -> None:
        """Wake the loop thread, let it end after the step it is in, and wait for it (requests still
        live or waiting get no more tokens: nobody is left to read them)."""
        with self._wake:
            self._exiting = True
            self._wake.notify_all()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(EXIT_JOIN_S)

    def _loop(self) -> None:
        while True:
            with self._wake:
                if self._exiting:
                    self._thread = None
                    return
                if not self._live and not self._waiting:
                    self._wake.wait(IDLE_EXIT_S)
                    if self._exiting or (not self._live and not self._waiting):
                        # Idle: end the thread (submit starts another) so an unused Runtime can be freed.
                        self._thread = None
                        return
                newcomers, admitted = [], 0
                while self._waiting and admitted < len(self._free):
                    newcomers.append(self._waiting.popleft())
                    admitted += not newcomers[-1].cancelled.is_set()  # cancelled ones leave without a slot
            # Start-up compiles and captures everything; any the requests cause are counted (Runtime.stats).
            compiles, cpu_compiles, captures = TRITON_COMPILES.count, compiled_graphs(), COUNTERS.captures
            try:
                self._drop_cancelled()
                self._admit(newcomers)
                if self._live:
                    self._step()
                    self.failure = None
            except Exception as error:  # a bug, not a bad request: fail what is running, keep serving
                log.exception("engine step failed; failing the live requests")
                self.failure = f"{type(error).__name__}: {error}"
                failed = {r.id: r for r in [*self._live, *newcomers] if r.finish_reason is None}
                for request in failed.values():
                    request.finish_reason = "error"
                    self._release(request)
                    request.out.put((request.tag, error))
                self._live, self._loaded = [], None
            finally:
                stats = self.runtime.stats
                stats.triton_compiles_during_requests += TRITON_COMPILES.count - compiles
                stats.cpu_compiles_during_requests += compiled_graphs() - cpu_compiles
                stats.captures_during_requests += COUNTERS.captures - captures

    def _release(self, request: Request) -> None:
        if request.slot >= 0:
            self._free.append(request.slot)
            request.slot = -1

    def _finish(self, request: Request, reason: str) -> None:
        request.finish_reason = reason
        tokenizer = self.runtime.tokenizer
        text = request.text
        if text is None and tokenizer is not None:
            text = tokenizer.decode(request.emitted)
        result = GenerationResult(
            list(request.emitted),
            text,
            reason,
            request.stats,
            list(request.logprobs) if request.params.logprobs else None,
            len(request.prompt),
        )
        for listener in self.listeners:
            listener.on_finish(request)
        self._release(request)  # before the caller hears of it: its slot is free once it has the result
        request.out.put((request.tag, result))

    def _drop_cancelled(self) -> None:
        kept = []
        for request in self._live:
            if request.cancelled.is_set():
                self._finish(request, "cancelled")
            else:
                kept.append(request)
        self._live = kept

    def _row_params(self, requests: list[Request]) -> dict[str, torch.Tensor]:
        device = self.runtime.device
        return {
            "temperature": torch.tensor([r.params.temperature for r in requests], dtype=torch.float32, device=device),
            "top_k": torch.tensor([r.params.top_k for r in requests], dtype=torch.int64, device=device),
            "top_p": torch.tensor([r.params.top_p for r in requests], dtype=torch.float32, device=device),
            "seed": torch.tensor([r.seed for r in requests], dtype=torch.int64, device=device),
            "step_counter": torch.zeros(len(requests), dtype=torch.int64, device=device),
        }

    def _admit(self, newcomers: list[Request]) -> None:
        """Prefill the newcomers into free slots and emit their first token; the unfinished join the step."""
        for request in newcomers:
            if request.cancelled.is_set():
                self._finish(request, "cancelled")
        newcomers = [r for r in newcomers if r.finish_reason is None]
        if not newcomers:
            return
        for request in newcomers:
            request.slot = self._free.pop(0)
        params = self._row_params(newcomers)
        slots = [r.slot for r in newcomers]
        first = self.runtime.prefill([r.prompt for r in newcomers], slots, params).tolist()
        for request, token in zip(newcomers, first, strict=True):
            self._commit(request, [token])
            if request.finish_reason is None:
                self._live.append(request)

    def _commit(self, request: Request, tokens: list[int]) -> None:
        """Hand `tokens` (just committed) to the caller, cut after the first stop."""
        params = request.params
        start = len(request.prompt) + len(request.emitted)  # the position of tokens[0]
        taken = []
        reason = None
        for token in tokens:
            taken.append(token)
            request.emitted.append(token)
            if token in request.stops:
                reason = "stop"
            elif params.stop and self._hits_stop_string(request):
                reason = "stop"
            elif len(request.emitted) >= params.max_tokens:
                reason = "length"
            if reason:
                break
        logprobs = None
        if params.logprobs:
            logprobs = self.runtime.token_logprobs(request.slot, request.prompt + request.emitted, start)
            request.logprobs.extend(logprobs)
        request.out.put((request.tag, Delta(taken, logprobs)))
        if reason:
            self._finish(request, reason)

    def _hits_stop_string(self, request: Request) -> bool:
        text = self.runtime.tokenizer.decode(request.emitted)
        cut = stop_string_cut(text, request.params.stop, request.text_checked)
        # The last character may be an incomplete UTF-8 sequence that a later token completes: keep it
        # searchable next time.
        request.text_checked = max(0, len(text) - 1)
        if cut is None:
            return False
        request.text = text[:cut]
        return True

    def _step(self) -> None:
        runtime = self.runtime
        rows = len(self._live)
        mode = "sample" if any(r.params.temperature > 0 for r in self._live) or "greedy" not in self.modes else "greedy"
        bucket = pick_bucket(rows, self.buckets)
        graph = runtime.graphs[(mode, bucket)]
        ids = tuple(r.id for r in self._live)
        if self._loaded is None or self._loaded[1:] != (bucket, ids):
            self._load(bucket)
            ids = tuple(r.id for r in self._live)
        self._loaded = (mode, bucket, ids)
        start = time.perf_counter()
        outputs = graph()
        for name, target in FEEDBACK.items():
            graph.buffers.inputs[target].copy_(outputs[name])
        # The one host read per step: emitted tokens and accepted counts together.
        host = torch.cat((outputs["tokens"], outputs["num_accepted"][:, None]), dim=1).cpu()
        stats = runtime.stats
        stats.graph_steps += 1
        stats.step_seconds += time.perf_counter() - start
        accepted_counts = []
        drafted = host.shape[1] - 2  # tokens [B, K+1] of this bucket's K, then the accepted count
        for row, request in enumerate(self._live):
            accepted = int(host[row, -1])
            accepted_counts.append(accepted)
            request.stats.steps += 1
            request.stats.accepted_per_step.append(accepted)
            stats.record(drafted, accepted)
            before = len(request.emitted)
            self._commit(request, host[row, : accepted + 1].tolist())
            stats.emitted += len(request.emitted) - before
        for listener in self.listeners:
            listener.on_step(graph.buffers, rows, accepted_counts)
        self._live = [r for r in self._live if r.finish_reason is None]

    def _load(self, bucket: int) -> None:
        """Put the live rows' per-row values into `bucket`'s buffers: continuing rows gathered (on the
        device) from the buffers they were in, newcomers from their requests."""
        device = self.runtime.device
        previous = {}
        if self._loaded is not None:
            _, old_bucket, old_ids = self._loaded
            previous = {request_id: position for position, request_id in enumerate(old_ids)}
            old = self.runtime.buffers[old_bucket].inputs
        carried = [r for r in self._live if r.id in previous]
        fresh = [r for r in self._live if r.id not in previous]
        parts: list[dict[str, torch.Tensor]] = []
        if carried:
            index = torch.tensor([previous[r.id] for r in carried], device=device)
            parts.append({name: old[name].index_select(0, index) for name in _ROW_VALUES})
        if fresh:
            parts.append(
                {
                    **self._row_params(fresh),
                    "last_tokens": torch.tensor([[r.prompt[-1], r.emitted[0]] for r in fresh], device=device),
                    "committed_len": torch.tensor([len(r.prompt) + 1 for r in fresh], device=device),
                    "slot_ids": torch.tensor([r.slot for r in fresh], device=device),
                    "step_counter": torch.ones(len(fresh), dtype=torch.int64, device=device),
                }
            )
        values = {name: torch.cat([part[name] for part in parts]) for name in _ROW_VALUES}
        self._live = carried + fresh
        self.runtime.buffers[bucket].load_rows(values)
        assert self.runtime.state[TARGET_CACHE].shape[2] > max(r.slot for r in self._live)
