"""The continuous-batching engine: requests come and go between steps without changing anyone's tokens,
per-request settings share one step, cancellation frees a slot, and logprobs are the target's own."""

from __future__ import annotations

import random
import threading
import weakref

import pytest
import torch

import graphspec
from graphspec.errors import InputError
from graphspec.runtime.engine import Engine
from graphspec.runtime.requests import Delta, GenerationResult, SamplingParams, stop_string_cut
from tests.checkpoints import load_hf

WAIT_S = 300  # only bounds a hang if the code under test deadlocks; nothing asserts on time
BUCKETS = (1, 2, 4)


@pytest.fixture(scope="module")
def pair(checkpoint_factory):
    return checkpoint_factory("llama", 0), checkpoint_factory("llama", 1, num_hidden_layers=1)


@pytest.fixture(scope="module")
def runtime(pair) -> graphspec.Runtime:
    target, draft = pair
    return graphspec.Runtime.from_pretrained(
        target, draft, k=3, batch_sizes=BUCKETS, dtype="float32", device="cpu", max_seq_len=64
    )


class Buckets:
    """Records (bucket, live rows) of every step."""

    def __init__(self) -> None:
        self.steps: list[tuple[int, int]] = []

    def on_step(self, buffers, rows: int, accepted: list[int]) -> None:
        self.steps.append((buffers.bucket, rows))

    def on_finish(self, request) -> None:
        pass


def alone(runtime: graphspec.Runtime, prompt: list[int], params: SamplingParams) -> list[int]:
    return runtime.engine.submit(prompt, params).result().token_ids


def mixed_requests(count: int, seed: int, sampling: bool) -> list[tuple[list[int], SamplingParams]]:
    rng = random.Random(seed)
    requests = []
    for index in range(count):
        prompt = [rng.randrange(3, 128) for _ in range(rng.randrange(1, 20))]
        temperature = rng.choice([0.0, 0.7, 1.0, 1.3]) if sampling else 0.0
        params = SamplingParams(
            max_tokens=rng.randrange(1, 12),
            temperature=temperature,
            top_k=rng.choice([0, 5]) if sampling else 0,
            top_p=rng.choice([1.0, 0.9]) if sampling else 1.0,
            seed=index if sampling else None,
            stop_token_ids=(),
        )
        requests.append((prompt, params))
    return requests


def submit_concurrently(runtime: graphspec.Runtime, requests) -> list[list[int]]:
    """Each request from its own thread, all released at once; their token ids in order."""
    barrier = threading.Barrier(len(requests))
    results: list[list[int] | None] = [None] * len(requests)

    def run(index: int) -> None:
        prompt, params = requests[index]
        barrier.wait(WAIT_S)
        results[index] = runtime.engine.submit(prompt, params).result().token_ids

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(len(requests))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(WAIT_S)
    return results


@pytest.mark.parametrize("sampling", [False, True], ids=["greedy", "seeded_sampling"])
def test_64_concurrent_requests_give_the_tokens_each_gives_alone(runtime, sampling: bool):
    requests = mixed_requests(64, seed=1 if sampling else 0, sampling=sampling)
    solo = [alone(runtime, prompt, params) for prompt, params in requests]
    buckets = Buckets()
    runtime.engine.listeners.append(buckets)
    try:
        together = submit_concurrently(runtime, requests)
    finally:
        runtime.engine.listeners.remove(buckets)
    assert together == solo
    # Every step ran in the smallest bucket that held its rows. (Which buckets occur depends on the order the
    # threads arrive in; the test below pins the shrinking deterministically.)
    assert all(bucket == min(b for b in BUCKETS if b >= rows) for bucket, rows in buckets.steps)


