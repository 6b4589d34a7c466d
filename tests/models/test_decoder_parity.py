"""graphspec's own decoder against transformers on the same checkpoint, for every supported family:
prefill logits and cached incremental-decode logits agree within 1e-4 relative error (fp32, CPU); the same
with the post-attention norms folded into gate/up (models/fold_norms.py) where a family allows it."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from graphspec.models import load_model
from graphspec.models.spec import rope_frequencies
from tests.checkpoints import LLAMA3_ROPE, load_hf, make_checkpoint, tiny_config

# name -> (family, config overrides). Each entry exercises a different code path of the decoder.
VARIANTS = {
    "llama": ("llama", {}),
    "llama3_rope_tied": ("llama", {"rope_scaling": LLAMA3_ROPE, "tie_word_embeddings": True}),
    "llama_biases": ("llama", {"attention_bias": True, "mlp_bias": True}),
    "mistral": ("mistral", {}),
    "qwen2": ("qwen2", {}),  # q/k/v bias
    "qwen3": ("qwen3", {}),  # per-head q/k RMSNorm
    "qwen3_bias": ("qwen3", {"attention_bias": True}),  # Qwen3's attention_bias also biases o_proj
}
# The variants whose norms fold (the others have biases the fold refuses: tests/models/test_fold_norms.py).
FOLDABLE = ("llama", "llama3_rope_tied", "mistral", "qwen2", "qwen3")
FORMS = [(name, folded) for name in VARIANTS for folded in (False, True) if name in FOLDABLE or not folded]
FORM_IDS = [f"{name}-folded" if folded else name for name, folded in FORMS]
RELATIVE_TOLERANCE = 1e-4
PROMPT_LENGTHS = (7, 19, 12)  # right-padded in one prefill; decoded together afterwards
DECODE_STEPS = 5
SLOTS, SLOT_IDS = 4, (2, 0, 3)  # rows live in non-identity slots, one slot unused


class Case:
    """One variant's checkpoint loaded both ways, plus fixed random token sequences."""

    def __init__(self, directory: Path, folded: bool = False) -> None:
        self.hf = load_hf(directory)
        self.model = load_model(directory, fold_norms=folded).model
        assert (self.model.model.layers[0].mlp.folded_norm_eps is not None) == folded
        generator = torch.Generator().manual_seed(1)
        vocab = self.model.spec.vocab_size
        self.prompts = [torch.randint(0, vocab, (n,), generator=generator) for n in PROMPT_LENGTHS]
        self.decode_tokens = torch.randint(0, vocab, (len(PROMPT_LENGTHS), DECODE_STEPS), generator=generator)
        self._hf_logits: list[torch.Tensor] | None = None

    def hf_logits(self) -> list[torch.Tensor]:
        """transformers' logits [L, V] over prompt + decode tokens, one row at a time, no padding, no cache."""
        if self._hf_logits is None:
            with torch.no_grad():
                self._hf_logits = [
                    self.hf(torch.cat((prompt, decoded))[None]).logits[0]
                    for prompt, decoded in zip(self.prompts, self.decode_tokens, strict=True)
                ]
        return self._hf_logits


@pytest.fixture(scope="module")
def cases(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Case]:
    made: dict[tuple[str, bool], Case] = {}
    directories: dict[str, Path] = {}

    def get(name: str, folded: bool = False) -> Case:
        if name not in directories:
            family, overrides = VARIANTS[name]
            directories[name] = make_checkpoint(tmp_path_factory.mktemp(f"parity_{name}"), family, seed=3, **overrides)
        if (name, folded) not in made:
            made[name, folded] = Case(directories[name], folded)
        return made[name, folded]

    return get


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    return ((actual - expected).abs().max() / expected.abs().max()).item()


