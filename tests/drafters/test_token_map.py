"""Reduced draft vocabularies from a token-map file (graphspec/drafters/token_map.py) on the MTP drafter:
its draft logits are the full-vocabulary ones on the mapped ids and -inf elsewhere, rejection sampling
over them still emits the target's distribution (G-test), and every bad map, or a map for a drafter that
takes none, is refused before any weight is read."""

from __future__ import annotations

import re

import pytest
import torch
from safetensors.torch import save_file

import graphspec
from graphspec.drafters.mtp import Mtp
from graphspec.drafters.token_map import read_token_map, scatter_to_vocab, write_token_map
from graphspec.errors import InputError
from graphspec.models.loading import load_model
from tests.checkpoints import make_mtp_checkpoint
from tests.drafters.rejection import sample_and_verify
from tests.test_ops import g_test_p_value

VOCAB = 128
HOT = torch.tensor([5, 0, 77, 3, 127, 64, 12, 2, 90, 41])  # unsorted, both ends of the vocabulary


@pytest.fixture(scope="module")
def mtp_dir(tmp_path_factory):
    return make_mtp_checkpoint(tmp_path_factory.mktemp("token_map"), "deepseek_v3", seed=3)


@pytest.fixture(scope="module")
def drafters(mtp_dir, tmp_path_factory):
    """(full-vocabulary MTP drafter, the same head with the HOT map) on one loaded target."""
    target = load_model(mtp_dir)
    path = write_token_map(tmp_path_factory.mktemp("map") / "hot.safetensors", HOT)
    return Mtp(target, torch.float32, "cpu"), Mtp(target, torch.float32, "cpu", token_map=path)


def test_draft_logits_are_the_full_ones_on_mapped_ids_and_minus_inf_elsewhere(drafters):
    full, hot = drafters
    assert hot.describe() == {"kind": "mtp", "layers": 1, "layout": "deepseek_v3", "draft_vocab_size": len(HOT)}
    assert hot.params()["hot_lm_head"].shape == (len(HOT), 64)
    out = torch.randn(6, 64, generator=torch.Generator().manual_seed(1))
    want = scatter_to_vocab(*full.draft_scores(full.params(), out), VOCAB)  # [6, V]
    got = scatter_to_vocab(*hot.draft_scores(hot.params(), out), VOCAB)
    torch.testing.assert_close(got[:, HOT], want[:, HOT], rtol=1e-5, atol=1e-5)
    off = torch.ones(VOCAB, dtype=torch.bool).index_fill(0, HOT, False)
    assert bool(torch.isneginf(got[:, off]).all())
    assert bool(torch.isfinite(got[:, HOT]).all())


def test_the_target_lm_head_is_untouched(drafters):
    full, hot = drafters
    assert hot.target.lm_head.weight.shape == (VOCAB, 64)
    ids = HOT.sort().values  # kept ascending (StepView.pick_mapped's greedy rule)
    assert torch.equal(hot.params()["draft_to_target"], ids)
    torch.testing.assert_close(hot.params()["hot_lm_head"], full.target.lm_head.weight[ids], rtol=0, atol=0)


def test_rejection_sampling_over_the_hot_vocabulary_emits_the_target_distribution(drafters):
    """Drafts sampled from the hot distribution (as the step samples them) are mapped ids, and
    verify_rejection's first token follows the target's p, off-map ids included (the residual)."""
    _, hot = drafters
    rows, k = 40_000, 2
    generator = torch.Generator().manual_seed(9)
    out = torch.randn(1, 64, generator=generator)
    draft_logits = scatter_to_vocab(*hot.draft_scores(hot.params(), out), VOCAB).expand(rows, k, VOCAB)
    target = torch.randn(VOCAB, generator=generator) * 1.5
    drafts, tokens, accepted = sample_and_verify(draft_logits, target)
    assert bool(torch.isin(drafts, HOT).all())
    p = torch.softmax(target, -1)
    first = torch.bincount(tokens[:, 0], minlength=VOCAB)
    assert g_test_p_value(first, p) > 1e-3
    assert accepted.gt(0).any()