def test_the_bucket_shrinks_as_rows_finish(runtime):
    lengths = (2, 8, 16, 30)  # four rows that finish at different steps
    requests = [([3 + i, 40 + i], SamplingParams(max_tokens=n, stop_token_ids=())) for i, n in enumerate(lengths)]
    buckets = Buckets()
    runtime.engine.listeners.append(buckets)
    try:
        handles = runtime.engine.submit_all([(prompt, params, i) for i, (prompt, params) in enumerate(requests)])
        results = [handle.result().token_ids for handle in handles]
    finally:
        runtime.engine.listeners.remove(buckets)
    assert [len(tokens) for tokens in results] == list(lengths)
    assert buckets.steps[0] == (4, 4) and buckets.steps[-1] == (1, 1)
    assert all(bucket == min(b for b in BUCKETS if b >= rows) for bucket, rows in buckets.steps)
    rows = [rows for _, rows in buckets.steps]
    assert rows == sorted(rows, reverse=True)


def test_greedy_rows_beside_sampled_rows_keep_their_greedy_tokens(runtime):
    greedy = SamplingParams(max_tokens=10, stop_token_ids=())
    sampled = SamplingParams(max_tokens=10, temperature=1.0, seed=3, stop_token_ids=())
    prompts = [[5, 6, 7], [9, 10]]
    solo = [alone(runtime, prompts[0], greedy), alone(runtime, prompts[1], sampled)]
    handles = runtime.engine.submit_all([(prompts[0], greedy, 0), (prompts[1], sampled, 1)])
    assert [handle.result().token_ids for handle in handles] == solo


def test_a_cancelled_request_frees_its_slot_for_a_waiting_one_and_others_are_intact(runtime):
    long = SamplingParams(max_tokens=40, stop_token_ids=())
    prompts = [[3 + i, 40 + i] for i in range(5)]  # 5 requests, 4 slots: the last one waits
    solo = [alone(runtime, prompt, long) for prompt in prompts]
    handles = runtime.engine.submit_all([(prompt, long, index) for index, prompt in enumerate(prompts)])
    doomed = iter(handles[1])
    assert isinstance(next(doomed), Delta)  # it is running (admitted with the first four)
    handles[1].cancel()
    results = [handle.result() for handle in handles]
    assert results[1].finish_reason == "cancelled"
    assert results[1].token_ids == solo[1][: len(results[1].token_ids)]
    assert [r.token_ids for i, r in enumerate(results) if i != 1] == [s for i, s in enumerate(solo) if i != 1]
    assert runtime.engine.load == (0, 0)


def test_deltas_add_up_to_the_result_and_carry_one_to_k_plus_one_tokens(runtime):
    handle = runtime.engine.submit([3, 4, 5], SamplingParams(max_tokens=30, stop_token_ids=()))
    items = list(handle)
    deltas, result = items[:-1], items[-1]
    assert isinstance(result, GenerationResult) and result.finish_reason == "length"
    assert [t for d in deltas for t in d.token_ids] == result.token_ids
    assert all(1 <= len(d.token_ids) <= runtime.k + 1 for d in deltas)


def test_stop_token_ends_the_request_inside_an_accepted_block(runtime):
    full = alone(runtime, [3, 4, 5], SamplingParams(max_tokens=30, stop_token_ids=()))
    stop = full[7]
    cut = runtime.engine.submit([3, 4, 5], SamplingParams(max_tokens=30, stop_token_ids=(stop,))).result()
    assert cut.token_ids == full[: full.index(stop) + 1] and cut.finish_reason == "stop"


def test_logprobs_are_the_targets_own_log_softmax(runtime, pair):
    prompt = [3, 17, 29, 4]
    result = runtime.engine.submit(prompt, SamplingParams(max_tokens=12, stop_token_ids=(), logprobs=True)).result()
    model = load_hf(pair[0])
    sequence = torch.tensor([prompt + result.token_ids])
    with torch.no_grad():
        logits = model(sequence).logits[0].float()  # [T, V]
    expected = torch.log_softmax(logits, dim=-1)[len(prompt) - 1 : -1].gather(1, sequence[0, len(prompt) :, None])
    assert result.logprobs == pytest.approx(expected[:, 0].tolist(), abs=1e-4)


def test_asking_for_logprobs_changes_no_token(runtime):
    params = SamplingParams(max_tokens=20, temperature=1.0, seed=11, stop_token_ids=())
    plain = alone(runtime, [8, 9, 10], params)
    with_logprobs = alone(runtime, [8, 9, 10], SamplingParams(**{**params.__dict__, "logprobs": True}))
    assert with_logprobs == plain


