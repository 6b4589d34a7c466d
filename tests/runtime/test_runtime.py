"""Runtime.generate()/stream() as a client calls them: from any number of threads and open streams at
once (the engine batches them; nobody gets another's tokens), and seeds that belong to the request, not
to its position in the batch."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import graphspec
from graphspec.errors import InputError

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
# Many callers at once
# --------------------------------------------------------------------------------------------------


def test_threads_sharing_a_runtime_each_get_the_tokens_they_get_alone(runtime):
    batches = [PROMPTS, OTHER, [[20, 21, 22]], [[23], [24, 25]]]
    solo = [token_ids(runtime.generate(batch, **GREEDY)) for batch in batches]
    barrier = threading.Barrier(len(batches))
    outcomes: list[object] = [None] * len(batches)

    def run(index: int) -> None:
        barrier.wait(WAIT_S)
        outcomes[index] = token_ids(runtime.generate(batches[index], **GREEDY))

    threads = [threading.Thread(target=run, args=(index,), daemon=True) for index in range(len(batches))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(WAIT_S)
    assert outcomes == solo


def test_two_open_streams_advanced_in_turn_both_finish_with_their_own_tokens(runtime):
    solo = token_ids(runtime.generate(PROMPTS, **GREEDY)), token_ids(runtime.generate(OTHER, **GREEDY))
    streams = runtime.stream(PROMPTS, **GREEDY), runtime.stream(OTHER, **GREEDY)
    results: tuple[dict, dict] = ({}, {})
    open_streams = {0, 1}
    while open_streams:  # one item from each in turn: neither waits on the other
        for which in sorted(open_streams):
            item = next(streams[which], None)
            if item is None:
                open_streams.discard(which)
            elif not isinstance(item[1], int):
                results[which][item[0]] = item[1].token_ids
    assert [results[0][i] for i in range(2)] == solo[0]
    assert [results[1][i] for i in range(3)] == solo[1]


def test_closing_an_unfinished_stream_cancels_its_prompts_and_frees_their_slots(runtime):
    solo = token_ids(runtime.generate(PROMPTS, **GREEDY))
    opened = runtime.stream([*OTHER, [26, 27]], max_new_tokens=40, stop_token_ids=[])
    next(opened)
    opened.close()
    # Four more prompts need all four slots: they run only once the cancelled ones left theirs.
    assert token_ids(runtime.generate([*PROMPTS, *PROMPTS], **GREEDY)) == solo + solo


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
