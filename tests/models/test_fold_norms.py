"""models/fold_norms.py: what the fold does to the weights, and which models it refuses. (That folded models
still compute transformers' logits: tests/models/test_decoder_parity.py's folded forms; that folded steps are
lossless: tests/e2e/test_generate.py.)"""

from __future__ import annotations

import logging

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from graphspec import ops, trace
from graphspec.models import load_model
from graphspec.models.decoder import FOLDED_INPUT_MAX_TOKENS, FOLDED_MAX_ROWS
from graphspec.models.fold_norms import fold_norms, fold_refusal
from tests.checkpoints import make_hybrid_checkpoint


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_norm_weights_move_into_their_projections_once_per_element(checkpoint_factory, dtype: str) -> None:
    directory = checkpoint_factory("llama", seed=4)
    plain, folded = load_model(directory, dtype).model, load_model(directory, dtype, fold_norms=True).model

    def scaled(linear, norm):  # W * g along the input columns, one rounding per element
        return (linear.weight.float() * norm.weight.float()).to(linear.weight.dtype)

    for before, after in zip(plain.model.layers, folded.model.layers, strict=True):
        assert torch.equal(
            after.mlp.gate_up_proj.weight, scaled(before.mlp.gate_up_proj, before.post_attention_layernorm)
        )
        assert torch.equal(after.self_attn.qkv_proj.weight, scaled(before.self_attn.qkv_proj, before.input_layernorm))
        assert after.mlp.folded_norm_eps == before.post_attention_layernorm.eps and before.mlp.folded_norm_eps is None
        assert after.self_attn.folded_norm_eps == before.input_layernorm.eps
        assert before.self_attn.folded_norm_eps is None
        assert not hasattr(after, "post_attention_layernorm") and not hasattr(after, "input_layernorm")
    # The step's declared weights say which form a graph takes: the folded norms are gone from them, and the ones
    # that weigh them where a program keeps the norm kernel (many rows) are there.
    dropped = set(trace.model_inputs(plain)) - set(trace.model_inputs(folded))
    layers = range(plain.spec.num_layers)
    assert dropped == {
        f"model.layers.{i}.{norm}.weight" for i in layers for norm in ("input_layernorm", "post_attention_layernorm")
    }
    assert set(trace.model_inputs(folded)) - set(trace.model_inputs(plain)) == {"folded_norm_weight"}
    assert torch.equal(
        folded.folded_norm_weight, torch.ones(plain.spec.hidden_size, dtype=folded.folded_norm_weight.dtype)
    )


def test_biased_q_k_v_keep_their_input_norm(checkpoint_factory) -> None:
    """Qwen2's q/k/v have biases, which a row scale would scale too: only the post-attention norms fold."""
    directory = checkpoint_factory("qwen2", seed=4)
    plain, folded = load_model(directory).model, load_model(directory, fold_norms=True).model
    for before, after in zip(plain.model.layers, folded.model.layers, strict=True):
        assert after.mlp.folded_norm_eps is not None and after.self_attn.folded_norm_eps is None
        assert torch.equal(after.self_attn.qkv_proj.weight, before.self_attn.qkv_proj.weight)
        assert torch.equal(after.input_layernorm.weight, before.input_layernorm.weight)
    tokens, start, slots = torch.tensor([[3, 1, 4]]), torch.zeros(1, dtype=torch.int64), torch.arange(1)
    with torch.no_grad():
        torch.testing.assert_close(
            *(model(tokens, start, slots, model.new_cache(1, 16, torch.float32, "cpu"), output="logits")[0]
              for model in (folded, plain)), rtol=1e-5, atol=1e-5,
        )  # fmt: skip


