"""tools/demo_dflash.py: the training-side DFlash drafter, many anchors per window in one masked pass,
drafts exactly what graphspec's DFlash drafter drafts on the same weights (the context convention:
rows 0..a-1 for the block at anchor a = L-1), and its saved directory loads through graphspec."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from graphspec import ops
from graphspec.drafters.base import PrefillView, StepView
from graphspec.drafters.dflash import DFlash
from graphspec.models.loading import load_model
from tests.checkpoints import load_hf

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tools"))

import demo_dflash  # noqa: E402

BLOCK, MASK, LAYER_IDS = 4, 3, [0, 2]


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def pair(checkpoint_factory, tmp_path_factory):
    """(graphspec target, transformers target, training drafter with random weights, its saved directory)."""
    target_dir = checkpoint_factory("llama", seed=11, num_hidden_layers=4)
    hf_target = load_hf(target_dir)
    config = demo_dflash.drafter_config(hf_target, 2, BLOCK, LAYER_IDS, MASK)
    torch.manual_seed(0)
    drafter = demo_dflash.DFlashDrafter(config)
    with torch.no_grad():  # norms away from 1 and larger weights, so a wrong convention shows
        for name, param in drafter.named_parameters():
            param.copy_(
                1 + 0.1 * torch.randn_like(param) if name.endswith("norm.weight") else 0.3 * torch.randn_like(param)
            )
    directory = tmp_path_factory.mktemp("dflash")
    drafter.save(directory, dtype=torch.float32)
    return load_model(target_dir), hf_target, drafter.eval(), directory


def test_target_layer_ids_follow_zlab():
    assert demo_dflash.zlab_target_layer_ids(36, 5) == [1, 9, 17, 25, 33]
    assert demo_dflash.zlab_target_layer_ids(8, 3) == [1, 3, 5]


@pytest.mark.parametrize("k", [BLOCK - 1, 1])
def test_many_anchors_in_one_pass_equal_graphspec_drafter(pair, k):
    """Every anchor a of a window (one batched, masked pass) gives the logits graphspec's DFlash gives
    after prefilling tokens 0..a-1 and stepping with committed length a + 1 (block [x_a, MASK x K]),
    also for a K below the trained block's (the shorter block measure_acceptance replays)."""
    target, hf_target, drafter, directory = pair
    graphspec_drafter = DFlash(directory, target, torch.float32, "cpu")
    vocab = hf_target.config.vocab_size
    tokens = torch.randint(4, vocab, (1, 14), generator=torch.Generator().manual_seed(3))
    features, _ = demo_dflash.target_features(hf_target, tokens, LAYER_IDS)
    anchors = torch.arange(1, tokens.shape[1] - k)[None]
    with torch.no_grad():
        logits = drafter(hf_target, features, tokens, anchors, block=k + 1)[0]  # [N, K, V]
    for index, anchor in enumerate(anchors[0].tolist()):
        prompt = tokens[:, :anchor]
        with torch.no_grad():
            states = hf_target(prompt, output_hidden_states=True).hidden_states
        prompt_features = torch.cat([states[i + 1] for i in LAYER_IDS], dim=-1)
        state = {s.name: s.allocate("cpu") for s in graphspec_drafter.states(2, 32, k, torch.float32)}
        slots, length = torch.tensor([1]), torch.tensor([anchor])
        nxt = tokens[:, anchor]  # the committed token at position a (the block's first)
        graphspec_drafter.prefill(PrefillView(prompt, slots, length, states[-1], nxt, prompt_features), state)
        inputs = {"committed_len": length + 1, "slot_ids": slots, "last_tokens": torch.stack((prompt[:, -1], nxt), 1)}
        step = StepView(inputs, k, lambda x, i: ops.argmax(x))
        proposal = graphspec_drafter.propose(graphspec_drafter.params(), step, state)
        torch.testing.assert_close(logits[index], proposal.logits[0], rtol=1e-4, atol=1e-4)
