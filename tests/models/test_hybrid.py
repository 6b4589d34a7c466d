"""graphspec's hybrid model (models/hybrid.py) against transformers' Qwen3_5ForCausalLM and
Qwen3NextForCausalLM on the same checkpoints, loaded through graphspec's real loading code (fp32, CPU):
logits for mixed prompt lengths in one right-padded batch, continued from the cached state; the conv and
recurrent state after prefill equal transformers' cache per layer; right padding never advances a state."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from graphspec.errors import CheckpointError
from graphspec.models import load_model, loading
from graphspec.models.hybrid import CONV_STATE, KV_CACHE, RECURRENT_STATE, HybridLM
from graphspec.models.loading import load_config
from graphspec.models.spec import ModelSpec
from tests.checkpoints import kv_cache, load_hf, make_hybrid_checkpoint, nest_language_model

RELATIVE_TOLERANCE = 1e-4
PROMPT_LENGTHS = (7, 13, 3)  # right-padded in one batch
CONTINUATION = 3  # tokens per row fed afterwards from the cached state, as one more chunk
SLOTS, SLOT_IDS = 4, (2, 0, 3)  # rows live in non-identity slots, one slot unused
MAX_SEQ_LEN = 32


class Case:
    def __init__(self, directory: Path, oracle: Path | None = None) -> None:
        self.hf = load_hf(oracle or directory)
        self.model_dir = directory
        self.model = load_model(directory).model
        generator = torch.Generator().manual_seed(5)
        vocab = self.model.spec.vocab_size
        self.prompts = [torch.randint(0, vocab, (n,), generator=generator) for n in PROMPT_LENGTHS]
        self.more = torch.randint(0, vocab, (len(PROMPT_LENGTHS), CONTINUATION), generator=generator)


@pytest.fixture(scope="module")
def cases(tmp_path_factory: pytest.TempPathFactory):
    made: dict[str, Case] = {}

    def get(name: str) -> Case:
        if name not in made:
            if name == "qwen3_5_multimodal_layout":  # oracle: the same weights in the text layout
                text = make_hybrid_checkpoint(tmp_path_factory.mktemp("hybrid_text"), "qwen3_5_text", seed=3)
                nested = nest_language_model(text, tmp_path_factory.mktemp("hybrid_nested") / "ckpt")
                made[name] = Case(nested, oracle=text)
            else:
                made[name] = Case(make_hybrid_checkpoint(tmp_path_factory.mktemp(f"hybrid_{name}"), name, seed=3))
        return made[name]

    return get


FAMILIES = ("qwen3_5_text", "qwen3_next", "qwen3_5_multimodal_layout")


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    return ((actual - expected).abs().max() / expected.abs().max()).item()


def padded(prompts: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    tokens = torch.zeros((len(prompts), max(len(p) for p in prompts)), dtype=torch.int64)
    for row, prompt in enumerate(prompts):
        tokens[row, : len(prompt)] = prompt
    return tokens, torch.tensor([len(p) for p in prompts])


def prefill(model: HybridLM, prompts: list[torch.Tensor], slot_ids: tuple[int, ...], state=None):
    """One right-padded batch from position 0 into slots poisoned with NaN; returns logits [B, T, V] and
    the state (written in place)."""
    tokens, lengths = padded(prompts)
    if state is None:  # NaN: a new sequence must start from zero state whatever its slot held
        state = {
            name: value.fill_(float("nan"))
            for name, value in model.new_state(SLOTS, MAX_SEQ_LEN, torch.float32, "cpu").items()
        }
    start = torch.zeros(len(prompts), dtype=torch.int64)
    with torch.no_grad():
        logits, state = model(tokens, start, torch.tensor(slot_ids), state, "logits", in_place=True, lengths=lengths)
    return logits, state


@pytest.mark.parametrize("name", FAMILIES)
def test_logits_match_transformers_for_mixed_prompt_lengths(cases, name):
    case = cases(name)
    logits, state = prefill(case.model, case.prompts, SLOT_IDS)
    lengths = torch.tensor(PROMPT_LENGTHS)
    with torch.no_grad():  # one more chunk per row, continuing each slot's state after its own prompt
        more, _ = case.model(case.more, lengths, torch.tensor(SLOT_IDS), state, "logits", in_place=True)
        for row, prompt in enumerate(case.prompts):
            expected = case.hf(torch.cat((prompt, case.more[row]))[None]).logits[0]  # no padding, no cache
            assert relative_error(logits[row, : len(prompt)], expected[: len(prompt)]) < RELATIVE_TOLERANCE
            assert relative_error(more[row], expected[len(prompt) :]) < RELATIVE_TOLERANCE


@pytest.mark.parametrize("name", ("qwen3_5_text", "qwen3_next"))
def test_prefill_state_equals_the_transformers_cache_per_layer(cases, name):
    case = cases(name)
    _, state = prefill(case.model, case.prompts, SLOT_IDS)
    linear_layers = case.model.spec.linear_layers
    for row, prompt in enumerate(case.prompts):
        with torch.no_grad():
            cache = kv_cache(case.hf(prompt[None], use_cache=True))
        for index, layer in enumerate(linear_layers):
            hf_layer = cache.layers[layer]
            # transformers keeps the last W conv inputs, graphspec the last W-1 (all the next step reads).
            conv = hf_layer.conv_states[0][0, :, 1:]
            torch.testing.assert_close(state[CONV_STATE][index, SLOT_IDS[row]], conv, rtol=1e-5, atol=1e-6)
            recurrent = hf_layer.recurrent_states[0][0]
            torch.testing.assert_close(state[RECURRENT_STATE][index, SLOT_IDS[row]], recurrent, rtol=1e-4, atol=1e-5)


def test_batched_padded_prefill_equals_per_row_prefill(cases):
    case = cases("qwen3_5_text")
    _, batched = prefill(case.model, case.prompts, SLOT_IDS)
    state = {
        name: value.fill_(float("nan"))
        for name, value in case.model.new_state(SLOTS, MAX_SEQ_LEN, torch.float32, "cpu").items()
    }
    for row, prompt in enumerate(case.prompts):
        prefill(case.model, [prompt], (SLOT_IDS[row],), state)
    for name in (CONV_STATE, RECURRENT_STATE):  # right padding left no trace in any state
        torch.testing.assert_close(batched[name], state[name], rtol=1e-5, atol=1e-6, equal_nan=True)
    for row, length in enumerate(PROMPT_LENGTHS):  # the KV cache agrees on every live position
        live = batched[KV_CACHE][:, :, SLOT_IDS[row], :, :length]
        torch.testing.assert_close(live, state[KV_CACHE][:, :, SLOT_IDS[row], :, :length], rtol=1e-5, atol=1e-6)


def test_declares_snapshot_rollback_for_linear_state(cases):
    rules = {
        state.name: state.rollback for state in cases("qwen3_5_text").model.states(SLOTS, MAX_SEQ_LEN, 2, torch.float32)
    }
    assert rules == {KV_CACHE: "length", CONV_STATE: "snapshot", RECURRENT_STATE: "snapshot"}


def test_mixture_of_experts_hybrid_is_refused(tmp_path):
    directory = make_hybrid_checkpoint(
        tmp_path, "qwen3_next", num_experts=4, num_experts_per_tok=2, moe_intermediate_size=8
    )
    with pytest.raises(CheckpointError, match="mixture-of-experts"):
        ModelSpec.from_config(load_config(directory))


@pytest.mark.parametrize("name", FAMILIES)
def test_a_resolved_config_stands_in_only_where_it_gives_the_same_model(cases, name, tmp_path):
    """The text-layout families' configs stand in for config.json (an artifact loads them without the
    family's config class) and give the same model; the multimodal wrapper's nested config does not."""
    case = cases(name)
    directory = case.model_dir
    config = load_config(directory)
    stands = loading.stands_in_for(config, json.loads((directory / "config.json").read_text()))
    assert stands == (name != "qwen3_5_multimodal_layout")
    if stands:
        with loading.known_configs({directory: loading.config_record(config)}):
            again = load_model(directory).model
        assert again.spec == case.model.spec and torch.equal(again.inv_freq, case.model.inv_freq)
        assert all(torch.equal(again.state_dict()[k], v) for k, v in case.model.state_dict().items())
