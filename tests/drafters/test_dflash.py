"""The DFlash drafter against transformers' own DFlash assistant (MuseGlimmerAssistantModel, tests/
dflash_oracle.py) fed transformers' hidden states: the captured layer outputs, the block's draft logits
for a batch of prompts of different lengths (both checkpoint layouts), rejection sampling with its
independent per-slot q, an empty batch, and the start-up refusals before any weight is read."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

import graphspec
from graphspec import ops
from graphspec.drafters import drafter_kind
from graphspec.drafters.base import PrefillView, StepView
from graphspec.drafters.dflash import DFlash
from graphspec.errors import CheckpointError, InputError
from graphspec.models.loading import load_model
from tests.checkpoints import load_hf
from tests.dflash_oracle import load_oracle, make_dflash_drafter
from tests.test_ops import g_test_p_value

SLOTS, MAX_SEQ, VOCAB, MASK = 3, 64, 128, 3
LAYER_IDS = (0, 3)  # a middle layer's output and the last one's (transformers' normed hidden_states[L])


@pytest.fixture(scope="module")
def target_dir(checkpoint_factory):
    return checkpoint_factory("llama", seed=11, num_hidden_layers=4)


@pytest.fixture(scope="module", params=["zlab", "muse"])
def case(request, target_dir, tmp_path_factory):
    drafter_dir = make_dflash_drafter(
        tmp_path_factory.mktemp("dflash"), target_dir, seed=5, block_size=4, layer_ids=LAYER_IDS,
        mask_token_id=MASK, layout=request.param,
    )  # fmt: skip
    target = load_model(target_dir)
    return target, DFlash(drafter_dir, target, torch.float32, "cpu"), load_hf(target_dir), load_oracle(drafter_dir)


def test_drafter_directory_is_recognized_and_described(case):
    _, drafter, _, _ = case
    assert drafter_kind(drafter.loaded.path) == "dflash"
    assert drafter.describe() == {"kind": "dflash", "block_size": 4, "target_layer_ids": [0, 3], "mask_token_id": 3}
    assert drafter.target_features == ("layer_in:1", "final")


def test_captured_features_are_transformers_layer_outputs(case):
    """target_layer_ids name layer OUTPUTS: transformers' hidden_states[i + 1] (the last one normed)."""
    target, drafter, hf_target, _ = case
    tokens = torch.randint(0, VOCAB, (2, 7), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        hidden_states = hf_target(tokens, output_hidden_states=True).hidden_states
    cache = target.model.new_cache(2, 16, torch.float32, "cpu")
    (_, features), _ = target.model(
        tokens, torch.zeros(2, dtype=torch.int64), torch.arange(2), cache, "hidden_and_features",
        capture=drafter.target_features,
    )  # fmt: skip
    want = torch.cat([hidden_states[i + 1] for i in LAYER_IDS], dim=-1)
    torch.testing.assert_close(features, want, rtol=1e-4, atol=1e-5)


@torch.no_grad()
def oracle_block_logits(hf_target, oracle, prompt: torch.Tensor, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(first token, draft logits [block-1, V]) as transformers' DFlashTokenCandidateGenerator computes
    them after prefill: context = hidden_states[i + 1] of the prompt, noise = [first, MASK x (block-1)]."""
    out = hf_target(prompt[None], output_hidden_states=True)
    context = torch.cat([out.hidden_states[i + 1] for i in LAYER_IDS], dim=-1)
    first = out.logits[0, -1].argmax()
    noise = hf_target.model.embed_tokens(torch.tensor([[int(first)] + [MASK] * (block - 1)]))
    positions = torch.arange(prompt.shape[0] + block)[None]
    hidden = oracle(noise_embeds=noise, context_hidden_states=context, position_ids=positions).last_hidden_state
    return first, hf_target.lm_head(hidden[0, 1:])


@pytest.mark.parametrize("k", [3, 2, 1])
def test_block_logits_equal_transformers_assistant_for_a_mixed_batch(case, k):
    """Two prompts of different lengths prefilled together (right padding), one step each in other slots:
    every mask slot's logits equal MuseGlimmerAssistantModel's, and the drafts are their argmax. Below
    block_size - 1 drafts (k 2 and 1 of a block-4 drafter) the block is [first, MASK x k], as vLLM runs
    num_speculative_tokens below the block: the assistant's forward over that shorter block."""
    _, drafter, hf_target, oracle = case
    generator = torch.Generator().manual_seed(2)
    lengths = [11, 5]
    prompts = [torch.randint(4, VOCAB, (n,), generator=generator) for n in lengths]
    expected = [oracle_block_logits(hf_target, oracle, prompt, k + 1) for prompt in prompts]
    tokens = torch.zeros(2, max(lengths), dtype=torch.int64)
    for row, prompt in enumerate(prompts):
        tokens[row, : len(prompt)] = prompt
    with torch.no_grad():
        states = hf_target(tokens, output_hidden_states=True).hidden_states  # causal: padding is after each prompt
    features = torch.cat([states[i + 1] for i in LAYER_IDS], dim=-1)
    first = torch.stack([token for token, _ in expected])
    state = {s.name: s.allocate("cpu") for s in drafter.states(SLOTS, MAX_SEQ, k, torch.float32)}
    slots, length = torch.tensor([2, 0]), torch.tensor(lengths)
    drafter.prefill(PrefillView(tokens, slots, length, states[-1], first, features), state)
    last = torch.stack([prompt[-1] for prompt in prompts])
    inputs = {"committed_len": length + 1, "slot_ids": slots, "last_tokens": torch.stack((last, first), 1)}
    proposal = drafter.propose(drafter.params(), StepView(inputs, k, lambda logits, i: ops.argmax(logits)), state)
    assert proposal.tokens.shape == (2, k)
    for row, (_, logits) in enumerate(expected):
        torch.testing.assert_close(proposal.logits[row], logits, rtol=1e-4, atol=1e-4)
        assert proposal.tokens[row].tolist() == logits.argmax(-1).tolist()


def test_empty_batch_runs_the_drafter(case):
    """No rows at all (the review's idle-forward crash): the proposal is empty, nothing fails."""
    _, drafter, _, _ = case
    state = {s.name: s.allocate("cpu") for s in drafter.states(SLOTS, MAX_SEQ, 3, torch.float32)}
    empty = torch.zeros(0, dtype=torch.int64)
    inputs = {"committed_len": empty, "slot_ids": empty, "last_tokens": torch.zeros(0, 2, dtype=torch.int64)}
    proposal = drafter.propose(drafter.params(), StepView(inputs, 3, lambda logits, i: ops.argmax(logits)), state)
    assert proposal.tokens.shape == (0, 3) and proposal.logits.shape == (0, 3, VOCAB)


def test_rejection_sampling_with_independent_slot_drafts_emits_the_target_distribution(target_dir, tmp_path):
    """Each draft is sampled from its own mask slot's distribution (not chained on the previous draft):
    verify_rejection's first emitted token still follows the target's p. q: the assistant's slot logits
    over the first 32 ids (a small vocabulary keeps 20k rows fast)."""
    oracle = load_oracle(make_dflash_drafter(tmp_path, target_dir, seed=5, layer_ids=LAYER_IDS, mask_token_id=MASK))
    _, logits = oracle_block_logits(load_hf(target_dir), oracle, torch.arange(4, 13), 4)  # [3, V]
    rows, k, vocab = 20_000, 3, 32
    draft_logits = logits[None, :, :vocab].expand(rows, k, vocab)
    target = torch.randn(vocab, generator=torch.Generator().manual_seed(9))
    params = (torch.full((rows,), 1.0), torch.zeros(rows, dtype=torch.int64), torch.ones(rows))
    seeds, counter = torch.arange(rows, dtype=torch.int64), torch.zeros(rows, dtype=torch.int64)
    drafts = torch.stack(
        [ops.sample(draft_logits[:, i], *params, seeds, counter, ops.DRAFT_LANE + i) for i in range(k)], 1
    )
    tokens, accepted = ops.verify_rejection(
        target.expand(rows, k + 1, vocab), draft_logits, drafts, *params, seeds, counter
    )
    first = torch.bincount(tokens[:, 0], minlength=vocab)
    assert g_test_p_value(first, torch.softmax(target, -1)) > 1e-3
    assert accepted.gt(0).any()


# --- refusals, all before the target's weights load ------------------------------------------------


def edit_drafter(directory, config=None, tensors=None):
    if config:
        raw = json.loads((directory / "config.json").read_text())
        raw.update(config)
        (directory / "config.json").write_text(json.dumps(raw))
    if tensors:
        state = load_file(directory / "model.safetensors")
        state.update(tensors)
        save_file(state, directory / "model.safetensors")
    return directory


def dflash_config(**fields) -> dict:
    return {"dflash_config": {"target_layer_ids": list(LAYER_IDS), "mask_token_id": MASK, **fields}}


REFUSALS = {
    "layer ids out of range": (
        dflash_config(target_layer_ids=[0, 4]),
        3,
        r"target_layer_ids \[0, 4\] name layers \[4\] outside the target's 4 layers",
    ),
    "layer ids repeated": (dflash_config(target_layer_ids=[1, 1]), 3, r"target_layer_ids \[1, 1\] name a layer twice"),
    "feature width": (
        dflash_config(target_layer_ids=[0, 1, 2]),
        3,
        r"fc\.weight is \[64, 128\]: it reads features 128 wide, but len\(target_layer_ids\) x the target's "
        r"hidden_size is 3 x 64 = 192",
    ),
    "k above block - 1": ({}, 4, r"block_size 4 drafts at most 3 tokens per step .* but k=4; compile with k <= 3"),
    "block of one": ({"block_size": 1}, 3, r"block_size 1: a DFlash block needs the last token and at least one mask"),
    "mask token": (dflash_config(mask_token_id=128), 3, r"mask_token_id 128 is outside the target's vocabulary"),
    "no mask token": ({"dflash_config": {"target_layer_ids": [0, 3]}}, 3, "mask_token_id is missing"),
    "hidden size": ({"hidden_size": 32}, 3, r"hidden_size 32 is not the target's 64"),
}


@pytest.mark.parametrize("problem", REFUSALS)
def test_bad_drafter_is_refused_before_any_weight_is_read(target_dir, tmp_path, no_weight_loading, problem):
    config, k, message = REFUSALS[problem]
    drafter = make_dflash_drafter(tmp_path / "d", target_dir, seed=6, layer_ids=LAYER_IDS, mask_token_id=MASK)
    edit_drafter(drafter, config=config)
    with pytest.raises(InputError, match=message):
        graphspec.compile(target_dir, drafter, k=k, dtype="float32", device="cpu", max_seq_len=64)


def test_sliding_window_shorter_than_the_cache_is_refused(target_dir, tmp_path, no_weight_loading):
    """transformers' DFlash config defaults to sliding layers; graphspec's block attention has no window."""
    drafter = make_dflash_drafter(
        tmp_path / "d", target_dir, seed=6, layer_ids=LAYER_IDS, mask_token_id=MASK, layout="muse",
        layer_types=["sliding_attention"] * 2, sliding_window=32,
    )  # fmt: skip
    with pytest.raises(InputError, match=r"max_seq_len=64 exceeds the drafter's sliding_window=32"):
        graphspec.compile(target_dir, drafter, k=3, dtype="float32", device="cpu", max_seq_len=64)


def test_stored_tensors_must_fit(target_dir, tmp_path, no_weight_loading):
    drafter = make_dflash_drafter(tmp_path / "d", target_dir, seed=6, layer_ids=LAYER_IDS, mask_token_id=MASK)
    edit_drafter(drafter, tensors={"embed_tokens.weight": torch.zeros(VOCAB, 64)})
    with pytest.raises(CheckpointError, match=r"unexpected tensors: embed_tokens\.weight"):
        graphspec.compile(target_dir, drafter, k=3, dtype="float32", device="cpu", max_seq_len=64)