def test_scatter_to_vocab_places_each_logit_at_its_target_id():
    logits = torch.tensor([[1.0, 2.0, 3.0]])
    full = scatter_to_vocab(logits, torch.tensor([4, 0, 2]), 5)
    assert full.tolist() == [[2.0, float("-inf"), 3.0, float("-inf"), 1.0]]


# --- refusals ----------------------------------------------------------------------------------------


BAD_MAPS = {
    "out of range": ({"hot_token_ids": torch.tensor([1, 128, 3])}, r"1 id\(s\) outside the target vocabulary 0\.\.127"),
    "negative": ({"hot_token_ids": torch.tensor([-1, 3])}, r"outside the target vocabulary .*\[0\]=-1"),
    "duplicates": ({"hot_token_ids": torch.tensor([4, 9, 4])}, r"ids repeat \(\[4\]\)"),
    "wrong dtype": ({"hot_token_ids": torch.tensor([1, 2], dtype=torch.int32)}, "must be int64, found torch.int32"),
    "float": ({"hot_token_ids": torch.tensor([1.0, 2.0])}, "must be int64, found torch.float32"),
    "empty": ({"hot_token_ids": torch.zeros(0, dtype=torch.int64)}, "is empty"),
    "wrong rank": ({"hot_token_ids": torch.tensor([[1, 2]])}, r"must be 1-D, found shape \[1, 2\]"),
    "wrong name": ({"ids": torch.tensor([1, 2])}, r"holds tensors \['ids'\], not exactly one named 'hot_token_ids'"),
    "extra tensor": (
        {"hot_token_ids": torch.tensor([1]), "d2t": torch.tensor([0])},
        "not exactly one named 'hot_token_ids'",
    ),
}


@pytest.fixture
def no_weight_loading(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("weights were loaded before the refusal")

    monkeypatch.setattr("graphspec.compiler.load_model", refuse)


@pytest.mark.parametrize("problem", BAD_MAPS)
def test_bad_map_is_refused_before_any_weight_is_read(mtp_dir, tmp_path, no_weight_loading, problem):
    tensors, message = BAD_MAPS[problem]
    path = tmp_path / "map.safetensors"
    save_file(tensors, str(path))
    with pytest.raises(InputError, match=f"token map {re.escape(str(path))}.* {message}"):
        graphspec.compile(mtp_dir, "mtp", k=2, dtype="float32", device="cpu", max_seq_len=64, token_map=path)


def test_missing_and_unreadable_maps_are_refused(tmp_path):
    with pytest.raises(InputError, match="no such file"):
        read_token_map(tmp_path / "absent.safetensors", VOCAB)
    with pytest.raises(InputError, match="token_map must be a path to a token-map file, got list"):
        read_token_map([1, 2], VOCAB)
    (tmp_path / "text.safetensors").write_text("not a safetensors file")
    with pytest.raises(InputError, match="is not a readable safetensors file"):
        read_token_map(tmp_path / "text.safetensors", VOCAB)


@pytest.mark.parametrize(
    ("draft", "why"),
    [("ngram", "no logits are computed"), ("draft_model", "slicing it is not wired")],
)
def test_drafters_without_a_token_map_refuse_one(mtp_dir, checkpoint_factory, tmp_path, no_weight_loading, draft, why):
    path = write_token_map(tmp_path / "map.safetensors", HOT)
    draft = checkpoint_factory("qwen3", seed=1) if draft == "draft_model" else draft
    with pytest.raises(InputError, match=f"token_map applies to MTP heads, EAGLE-3 heads and DFlash .*: .*{why}"):
        graphspec.compile(mtp_dir, draft, k=2, dtype="float32", device="cpu", max_seq_len=64, token_map=path)


def test_restrict_map_keeps_the_overlap_in_target_id_order():
    from graphspec.drafters.token_map import restrict_map

    draft_to_target = torch.tensor([40, 3, 17, 90, 8])  # a head's draft id -> target id, not sorted
    kept = restrict_map(draft_to_target, torch.tensor([90, 8, 5, 40]), "map")
    assert kept.tolist() == [4, 0, 3]  # target ids 8, 40, 90; 5 is not in the head's vocabulary
    with pytest.raises(InputError, match="map: none of the token map's 2 ids is in the head's draft vocabulary"):
        restrict_map(draft_to_target, torch.tensor([1, 2]), "map")
