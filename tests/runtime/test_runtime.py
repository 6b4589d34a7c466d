"""Runtime.generate()/stream() as a client calls them: one call at a time (concurrent use is refused,
never corrupted) and seeds that belong to the request, not to its position in the batch."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import graphspec
from graphspec.errors import InputError, RuntimeBusyError

PROMPTS = [[3, 4, 5], [7, 8, 9, 10]]
OTHER = [[11, 12], [13, 14, 15, 16, 17], [18]]
SAMPLING = dict(max_new_tokens=10, temperature=1.0, stop_token_ids=[])
GREEDY = dict(max_new_tokens=10, stop_token_ids=[])
WAIT_S = 300  # only bounds a hang if the code under test deadlocks; nothing asserts on time


@pytest.fixture(scope="module")
def runtime(checkpoint_factory) -> graphspec.Runtime:
    return graphspec.Runtime.from_pretrained(
        checkpoint_factory("llama", 0),
        checkpoint_factory("llama", 1, num_hidden_layers=1),
        k=2,
        batch_sizes=(1, 4),
        dtype="float32",
        device="cpu",
        max_seq_len=64,
    )


def token_ids(results) -> list[list[int]]:
    return [result.token_ids for result in results]


# --------------------------------------------------------------------------------------------------
# One call at a time
# --------------------------------------------------------------------------------------------------


def test_generate_while_another_thread_streams_is_refused_and_the_stream_is_intact(runtime):
    solo = token_ids(runtime.generate(PROMPTS, **GREEDY))
    started, resume, streamed = threading.Event(), threading.Event(), []

    def stream_in_background() -> None:
        tokens = runtime.stream(PROMPTS, **GREEDY)
        streamed.append(next(tokens))
        started.set()
        resume.wait(WAIT_S)
        streamed.extend(tokens)

    thread = threading.Thread(target=stream_in_background, daemon=True)
    thread.start()
    try:
        assert started.wait(WAIT_S)
        with pytest.raises(RuntimeBusyError, match="already generating"):
            runtime.generate(OTHER, **GREEDY)
    finally:
        resume.set()
        thread.join(WAIT_S)
    results = {index: item for index, item in streamed if not isinstance(item, int)}
    assert [results[index].token_ids for index in range(len(PROMPTS))] == solo


def test_threads_sharing_a_runtime_get_their_own_tokens_or_a_busy_error(runtime):
    batches = [PROMPTS, OTHER, [[20, 21, 22]], [[23], [24, 25]]]
    solo = [token_ids(runtime.generate(batch, **GREEDY)) for batch in batches]
    barrier = threading.Barrier(len(batches))
    outcomes: list[object] = [None] * len(batches)

    def run(index: int) -> None:
        barrier.wait(WAIT_S)
        try:
            outcomes[index] = token_ids(runtime.generate(batches[index], **GREEDY))
        except RuntimeBusyError as error:
            outcomes[index] = error

    threads = [threading.Thread(target=run, args=(index,), daemon=True) for index in range(len(batches))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(WAIT_S)
    assert any(isinstance(outcome, list) for outcome in outcomes)
    for index, outcome in enumerate(outcomes):
        assert isinstance(outcome, RuntimeBusyError) or outcome == solo[index], index


def test_a_second_open_stream_is_refused_until_the_first_finishes(runtime):
    solo = token_ids(runtime.generate(PROMPTS, **GREEDY))
    first = runtime.stream(PROMPTS, **GREEDY)
    head = next(first)
    with pytest.raises(RuntimeBusyError, match="unfinished stream"):
        next(runtime.stream(OTHER, **GREEDY))
    rest = [head, *first]
    assert [item.token_ids for _, item in rest if not isinstance(item, int)] == solo
    assert token_ids(runtime.generate(PROMPTS, **GREEDY)) == solo  # free again once exhausted


def test_closing_an_unfinished_stream_frees_the_runtime(runtime):
    opened = runtime.stream(PROMPTS, **GREEDY)
    next(opened)
    opened.close()
    assert len(runtime.generate(PROMPTS, **GREEDY)) == 2


def test_refused_input_leaves_the_runtime_free(runtime):
    with pytest.raises(InputError):
        runtime.generate([[]], **GREEDY)
    assert len(runtime.generate(PROMPTS, **GREEDY)) == 2


# --------------------------------------------------------------------------------------------------
# Seeds belong to the request
# --------------------------------------------------------------------------------------------------


def test_a_seeded_request_gives_the_same_tokens_at_any_index_and_beside_any_requests(runtime):
    prompt = PROMPTS[1]
    alone = token_ids(runtime.generate([prompt], seed=5, **SAMPLING))[0]
    second = token_ids(runtime.generate([OTHER[0], prompt], seed=5, **SAMPLING))[1]
    split = token_ids(runtime.generate([*OTHER, *PROMPTS, prompt], seed=5, **SAMPLING))[5]  # 6 rows: 2 chunks
    assert alone == second == split


def test_a_list_of_seeds_gives_each_prompt_its_own(runtime):
    alone = token_ids(runtime.generate([PROMPTS[1]], seed=5, **SAMPLING))[0]
    third = token_ids(runtime.generate([*OTHER[:2], PROMPTS[1]], seed=[9, 3, 5], **SAMPLING))[2]
    assert third == alone
    same = token_ids(runtime.generate([PROMPTS[0]] * 2, seed=5, **SAMPLING))
    different = token_ids(runtime.generate([PROMPTS[0]] * 2, seed=[5, 6], **SAMPLING))
    assert same[0] == same[1] == different[0]
    assert different[1] != different[0]


@pytest.mark.parametrize(("seed", "words"), [([1], "one int per prompt"), ([1, -2], "seed"), ("7", "seed")])
def test_bad_seeds_are_refused(runtime, seed, words):
    with pytest.raises(InputError, match=words):
        runtime.generate(PROMPTS, seed=seed, **SAMPLING)


# --------------------------------------------------------------------------------------------------
# Inputs: clear graphspec errors, numpy prompts
# --------------------------------------------------------------------------------------------------


def test_a_2d_numpy_array_is_one_prompt_per_row(runtime):
    array = np.array([[3, 4, 5], [7, 8, 9]], dtype=np.int64)
    assert token_ids(runtime.generate(array, **GREEDY)) == token_ids(runtime.generate(array.tolist(), **GREEDY))


@pytest.mark.parametrize(
    ("stop_token_ids", "words"),
    [(5, r"write \[id\]"), ([5, 128], r"outside the vocabulary \[0, 128\): \[128\]"), ("5", "list of token ids")],
)
def test_bad_stop_token_ids_are_refused_with_the_reason(runtime, stop_token_ids, words):
    with pytest.raises(InputError, match=words):
        runtime.generate(PROMPTS, max_new_tokens=4, stop_token_ids=stop_token_ids)


def test_empty_stop_token_ids_turn_stopping_off(runtime):
    results = runtime.generate(PROMPTS, max_new_tokens=6, stop_token_ids=[])
    assert [(len(r.token_ids), r.finish_reason) for r in results] == [(6, "length")] * 2
