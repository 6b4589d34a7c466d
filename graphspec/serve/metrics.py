"""Prometheus metrics of a server, named like vLLM's (`vllm:` -> `graphspec:`), on the server's own
registry. Speculative-decoding counters come from the engine's loop thread after every step; request
latencies from the HTTP side, where the client's clock runs."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class Metrics:
    """An engine listener (on_step, on_finish) plus the request-side histograms."""

    def __init__(self, k_for: Callable[[int], int], k: int, model: str, load: Any, stats: Any) -> None:
        """k_for(bucket): the drafts per step of that bucket's graphs (SpecConfig.k_for); k: the largest."""
        self.registry = CollectorRegistry()
        labels = {"model_name": model}
        names = list(labels)

        def counter(name: str, doc: str, extra: tuple[str, ...] = ()) -> Counter:
            return Counter(f"graphspec:{name}", doc, [*names, *extra], registry=self.registry)

        def histogram(name: str, doc: str, buckets: tuple[float, ...]) -> Any:
            return Histogram(f"graphspec:{name}", doc, names, buckets=buckets, registry=self.registry).labels(**labels)

        self.k_for = k_for
        self.labels = labels
        self.drafts = counter("spec_decode_num_drafts", "Speculation steps, one per live row per step").labels(**labels)
        self.draft_tokens = counter("spec_decode_num_draft_tokens", "Draft tokens proposed").labels(**labels)
        self.accepted_tokens = counter("spec_decode_num_accepted_tokens", "Draft tokens accepted").labels(**labels)
        per_position = counter(
            "spec_decode_num_accepted_tokens_per_pos", "Accepted draft tokens by draft position", ("position",)
        )
        self.accepted_per_position = [per_position.labels(**labels, position=str(i)) for i in range(k)]
        self.tokens_per_step = histogram(
            "spec_decode_tokens_per_step", "Tokens one row commits per step (accepted + 1)", tuple(range(1, k + 2))
        )
        self.generation_tokens = counter("generation_tokens", "Tokens generated").labels(**labels)
        self.prompt_tokens = counter("prompt_tokens", "Prompt tokens prefilled").labels(**labels)
        self.finished = counter("request_success", "Finished requests by reason", ("finished_reason",))
        self.ttft = histogram("time_to_first_token_seconds", "Time to first token", LATENCY_BUCKETS)
        self.itl = histogram(
            "inter_token_latency_seconds", "Time between two streamed deltas (one step's tokens)", LATENCY_BUCKETS
        )
        self.e2e = histogram("e2e_request_latency_seconds", "Request latency, arrival to last token", LATENCY_BUCKETS)
        running = Gauge(
            "graphspec:num_requests_running", "Requests holding a cache slot", names, registry=self.registry
        )
        waiting = Gauge("graphspec:num_requests_waiting", "Requests waiting for a slot", names, registry=self.registry)
        running.labels(**labels).set_function(lambda: load()[0])
        waiting.labels(**labels).set_function(lambda: load()[1])
        # Start-up compiles and captures everything; what a request had to do instead (alert above 0).
        late = Gauge(
            "graphspec:startup_work_during_requests",
            "Triton compiles, CPU step compiles and CUDA graph captures that happened inside requests",
            [*names, "work"],
            registry=self.registry,
        )
        for work in ("triton_compiles", "cpu_compiles", "captures"):
            late.labels(**labels, work=work).set_function(lambda w=work: getattr(stats(), f"{w}_during_requests"))

    # Engine listener: called on the engine's loop thread.
    def on_step(self, buffers: Any, rows: int, accepted: list[int]) -> None:
        self.drafts.inc(rows)
        self.draft_tokens.inc(rows * self.k_for(buffers.bucket))
        self.accepted_tokens.inc(sum(accepted))
        for count in accepted:
            for position in range(count):
                self.accepted_per_position[position].inc()
            self.tokens_per_step.observe(count + 1)

    def on_finish(self, request: Any) -> None:
        self.generation_tokens.inc(len(request.emitted))
        self.prompt_tokens.inc(len(request.prompt))
        self.finished.labels(**self.labels, finished_reason=request.finish_reason).inc()