def prefill(case: Case, in_place: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded batch prefill; returns logits [B, T, V] and the cache."""
    model = case.model
    longest = max(PROMPT_LENGTHS)
    tokens = torch.zeros((len(case.prompts), longest), dtype=torch.int64)
    for row, prompt in enumerate(case.prompts):
        tokens[row, : len(prompt)] = prompt
    cache = model.new_cache(SLOTS, longest + DECODE_STEPS, torch.float32, "cpu")
    start = torch.zeros(len(case.prompts), dtype=torch.int64)
    with torch.no_grad():
        logits, new_cache = model(tokens, start, torch.tensor(SLOT_IDS), cache, output="logits", in_place=in_place)
    return logits, cache if in_place else new_cache


@pytest.mark.parametrize(("variant", "folded"), FORMS, ids=FORM_IDS)
def test_prefill_logits_match_transformers(cases, variant: str, folded: bool) -> None:
    case = cases(variant, folded)
    logits, _ = prefill(case, in_place=True)
    for row, length in enumerate(PROMPT_LENGTHS):
        expected = case.hf_logits()[row][:length]
        assert relative_error(logits[row, :length], expected) < RELATIVE_TOLERANCE, f"row {row}"


@pytest.mark.parametrize(("variant", "folded"), [("llama", False), ("qwen3_bias", False), ("qwen3", True)])
def test_last_position_path_matches_the_full_pass_and_transformers(cases, variant: str, folded: bool) -> None:
    """forward(last_index=...) (prefill's first token): each row's last prompt position through the last
    layer alone gives the full pass's final hidden state there, and transformers' logits; the cache (the
    last layer's K/V of every position included) is the full pass's, bit for bit."""
    case = cases(variant)
    model = case.model
    longest = max(PROMPT_LENGTHS)
    tokens = torch.zeros((len(case.prompts), longest), dtype=torch.int64)
    for row, prompt in enumerate(case.prompts):
        tokens[row, : len(prompt)] = prompt
    start, slots = torch.zeros(len(case.prompts), dtype=torch.int64), torch.tensor(SLOT_IDS)
    last_index = torch.tensor(PROMPT_LENGTHS) - 1
    with torch.no_grad():
        full, full_cache = model(tokens, start, slots, model.new_cache(SLOTS, longest, torch.float32, "cpu"))
        (hidden, last), cache = model(
            tokens, start, slots, model.new_cache(SLOTS, longest, torch.float32, "cpu"), last_index=last_index
        )
    rows = torch.arange(len(PROMPT_LENGTHS))
    assert torch.equal(hidden, full) and torch.equal(cache, full_cache)
    assert last.shape == (len(PROMPT_LENGTHS), model.spec.hidden_size)
    torch.testing.assert_close(last, full[rows, last_index], rtol=1e-5, atol=1e-5)
    for row, length in enumerate(PROMPT_LENGTHS):
        expected = case.hf_logits()[row][length - 1]
        assert relative_error(model.logits(last[row]), expected) < RELATIVE_TOLERANCE, f"row {row}"


@pytest.mark.parametrize("in_place", [True, False], ids=["in_place", "functional"])
@pytest.mark.parametrize(("variant", "folded"), FORMS, ids=FORM_IDS)
def test_incremental_decode_logits_match_transformers(cases, variant: str, folded: bool, in_place: bool) -> None:
    # Rows of different lengths decode in lockstep, each at its own position, through the KV cache
    # that the padded prefill left behind (including dead entries past each row's prompt).
    case = cases(variant, folded)
    _, cache = prefill(case, in_place)
    lengths = torch.tensor(PROMPT_LENGTHS)
    slots = torch.tensor(SLOT_IDS)
    for step in range(DECODE_STEPS):
        tokens = case.decode_tokens[:, step : step + 1]  # [B, 1]
        with torch.no_grad():
            logits, new_cache = case.model(tokens, lengths + step, slots, cache, output="logits", in_place=in_place)
        cache = cache if in_place else new_cache
        for row, length in enumerate(PROMPT_LENGTHS):
            expected = case.hf_logits()[row][length + step]
            assert relative_error(logits[row, 0], expected) < RELATIVE_TOLERANCE, f"step {step} row {row}"


def test_decode_touches_only_its_rows_slots(cases) -> None:
    # The unused slot must stay all zeros: writes go to slot_ids[b], never elsewhere.
    case = cases("llama")
    _, cache = prefill(case, in_place=True)
    unused = sorted(set(range(SLOTS)) - set(SLOT_IDS))
    assert unused and cache[:, :, unused].abs().sum() == 0
    assert all(cache[:, :, slot].abs().sum() > 0 for slot in SLOT_IDS)


def test_llama3_variant_really_scales_rope() -> None:
    # Guards the parity test above: with these tiny dims the llama3 rule must change some frequencies,
    # otherwise matching transformers would prove nothing about scaled rope.
    scaled, _ = rope_frequencies(tiny_config("llama", rope_scaling=LLAMA3_ROPE))
    plain, _ = rope_frequencies(tiny_config("llama"))
    assert scaled.shape == plain.shape
    assert not torch.allclose(scaled, plain)
    assert torch.equal(scaled[0], plain[0])  # the highest frequency is left alone by llama3 scaling


def test_tied_variant_really_ties(cases) -> None:
    model = cases("llama3_rope_tied").model
    assert model.lm_head.weight is model.model.embed_tokens.weight
