"""Choosing and checking a drafter (graphspec/drafters/__init__.py): every refusal comes from configs,
before any weight file is read."""

import pytest

import graphspec
from graphspec.errors import InputError


@pytest.mark.parametrize(
    ("draft", "options", "message"),
    [
        ("ngram", {"ngram_max": 0}, "ngram_max must be an int between 1 and 16"),
        ("ngram", {"ngram_min": 4, "ngram_max": 2}, "must not exceed"),
        ("ngram", {"ngram_size": 2}, "unknown option"),
        ("mtp", {}, "declares no MTP layers"),
        ("mtp", {"ngram_max": 2}, "unknown option"),
        ("eagle3", {}, "names a drafter kind that needs a checkpoint directory"),
    ],
)
def test_bad_drafter_is_refused_before_any_weight_is_read(
    checkpoint_factory, no_weight_loading, draft, options, message
):
    target = checkpoint_factory("llama", seed=0)
    with pytest.raises(InputError, match=message):
        graphspec.compile(target, draft, k=2, dtype="float32", device="cpu", max_seq_len=64, **options)


def test_draft_vocabulary_mismatch_is_refused_before_any_weight_is_read(checkpoint_factory, no_weight_loading):
    target = checkpoint_factory("llama", seed=0)
    draft = checkpoint_factory("llama", seed=1, vocab_size=96)
    with pytest.raises(InputError, match="vocabularies differ"):
        graphspec.compile(target, draft, k=2, dtype="float32", device="cpu", max_seq_len=64)


def test_context_limits_are_refused_before_any_weight_is_read(checkpoint_factory, no_weight_loading):
    target = checkpoint_factory("llama", seed=0)
    with pytest.raises(InputError, match="max_position_embeddings"):
        graphspec.compile(target, "ngram", k=2, dtype="float32", device="cpu", max_seq_len=4096)


@pytest.mark.parametrize(
    ("draft", "drafter", "message"),
    [("ngram", "draft_model", "needs a checkpoint directory"), ("some/dir", "ngram", "takes no checkpoint")],
)
def test_draft_and_drafter_must_agree(checkpoint_factory, no_weight_loading, draft, drafter, message):
    target = checkpoint_factory("llama", seed=0)
    with pytest.raises(InputError, match=message):
        graphspec.compile(target, draft, drafter=drafter, k=2, dtype="float32", device="cpu", max_seq_len=64)


def test_out_that_is_not_an_artifact_is_refused_before_any_weight_is_read(
    checkpoint_factory, no_weight_loading, tmp_path
):
    from graphspec.errors import ArtifactError

    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "todo.txt").write_text("mine")
    target = checkpoint_factory("llama", seed=0)
    with pytest.raises(ArtifactError, match="not a graphspec artifact"):
        graphspec.compile(target, "ngram", k=2, dtype="float32", device="cpu", max_seq_len=64, out=tmp_path / "notes")
    assert (tmp_path / "notes" / "todo.txt").read_text() == "mine"