@pytest.mark.parametrize(
    ("params", "words"),
    [
        (SamplingParams(max_tokens=0), "max_new_tokens"),
        (SamplingParams(temperature=float("nan")), "temperature"),
        (SamplingParams(top_p=0.0), "top_p"),
        (SamplingParams(stop_token_ids=(500,)), "outside the vocabulary"),
        (SamplingParams(max_tokens=60), "exceeds max_seq_len"),
        (SamplingParams(stop=("x",)), "tokenizer"),
    ],
)
def test_bad_requests_are_refused_before_queueing(runtime, params, words):
    with pytest.raises(InputError, match=words):
        runtime.engine.submit([3, 4, 5], params)
    assert runtime.engine.load == (0, 0)


def test_input_error_is_a_value_error():
    assert issubclass(InputError, ValueError)


def test_an_idle_engine_thread_ends_and_the_next_submit_starts_one(runtime, monkeypatch):
    engine = Engine(runtime)
    monkeypatch.setattr("graphspec.runtime.engine.IDLE_EXIT_S", 0.01)
    first = engine.submit([3, 4], SamplingParams(max_tokens=3, stop_token_ids=())).result()
    thread = engine._thread
    if thread is not None:
        thread.join(WAIT_S)
    assert engine._thread is None
    assert engine.submit([3, 4], SamplingParams(max_tokens=3, stop_token_ids=())).result().token_ids == first.token_ids


def test_at_exit_every_engine_thread_ends_before_the_interpreter_finalizes(runtime, monkeypatch):
    """A daemon loop thread that wakes while the interpreter finalizes aborts the process; the atexit
    hook ends it first (IDLE_EXIT_S keeps the idle thread alive well past this test's submit)."""
    from graphspec.runtime import engine as engine_module

    engine = Engine(runtime)
    assert engine in engine_module._ENGINES
    # The hook ends every engine for good: let it see only this one (the module's runtime serves on).
    monkeypatch.setattr(engine_module, "_ENGINES", weakref.WeakSet([engine]))
    engine.submit([3, 4], SamplingParams(max_tokens=3, stop_token_ids=())).result()
    thread = engine._thread
    assert thread is not None and thread.is_alive()  # idle, waiting for the next request
    engine_module._stop_engines()  # what atexit runs
    assert not thread.is_alive() and engine._thread is None
    with pytest.raises(RuntimeError, match="interpreter is exiting"):  # refused, not queued forever
        engine.submit([3, 4], SamplingParams(max_tokens=3, stop_token_ids=()))


@pytest.mark.parametrize(
    ("text", "stops", "searched", "cut"),
    [
        ("hello world", ["wor"], 0, 6),
        ("hello world", ["xyz"], 0, None),
        ("hello world", ["o", "w"], 0, 4),
        ("hello world", ["hello"], 5, None),  # ended inside the checked text: found before
        ("hello world", ["lo w"], 5, 3),  # straddles the checked boundary
    ],
)
def test_stop_string_cut_finds_the_earliest_new_match(text, stops, searched, cut):
    assert stop_string_cut(text, stops, searched) == cut


def test_a_failing_step_fails_the_live_requests_and_the_engine_keeps_serving(runtime, monkeypatch):
    params = SamplingParams(max_tokens=8, stop_token_ids=())
    solo = alone(runtime, [3, 4, 5], params)
    real_prefill = runtime.prefill

    def broken(*args, **kwargs):
        raise RuntimeError("injected prefill failure")

    monkeypatch.setattr(runtime, "prefill", broken)
    handles = runtime.engine.submit_all([([3, 4, 5], params, 0), ([6, 7], params, 1)])
    for handle in handles:
        with pytest.raises(RuntimeError, match="injected"):
            handle.result()
    assert runtime.engine.failure == "RuntimeError: injected prefill failure"  # what /health reports
    monkeypatch.setattr(runtime, "prefill", real_prefill)
    assert runtime.engine.load == (0, 0)
    assert alone(runtime, [3, 4, 5], params) == solo
    assert runtime.engine.failure is None  # a step ran since
