"""graphspec.inputs: what generate() accepts (ints from Python, numpy or torch) and what it refuses, with
messages that say what is wrong. Runtime and the reference decoder both use it (their own tests check
that bad input is refused before any work)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from graphspec.errors import InputError
from graphspec.inputs import check_max_new_tokens, check_prompts, check_sampling, check_stop_token_ids, token_id


class WordTokenizer:
    """A stand-in with the transformers call convention: tokenizer(text)["input_ids"]."""

    def __call__(self, text: str) -> dict[str, list[int]]:
        return {"input_ids": [len(word) for word in text.split()]}


def test_integer_ids_from_python_numpy_and_torch_are_accepted() -> None:
    assert token_id(5, "x") == 5 and token_id(np.int64(5), "x") == 5 and token_id(torch.tensor(5), "x") == 5
    prompts = [[1, 2], np.array([3, 4]), torch.tensor([5, 6])]
    assert check_prompts(prompts, 10) == [[1, 2], [3, 4], [5, 6]]
    assert check_prompts(torch.tensor([[1, 2], [3, 4]]), 10) == [[1, 2], [3, 4]]  # one prompt per row


def test_a_2d_numpy_array_is_one_prompt_per_row() -> None:
    assert check_prompts(np.array([[1, 2], [3, 4]]), 10) == [[1, 2], [3, 4]]
    with pytest.raises(InputError, match="int token ids"):
        check_prompts(np.array([[1.0, 2.0]]), 10)


def test_strings_are_encoded_with_the_tokenizer() -> None:
    assert check_prompts(["ab cde", [7]], 10, WordTokenizer()) == [[2, 3], [7]]


@pytest.mark.parametrize(
    ("prompts", "words"),
    [
        ([], "non-empty list"),
        ("hello", "non-empty list"),
        (torch.tensor([1, 2]), "non-empty list"),  # a 1-D tensor is one prompt, not a list of them
        (np.array([1, 2]), "non-empty list"),
        ([[5], []], "prompt 1 is empty"),
        ([[5, 10]], "outside [0, 10): [10]"),
        ([[-1]], "outside [0, 10): [-1]"),
        ([[1.0]], "int token ids"),
        ([[True]], "int token ids"),
        ([torch.tensor([1.0])], "int token ids"),
        (["text"], "no tokenizer"),
        ([b"text"], "must be a list of token ids"),
        ([7], "must be a list of token ids"),
        ([torch.tensor(7)], "must be a list of token ids"),
    ],
    ids=lambda value: None,
)
def test_bad_prompts_are_refused_with_the_reason(prompts, words: str) -> None:
    with pytest.raises(InputError) as info:
        check_prompts(prompts, 10)
    assert words in str(info.value)


@pytest.mark.parametrize(
    ("temperature", "top_k", "top_p", "words"),
    [
        (-0.1, None, None, "temperature"),
        (float("nan"), None, None, "temperature"),
        (float("inf"), None, None, "temperature"),
        (True, None, None, "temperature"),
        (1.0, -1, None, "top_k"),
        (1.0, 2.5, None, "top_k"),
        (1.0, None, 0.0, "top_p"),
        (1.0, None, 1.5, "top_p"),
    ],
)
def test_bad_sampling_settings_are_refused(temperature, top_k, top_p, words: str) -> None:
    with pytest.raises(InputError, match=words):
        check_sampling(temperature, top_k, top_p)


def test_good_sampling_settings_and_lengths_pass() -> None:
    check_sampling(0, None, None)
    check_sampling(0.7, 0, 1.0)
    assert check_max_new_tokens(3) == 3
    for bad in (0, -1, 2.0, True, "3"):
        with pytest.raises(InputError, match="max_new_tokens"):
            check_max_new_tokens(bad)


def test_stop_token_ids_from_python_numpy_and_torch_are_accepted() -> None:
    assert check_stop_token_ids([2, np.int64(3), torch.tensor(4)], 10) == {2, 3, 4}
    assert check_stop_token_ids(np.array([5]), 10) == {5}
    assert check_stop_token_ids((), 10) == set()  # no stop tokens


@pytest.mark.parametrize(
    ("stop_token_ids", "words"),
    [
        (5, "for one id write [id]"),
        (np.int64(5), "list of token ids"),
        ("5", "list of token ids"),
        ([10], "outside the vocabulary [0, 10): [10]"),
        ([-1, 3], "outside the vocabulary [0, 10): [-1]"),
        ([1.5], "int token ids"),
        ([True], "int token ids"),
    ],
    ids=lambda value: None,
)
def test_bad_stop_token_ids_are_refused_with_the_reason(stop_token_ids, words: str) -> None:
    with pytest.raises(InputError) as info:
        check_stop_token_ids(stop_token_ids, 10)
    assert words in str(info.value)
