"""models/fold_norms.py: what the fold does to the weights, and which models it refuses. (That folded models
still compute transformers' logits: tests/models/test_decoder_parity.py's folded forms; that folded steps are
lossless: tests/e2e/test_generate.py.)"""

from __future__ import annotations

import pytest
import torch

from graphspec import trace
from graphspec.models import load_model
from graphspec.models.fold_norms import fold_norms, fold_refusal
from tests.checkpoints import make_hybrid_checkpoint


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_norm_weight_moves_into_gate_up_once_per_element(checkpoint_factory, dtype: str) -> None:
    directory = checkpoint_factory("llama", seed=4)
    plain, folded = load_model(directory, dtype).model, load_model(directory, dtype, fold_norms=True).model
    for before, after in zip(plain.model.layers, folded.model.layers, strict=True):
        norm = before.post_attention_layernorm
        expected = (before.mlp.gate_up_proj.weight.float() * norm.weight.float()).to(
            before.mlp.gate_up_proj.weight.dtype
        )
        assert torch.equal(after.mlp.gate_up_proj.weight, expected)
        assert after.mlp.folded_norm_eps == norm.eps and before.mlp.folded_norm_eps is None
        assert not hasattr(after, "post_attention_layernorm")
    # The step's declared weights say which form a graph takes: the folded norms are gone from them.
    dropped = set(trace.model_inputs(plain)) - set(trace.model_inputs(folded))
    assert dropped == {f"model.layers.{i}.post_attention_layernorm.weight" for i in range(plain.spec.num_layers)}
    assert set(trace.model_inputs(folded)) < set(trace.model_inputs(plain))


@pytest.mark.parametrize(
    ("family", "overrides", "reason"),
    [
        ("llama", {"mlp_bias": True}, "gate/up projection has a bias"),
        ("qwen3", {"attention_bias": True}, "o projection has a bias"),
    ],
)
def test_biased_models_are_refused_and_load_unfolded(checkpoint_factory, family, overrides, reason) -> None:
    directory = checkpoint_factory(family, seed=2, **overrides)
    model = load_model(directory, fold_norms=True).model  # where the model does not allow it, load does not fold
    assert reason in fold_refusal(model)
    assert all(layer.mlp.folded_norm_eps is None for layer in model.model.layers)
    with pytest.raises(ValueError, match=reason):
        fold_norms(model)


def test_a_hybrid_model_and_a_folded_one_are_refused(checkpoint_factory, tmp_path) -> None:
    hybrid = load_model(make_hybrid_checkpoint(tmp_path / "hybrid", seed=0), fold_norms=True).model
    assert "only DecoderLM folds" in fold_refusal(hybrid)
    folded = load_model(checkpoint_factory("llama", seed=4), fold_norms=True).model
    with pytest.raises(ValueError, match="folded already"):
        fold_norms(folded)