@pytest.mark.parametrize(
    ("family", "overrides", "reason"),
    [
        ("llama", {"mlp_bias": True}, "gate/up projection has a bias"),
        ("qwen3", {"attention_bias": True}, "o projection has a bias"),
    ],
)
def test_biased_models_are_refused_and_load_unfolded(checkpoint_factory, caplog, family, overrides, reason) -> None:
    directory = checkpoint_factory(family, seed=2, **overrides)
    with caplog.at_level(logging.INFO, logger="graphspec"):
        model = load_model(directory, fold_norms=True).model  # where the model does not allow it, load does not fold
    assert reason in fold_refusal(model)
    assert any("keeps its norms" in record.message and reason in record.message for record in caplog.records)
    assert all(layer.mlp.folded_norm_eps is None for layer in model.model.layers)
    with pytest.raises(ValueError, match=reason):
        fold_norms(model)


def test_a_hybrid_model_and_a_folded_one_are_refused(checkpoint_factory, tmp_path) -> None:
    hybrid = load_model(make_hybrid_checkpoint(tmp_path / "hybrid", seed=0), fold_norms=True).model
    assert "only DecoderLM folds" in fold_refusal(hybrid)
    folded = load_model(checkpoint_factory("llama", seed=4), fold_norms=True).model
    with pytest.raises(ValueError, match="folded already"):
        fold_norms(folded)


@pytest.mark.parametrize(
    ("rows", "prefill"),
    [
        ((1, 1), False),
        ((4, 1), False),
        ((2, 3), False),
        ((2, 3), True),
        ((2, FOLDED_INPUT_MAX_TOKENS + 1), False),
        ((2, FOLDED_MAX_ROWS // 2 + 1), False),
    ],
    ids=["one row", "one token per row", "few tokens per row", "with a last position", "more tokens", "many rows"],
)
def test_few_rows_take_the_folded_form_and_many_keep_the_norm_kernel(checkpoint_factory, rows, prefill) -> None:
    """A folded model runs the folded form (addmm into the residual, scaled_silu_mul) in programs of up to
    FOLDED_MAX_ROWS rows and the norm kernels (weighted by ones) above; its input norms take theirs (the down
    projection added into the residual, row_scale on q/k/v) in programs of up to FOLDED_INPUT_MAX_TOKENS tokens per
    row that compute no last position (a decode, a draft forward, a verify); a program of one row projects gate/up
    and takes the scaled SwiGLU as one op (scaled_silu_mul_linear). Every form computes the unfolded model's
    forward."""
    directory = checkpoint_factory("llama", seed=4)
    plain, folded = load_model(directory).model, load_model(directory, fold_norms=True).model
    tokens = torch.randint(0, plain.spec.vocab_size, rows, generator=torch.Generator().manual_seed(0))
    start, slots = torch.tensor([3, 0, 7, 1])[: rows[0]], torch.arange(rows[0])
    last = {"last_index": torch.tensor([rows[1] - 1, rows[1] // 2])} if prefill else {}

    def forward(model):
        cache = model.new_cache(rows[0], 64, torch.float32, "cpu")
        return model(tokens, start, slots, cache, output="logits", **last)[0]

    with torch.no_grad():
        torch.testing.assert_close(forward(folded), forward(plain), rtol=1e-5, atol=1e-5)
    targets = [node.target for node in make_fx(lambda: forward(folded))().graph.nodes]
    few = tokens.numel() <= FOLDED_MAX_ROWS
    folded_input = few and rows[1] <= FOLDED_INPUT_MAX_TOKENS and not prefill
    one_row = tokens.numel() == 1
    assert targets.count(ops.OPS["scaled_silu_mul_linear"]) == (plain.spec.num_layers if one_row else 0)
    assert (ops.OPS["scaled_silu_mul"] in targets) == (few and not one_row)
    assert (ops.OPS["silu_mul"] in targets) != few
    # o projections add into the residual (and the last position's), so do the down projections that feed a folded
    # input norm
    layers = plain.spec.num_layers
    addmms = 0 if not few else 2 * layers - 1 if folded_input else layers + 1 if prefill else layers
    assert targets.count(torch.ops.aten.addmm.default) == addmms
    assert targets.count(ops.OPS["row_scale"]) == (layers if folded_input else 0)
