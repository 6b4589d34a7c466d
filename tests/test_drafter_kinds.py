"""graphspec/drafter_kinds.py: the names the CLI offers are the drafter classes' kinds."""

from __future__ import annotations

from graphspec import drafter_kinds, drafters
from graphspec.drafters.ngram import NGram


def test_the_kinds_are_the_drafter_classes_kinds_in_order():
    assert tuple(drafters.KINDS) == drafter_kinds.KINDS
    assert all(cls.kind == kind for kind, cls in drafters.KINDS.items())
    assert set(drafter_kinds.NAMED_KINDS) <= set(drafter_kinds.KINDS)


def test_the_ngram_default_is_the_drafters():
    assert (NGram().ngram_min, NGram().ngram_max) == drafter_kinds.DEFAULT_NGRAM
