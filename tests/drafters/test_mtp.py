"""The MTP drafter against transformers' MtpModel on the same weights (both checkpoint layouts): the
head's logits, the drafts of one step (catch-up then chained drafts, the chaining convention pinned
against a full-sequence transformers forward), and its refusals before any weight is read."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

import graphspec
from graphspec.drafters import drafter_kind
from graphspec.drafters.base import PrefillView, StepView
from graphspec.drafters.mtp import Mtp
from graphspec.errors import CheckpointError, InputError
from graphspec.models.loading import load_model
from tests.checkpoints import load_hf_mtp, make_mtp_checkpoint, split_nextn_head
from tests.drafters.rejection import assert_drafts_follow_their_logits

SLOTS, MAX_SEQ = 3, 64


@pytest.fixture(scope="module", params=["deepseek_v3", "qwen3_next", "nextn_head_dir"])
def mtp_case(request, tmp_path_factory):
    """The target checkpoint's own head in either layout, or the DeepSeek-V3 one moved to a NextN head
    directory beside a target without MTP weights; the oracle is transformers' MtpModel on the same
    weights either way."""
    layout = "deepseek_v3" if request.param == "nextn_head_dir" else request.param
    directory = make_mtp_checkpoint(tmp_path_factory.mktemp(f"mtp_{request.param}"), layout, seed=3)
    hf_target, hf_mtp = load_hf_mtp(directory, layout)
    if request.param == "nextn_head_dir":
        base = tmp_path_factory.mktemp("nextn")
        target_dir, head_dir = split_nextn_head(directory, base / "target", base / "head")
        assert drafter_kind(head_dir) == "mtp"
        target = load_model(target_dir)
        return layout, target, Mtp(target, torch.float32, "cpu", head_dir), hf_target, hf_mtp
    target = load_model(directory)
    return layout, target, Mtp(target, torch.float32, "cpu"), hf_target, hf_mtp


def hf_pairs_logits(hf_mtp, ids: torch.Tensor, hidden: torch.Tensor, first_position: int) -> tuple[torch.Tensor, ...]:
    """transformers' MTP layer over pairs (ids[t], hidden[t]) at token positions first_position + t, no
    cache (a plain causal forward): post-norm outputs and logits."""
    positions = first_position + torch.arange(ids.shape[1])[None]
    out = hf_mtp.forward_layer(0, hidden, positions, None, input_ids=ids)
    return out, hf_mtp._project_to_logits(out)


def test_head_logits_equal_transformers_mtp_model(mtp_case):
    layout, target, drafter, _, hf_mtp = mtp_case
    assert drafter.describe() == {"kind": "mtp", "layers": 1, "layout": layout}
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 128, (2, 9), generator=generator)
    hidden = torch.randn(2, 9, 64, generator=generator)
    want_out, want_logits = hf_pairs_logits(hf_mtp, ids, hidden, first_position=1)
    cache = drafter.states(SLOTS, MAX_SEQ, 2, torch.float32)[0].allocate("cpu")
    positions = 1 + torch.arange(9).expand(2, -1)
    cos, sin = target.model.rope(positions)
    out, _ = drafter.head(0, ids, hidden, torch.zeros(2, dtype=torch.int64), torch.arange(2), cache, cos, sin, True)
    logits = torch.nn.functional.linear(out, drafter.params()[drafter.head_weight])
    torch.testing.assert_close(out, want_out, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(logits, want_logits, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("k", [1, 3])
def test_one_step_drafts_equal_a_full_sequence_transformers_forward(mtp_case, k):
    """After prefill, a step's catch-up row gives d1 from (x_P, h_{P-1}); draft i >= 2 feeds d_{i-1} with
    the head's own post-norm output (the chaining convention). transformers' MtpLayer over the whole
    pair sequence (no cache) must give the same logits at every draft."""
    _, _, drafter, hf_target, hf_mtp = mtp_case
    generator = torch.Generator().manual_seed(k)
    prompt = torch.randint(0, 128, (1, 11), generator=generator)
    with torch.no_grad():
        outputs = hf_target(prompt, output_hidden_states=True)
    hidden = outputs.hidden_states[-1]  # [1, P, H]: the target's final (normed) hidden states
    first = outputs.logits[:, -1].argmax(-1)  # x_P
    state = {s.name: s.allocate("cpu") for s in drafter.states(SLOTS, MAX_SEQ, k, torch.float32)}
    slots, lengths = torch.tensor([1]), torch.tensor([11])
    drafter.prefill(PrefillView(prompt, slots, lengths, hidden, first, hidden), state)
    inputs = {"committed_len": lengths + 1, "slot_ids": slots, "last_tokens": torch.stack((prompt[:, -1], first), 1)}
    params = drafter.params()
    proposal = drafter.propose(params, StepView(inputs, k, lambda logits, index: logits.argmax(-1)), state)
    # The oracle: pairs (x_t, h_{t-1}) for t = 1..P, then (d_{i-1}, out_{i-1}) for the chained drafts.
    ids, pairs_hidden = torch.cat((prompt[:, 1:], first[:, None]), 1), hidden
    for index in range(k):
        out, logits = hf_pairs_logits(hf_mtp, ids, pairs_hidden, first_position=1)
        torch.testing.assert_close(proposal.logits[:, index], logits[:, -1], rtol=1e-4, atol=1e-4)
        draft = proposal.tokens[:, index]
        assert torch.equal(draft, logits[:, -1].argmax(-1))
        ids, pairs_hidden = torch.cat((ids, draft[:, None]), 1), torch.cat((pairs_hidden, out[:, -1:]), 1)


@pytest.fixture(scope="module", params=[2, 3], ids=["2_layers", "3_layers"])
def deep_case(request, tmp_path_factory):
    """A DeepSeek-V3-layout checkpoint with several MTP layers (model.layers.{L + i}.*)."""
    layers = request.param
    directory = make_mtp_checkpoint(tmp_path_factory.mktemp(f"mtp_{layers}"), "deepseek_v3", seed=5, mtp_layers=layers)
    hf_target, hf_mtp = load_hf_mtp(directory)
    target = load_model(directory)
    return layers, Mtp(target, torch.float32, "cpu"), hf_target, hf_mtp


@pytest.mark.parametrize("length", [11, 2])  # 2: fewer prompt positions than the window reaches back
@pytest.mark.parametrize("extra", [-1, 0, 2])  # K = layers - 1, layers, layers + 2
def test_several_layers_draft_as_transformers_mtp_model_then_chain_the_last(deep_case, extra, length):
    """After prefill, the first K <= n drafts are transformers' MtpModel.forward (layer j pairs the
    tokens shifted j + 1 ahead, the last ones its earlier drafts, with layer j-1's outputs); drafts past
    n chain on the last layer, each with the head's own output for the draft before (pinned against
    that layer over the whole pair sequence, no cache)."""
    layers, drafter, hf_target, hf_mtp = deep_case
    k = layers + extra
    assert drafter.describe() == {"kind": "mtp", "layers": layers, "layout": "deepseek_v3"}
    generator = torch.Generator().manual_seed(length + k)
    prompt = torch.randint(0, 128, (1, length), generator=generator)
    with torch.no_grad():
        outputs = hf_target(prompt, output_hidden_states=True)
    hidden, first = outputs.hidden_states[-1], outputs.logits[:, -1].argmax(-1)
    states = drafter.states(SLOTS, MAX_SEQ, k, torch.float32)
    assert states[0].shape[0] == min(k, layers)  # the cache holds the layers a step runs
    state = {s.name: s.allocate("cpu") for s in states}
    slots, lengths = torch.tensor([1]), torch.tensor([length])
    drafter.prefill(PrefillView(prompt, slots, lengths, hidden, first, hidden), state)
    inputs = {"committed_len": lengths + 1, "slot_ids": slots, "last_tokens": torch.stack((prompt[:, -1], first), 1)}
    proposal = drafter.propose(drafter.params(), StepView(inputs, k, lambda logits, index: logits.argmax(-1)), state)

    ids, positions = torch.cat((prompt[:, 1:], first[:, None]), 1), torch.arange(1, length + 1)[None]
    with torch.no_grad():
        drafts, logits, _ = hf_mtp(ids, hidden, None, positions, None)  # transformers' own n drafts
    shown = min(k, layers)
    torch.testing.assert_close(proposal.logits[:, :shown], logits[:, :shown], rtol=1e-4, atol=1e-4)
    assert torch.equal(proposal.tokens[:, :shown], drafts[:, :shown])
    # The chain: the last layer over its whole pair sequence, one pair longer per draft past n.
    tokens = torch.cat((ids, drafts), 1)
    with torch.no_grad():
        layer_in = hidden
        for index in range(layers - 1):  # the inputs of the last layer, as MtpModel.forward computes them
            layer_in = hf_mtp.forward_layer(
                index, layer_in, positions + index, None, input_ids=tokens[:, index:][:, :length]
            )
        chain_ids, chain_positions = tokens[:, layers - 1 :][:, :length], positions + layers - 1
        out = hf_mtp.forward_layer(layers - 1, layer_in, chain_positions, None, input_ids=chain_ids)
        for index in range(layers, k):
            chain_ids = torch.cat((chain_ids, proposal.tokens[:, index - 1 : index]), 1)
            layer_in = torch.cat((layer_in, out[:, -1:]), 1)
            chain_positions = torch.cat((chain_positions, chain_positions[:, -1:] + 1), 1)
            out = hf_mtp.forward_layer(layers - 1, layer_in, chain_positions, None, input_ids=chain_ids)
            logits = hf_mtp._project_to_logits(out[:, -1])
            torch.testing.assert_close(proposal.logits[:, index], logits, rtol=1e-4, atol=1e-4)
            assert torch.equal(proposal.tokens[:, index], logits.argmax(-1))


def assert_sampled_drafts_follow_reported_logits(drafter, hf_target) -> None:
    """After prefilling a 9-token prompt into slot 0, rejection.assert_drafts_follow_their_logits at K = 2."""
    prompt = torch.randint(0, 128, (1, 9), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        outputs = hf_target(prompt, output_hidden_states=True)
    hidden, first = outputs.hidden_states[-1], outputs.logits[:, -1].argmax(-1)
    state = {s.name: s.allocate("cpu") for s in drafter.states(1, MAX_SEQ, 2, torch.float32)}
    drafter.prefill(PrefillView(prompt, torch.tensor([0]), torch.tensor([9]), hidden, first, hidden), state)
    assert_drafts_follow_their_logits(drafter, state, torch.stack((prompt[0, -1], first[0])), 10, k=2)


def test_chained_drafts_follow_the_distribution_their_proposal_reports(mtp_case):
    """Draft 2 feeds draft 1 back into the one layer: each draft must follow the distribution its
    proposal reports (rejection.assert_drafts_follow_their_logits)."""
    _, _, drafter, hf_target, _ = mtp_case
    assert_sampled_drafts_follow_reported_logits(drafter, hf_target)


def test_several_layers_report_the_distribution_each_draft_was_sampled_from(deep_case):
    """Draft 2's logits depend on the sampled draft 1 (layer 1 pairs it): each draft must follow the
    distribution its proposal reports. Reporting draft 1's logits for draft 2, or sampling at another
    temperature than reported, fails this."""
    _, drafter, hf_target, _ = deep_case
    assert_sampled_drafts_follow_reported_logits(drafter, hf_target)


def test_mis_shaped_mtp_tensor_is_refused_before_any_weight_is_read(tmp_path, monkeypatch):
    directory = make_mtp_checkpoint(tmp_path / "bad", "deepseek_v3", seed=4)
    state = load_file(directory / "model.safetensors")
    state["model.layers.2.eh_proj.weight"] = torch.zeros(64, 96)
    save_file(state, directory / "model.safetensors", metadata={"format": "pt"})
    message = r"mis-shaped tensors: model\.layers\.2\.eh_proj\.weight"
    with pytest.raises(CheckpointError, match=message):
        Mtp(load_model(directory), torch.float32, "cpu")

    def refuse(*args, **kwargs):
        raise AssertionError("weights were loaded before the refusal")

    monkeypatch.setattr("graphspec.compiler.load_model", refuse)
    with pytest.raises(CheckpointError, match=message):
        graphspec.compile(directory, "mtp", k=2, dtype="float32", device="cpu", max_seq_len=64)


def test_declared_but_absent_mtp_weights_are_refused_before_any_weight_is_read(tmp_path, monkeypatch):
    directory = make_mtp_checkpoint(tmp_path / "none", "deepseek_v3", seed=5)
    state = {
        name: tensor for name, tensor in load_file(directory / "model.safetensors").items() if ".layers.2." not in name
    }
    save_file(state, directory / "model.safetensors", metadata={"format": "pt"})

    def refuse(*args, **kwargs):
        raise AssertionError("weights were loaded before the refusal")

    monkeypatch.setattr("graphspec.compiler.load_model", refuse)
    with pytest.raises(CheckpointError, match="hold no MTP tensors"):
        graphspec.compile(directory, "mtp", k=2, dtype="float32", device="cpu", max_seq_len=64)


def test_nextn_head_that_does_not_fit_the_target_is_refused_before_any_weight_is_read(tmp_path, monkeypatch):
    directory = make_mtp_checkpoint(tmp_path / "source", "deepseek_v3", seed=4)
    target_dir, head_dir = split_nextn_head(directory, tmp_path / "target", tmp_path / "head")
    raw = json.loads((head_dir / "config.json").read_text())
    (head_dir / "config.json").write_text(json.dumps({**raw, "vocab_size": 96}))

    def refuse(*args, **kwargs):
        raise AssertionError("weights were loaded before the refusal")

    monkeypatch.setattr("graphspec.compiler.load_model", refuse)
    with pytest.raises(InputError, match="the MTP head's vocab_size 96 is not the target's 128"):
        graphspec.compile(target_dir, head_dir, k=2, dtype="float32", device="cpu", max_seq_len=64)
