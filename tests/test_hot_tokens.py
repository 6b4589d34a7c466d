"""Building a token map from text (graphspec/hot_tokens.py) with a word tokenizer whose ids are
predictable ("wi" is id i): most frequent ids first, ties by id, special tokens always in; and the
`graphspec token-map` command that writes the file."""

from __future__ import annotations

import shutil
from collections import Counter
from pathlib import Path

import pytest

from graphspec.cli import main
from graphspec.drafters.token_map import read_token_map
from graphspec.errors import InputError
from graphspec.hot_tokens import build_token_map, rank_ids
from tests.test_cli import add_word_tokenizer

SPECIAL = [0, 1, 2]  # the word tokenizer's unk, bos, eos (w0, w1, w2)


@pytest.fixture(scope="module")
def target(checkpoint_factory, tmp_path_factory):
    directory = Path(shutil.copytree(checkpoint_factory("llama", 0), tmp_path_factory.mktemp("hot") / "target"))
    add_word_tokenizer(directory)
    return directory


@pytest.fixture
def corpus(tmp_path):
    """w5 and w9 three times each, w6 twice, w3 and w7 once, over two files in nested folders; a file
    with another suffix is not text and is not read."""
    (tmp_path / "corpus" / "sub").mkdir(parents=True)
    (tmp_path / "corpus" / "a.txt").write_text("w5 w6 w5 w7 w9")
    (tmp_path / "corpus" / "sub" / "b.md").write_text("w6 w5 w9\nw9 w3")
    (tmp_path / "corpus" / "weights.bin").write_text("w100 w100 w100 w100")
    return tmp_path / "corpus"


def test_most_frequent_ids_follow_the_special_tokens_ties_by_id(target, corpus):
    ids, facts = build_token_map(target, corpus, size=6)
    assert ids == [*SPECIAL, 5, 9, 6]
    assert facts == {"files": 2, "tokens": 10, "distinct": 5, "vocab_size": 128, "coverage_per_mille": 800}


def test_a_map_larger_than_the_corpus_holds_every_id_seen(target, corpus):
    ids, _ = build_token_map(target, corpus / "a.txt", size=50)
    assert ids == [*SPECIAL, 5, 6, 7, 9]


def test_rank_ids_keeps_ids_inside_the_vocabulary():
    assert rank_ids(Counter({7: 1, 200: 9, 4: 1}), always=[2, 2], size=3, vocab_size=128) == [2, 4, 7]


@pytest.mark.parametrize(
    ("size", "corpus_name", "message"),
    [
        (2, "corpus", "size 2 is smaller than the 3 special tokens"),
        (129, "corpus", "size 129 exceeds the target's vocabulary of 128"),
        (4, "absent", "no such file or directory"),
        (4, "empty", "holds no text files"),
    ],
)
def test_bad_requests_are_refused(target, corpus, tmp_path, size, corpus_name, message):
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match=message):
        build_token_map(target, tmp_path / corpus_name, size)


def test_token_map_command_writes_a_map_the_mtp_drafter_reads(target, corpus, tmp_path, capsys):
    out = tmp_path / "hot.safetensors"
    assert main(["token-map", str(target), str(corpus), "--size", "5", "--out", str(out)]) == 0
    assert read_token_map(out, 128).tolist() == [*SPECIAL, 5, 9]
    printed = capsys.readouterr().out
    assert f"token map: {out}: 5 of 128 ids, covering 60.0% of 10 tokens in 2 file(s)" in printed
    assert f"--draft mtp --token-map {out}" in printed
