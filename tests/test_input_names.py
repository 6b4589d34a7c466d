"""graphspec/input_names.py: one spelling of the weight inputs' names, read back by the registry and the runtime."""

from __future__ import annotations

from graphspec.input_names import is_draft_weight, is_weight_input, weight_input_names
from graphspec.trace import StepSignature
from graphspec.trace_prefill import PrefillSignature


def test_names_and_their_readers_agree() -> None:
    names = weight_input_names(("embed.weight", "norm.weight"), ("fc.weight",))
    assert names == ("target.embed.weight", "target.norm.weight", "draft.fc.weight")
    assert all(is_weight_input(name) for name in names)
    assert [is_draft_weight(name) for name in names] == [False, False, True]
    for other in ("tokens", "target_cache", "draft_cache", "targets.x", "committed_len"):
        assert not is_weight_input(other) and not is_draft_weight(other), other


def test_step_and_prefill_signatures_name_weights_this_way() -> None:
    step = StepSignature(("a.weight",), ("b.weight",), ("target_cache",))
    prefill = PrefillSignature(("a.weight",), ("b.weight",), ("target_cache",))
    for signature in (step, prefill):
        assert signature.input_names[:2] == weight_input_names(("a.weight",), ("b.weight",))
        assert not any(is_weight_input(name) for name in signature.input_names[2:])
