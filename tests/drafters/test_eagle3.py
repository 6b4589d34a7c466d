"""The EAGLE-3 drafter against a head assembled from transformers' Llama pieces (tests/eagle3_oracle.py)
fed transformers' own hidden states: the captured target features, the head's outputs and logits, the
drafts of one step (catch-up then chained drafts on the pre-norm value), and its refusals before any
weight is read."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

import graphspec
from graphspec.drafters import drafter_kind
from graphspec.drafters.base import PrefillView, StepView
from graphspec.drafters.eagle3 import Eagle3
from graphspec.drafters.token_map import scatter_to_vocab
from graphspec.errors import CheckpointError, InputError
from graphspec.models.loading import load_model
from tests.checkpoints import load_hf
from tests.drafters.rejection import assert_drafts_follow_their_logits, sample_and_verify
from tests.eagle3_oracle import full_vocab, load_oracle, make_eagle3_head
from tests.test_ops import g_test_p_value

SLOTS, MAX_SEQ, VOCAB, DRAFT_VOCAB = 3, 64, 128, 48


@pytest.fixture(scope="module")
def target_dir(checkpoint_factory):
    return checkpoint_factory("llama", seed=11, num_hidden_layers=5)  # default aux layers (2, 2, 2)


VARIANTS = {
    "residual_after_norm": {},
    "norm_before_residual": {"norm_before_residual": True},
    "own_embedding": {"own_embedding": True},
}


@pytest.fixture(scope="module", params=list(VARIANTS))
def case(request, target_dir, tmp_path_factory):
    head_dir = make_eagle3_head(
        tmp_path_factory.mktemp("eagle3"), target_dir, seed=5, draft_vocab=DRAFT_VOCAB, **VARIANTS[request.param]
    )
    target = load_model(target_dir)
    hf_target = load_hf(target_dir)
    oracle, ids, layers = load_oracle(head_dir, hf_target.config)
    if oracle.embed_tokens is None:  # the head shares the target's embedding
        oracle.embed_tokens = hf_target.model.embed_tokens
    return target, Eagle3(head_dir, target, torch.float32, "cpu"), hf_target, oracle, ids, layers


def test_head_directory_is_recognized_from_its_config(case, target_dir, tmp_path):
    _, drafter, _, _, _, layers = case
    assert drafter_kind(drafter.loaded.path) == "eagle3"
    assert drafter_kind(target_dir) == "draft_model"
    assert drafter.describe() == {"kind": "eagle3", "aux_layers": list(layers), "draft_vocab_size": DRAFT_VOCAB}
    assert drafter.target_features == tuple(f"layer_in:{i}" for i in layers) == ("layer_in:2",) * 3


def test_drafter_argument_names_the_kind_when_the_config_does_not(target_dir, tmp_path):
    head = make_eagle3_head(tmp_path / "head", target_dir, seed=6, draft_vocab=DRAFT_VOCAB)
    # A rotary table as older transformers versions saved it: not a weight, ignored.
    rotary = {"midlayer.self_attn.rotary_emb.inv_freq": torch.ones(8)}
    edit_head(head, config={"architectures": ["LlamaForCausalLM"]}, tensors=rotary)
    assert drafter_kind(head) == "draft_model"
    assert drafter_kind(head, "eagle3") == "eagle3"
    drafter = Eagle3(head, load_model(target_dir), torch.float32, "cpu")
    assert drafter.describe()["kind"] == "eagle3"


def test_captured_features_are_transformers_hidden_states_of_the_aux_layers(case):
    target, _, hf_target, _, _, _ = case
    tokens = torch.randint(0, VOCAB, (2, 7), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        hidden_states = hf_target(tokens, output_hidden_states=True).hidden_states
    capture = ("layer_in:0", "layer_in:3", "final", "layer_in:1")
    cache = target.model.new_cache(2, 16, torch.float32, "cpu")
    (hidden, features), _ = target.model(
        tokens, torch.zeros(2, dtype=torch.int64), torch.arange(2), cache, "hidden_and_features", capture=capture
    )
    want = torch.cat([hidden_states[0], hidden_states[3], hidden_states[-1], hidden_states[1]], dim=-1)
    torch.testing.assert_close(features, want, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(hidden, hidden_states[-1], rtol=1e-4, atol=1e-5)


def test_head_outputs_and_logits_equal_the_oracle(case):
    _, drafter, _, oracle, ids, _ = case
    generator = torch.Generator().manual_seed(2)
    tokens = torch.randint(0, VOCAB, (2, 9), generator=generator)
    features = torch.randn(2, 9, 3 * 64, generator=generator)
    positions = 4 + torch.arange(9).expand(2, -1)
    with torch.no_grad():
        hidden = oracle.fc(features)
        want_out, want_prenorm = oracle(oracle.embed_tokens(tokens), hidden, positions)
        want_logits = full_vocab(oracle.lm_head(want_out), ids, VOCAB)
    cache = drafter.states(SLOTS, MAX_SEQ, 2, torch.float32)[0].allocate("cpu")
    cos, sin = drafter.target.rope(positions, drafter.head.inv_freq)  # head and target share rope_scale 1
    head_hidden = drafter.head.fc(features)
    kv_start = torch.zeros(2, dtype=torch.int64)  # rotary at 4.., KV from 0 (relative rotary: same scores)
    out, prenorm, _ = drafter.head(tokens, head_hidden, kv_start, torch.arange(2), cache, cos, sin, True)
    logits = scatter_to_vocab(*drafter.draft_scores(drafter.params(), out.reshape(-1, 64)), VOCAB).view(2, 9, VOCAB)
    torch.testing.assert_close(out, want_out, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(prenorm, want_prenorm, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(logits, want_logits, rtol=1e-4, atol=1e-4)
    assert torch.isinf(logits).sum() == 2 * 9 * (VOCAB - DRAFT_VOCAB)  # unmapped ids are -inf


@pytest.mark.parametrize("k", [1, 3])
def test_one_step_drafts_equal_a_full_sequence_oracle_forward(case, k):
    """After prefill, a step's catch-up row gives d1 from (x_P, f_{P-1}); draft i >= 2 feeds d_{i-1} with
    the head's own pre-norm output. The oracle over the whole pair sequence (no cache) must give the
    same logits at every draft, and every draft is a mapped target id."""
    _, drafter, hf_target, oracle, ids, layers = case
    prompt = torch.randint(0, VOCAB, (1, 11), generator=torch.Generator().manual_seed(k))
    with torch.no_grad():
        outputs = hf_target(prompt, output_hidden_states=True)
    features = torch.cat([outputs.hidden_states[i] for i in layers], dim=-1)  # [1, P, 3H]
    hidden = outputs.hidden_states[-1]
    first = outputs.logits[:, -1].argmax(-1)  # x_P
    state = {s.name: s.allocate("cpu") for s in drafter.states(SLOTS, MAX_SEQ, k, torch.float32)}
    slots, lengths = torch.tensor([1]), torch.tensor([11])
    drafter.prefill(PrefillView(prompt, slots, lengths, hidden, first, features), state)
    inputs = {"committed_len": lengths + 1, "slot_ids": slots, "last_tokens": torch.stack((prompt[:, -1], first), 1)}
    proposal = drafter.propose(drafter.params(), StepView(inputs, k, lambda logits, index: logits.argmax(-1)), state)
    embed = oracle.embed_tokens
    with torch.no_grad():
        tokens, pair_hidden = torch.cat((prompt[:, 1:], first[:, None]), 1), oracle.fc(features)
        for index in range(k):
            positions = torch.arange(tokens.shape[1])[None]  # pair t: the features' position t
            out, prenorm = oracle(embed(tokens), pair_hidden, positions)
            logits = full_vocab(oracle.lm_head(out[:, -1]), ids, VOCAB)
            torch.testing.assert_close(proposal.logits[:, index], logits, rtol=1e-4, atol=1e-4)
            draft = proposal.tokens[:, index]
            assert torch.equal(draft, logits.argmax(-1)) and bool(torch.isin(draft, ids).all())
            tokens, pair_hidden = torch.cat((tokens, draft[:, None]), 1), torch.cat((pair_hidden, prenorm[:, -1:]), 1)


def test_chained_drafts_follow_the_distribution_their_proposal_reports(case):
    """Draft 2 feeds draft 1 back into the head: each draft must follow the distribution (over the target
    vocabulary, 0 off the head's ids) its proposal reports (rejection.assert_drafts_follow_their_logits)."""
    _, drafter, hf_target, _, _, layers = case
    prompt = torch.randint(0, VOCAB, (1, 9), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        outputs = hf_target(prompt, output_hidden_states=True)
    features = torch.cat([outputs.hidden_states[i] for i in layers], dim=-1)
    hidden, first = outputs.hidden_states[-1], outputs.logits[:, -1].argmax(-1)
    state = {s.name: s.allocate("cpu") for s in drafter.states(1, MAX_SEQ, 2, torch.float32)}
    drafter.prefill(PrefillView(prompt, torch.tensor([0]), torch.tensor([9]), hidden, first, features), state)
    assert_drafts_follow_their_logits(drafter, state, torch.stack((prompt[0, -1], first[0])), 10, k=2, temperature=1.0)


# One head layout: q is scatter_to_vocab of draft_scores (lm_head and the id map), which no layout variant
# touches, so the 100k-row G-test would run the same code three times.
@pytest.mark.parametrize("case", ["residual_after_norm"], indirect=True)
def test_rejection_sampling_over_the_reduced_vocabulary_emits_the_target_distribution(case):
    """q is the head's distribution over its mapped ids (0 elsewhere: scatter_to_vocab of draft_scores);
    drafts sampled from it as the step samples them (ops.sample on the draft lanes) are mapped ids, and
    verify_rejection's first token follows the target's p, ids the head cannot propose included (the residual
    covers them)."""
    _, drafter, _, _, ids, _ = case
    rows, k = 100_000, 2
    generator = torch.Generator().manual_seed(9)
    out = torch.randn(1, 64, generator=generator)
    draft_logits = scatter_to_vocab(*drafter.draft_scores(drafter.params(), out), VOCAB).expand(rows, k, VOCAB)
    target = torch.randn(VOCAB, generator=generator) * 1.5
    drafts, tokens, accepted = sample_and_verify(draft_logits, target)
    assert bool(torch.isin(drafts, ids).all())
    p = torch.softmax(target, -1)
    first = torch.bincount(tokens[:, 0], minlength=VOCAB)
    assert g_test_p_value(first, p) > 1e-3
    unmapped = torch.ones(VOCAB, dtype=torch.bool).index_fill(0, ids, False)
    assert first[unmapped].sum() > 0.2 * rows * float(p[unmapped].sum())  # not only the head's ids come out
    assert accepted.gt(0).any()


# --- refusals, all before the target's weights load ------------------------------------------------


def edit_head(directory, config=None, tensors=None, drop=()):
    if config:
        raw = json.loads((directory / "config.json").read_text())
        raw.update(config)
        raw = {key: value for key, value in raw.items() if value is not None}  # None: drop the field
        (directory / "config.json").write_text(json.dumps(raw))
    state = {n: t for n, t in load_file(directory / "model.safetensors").items() if n not in drop}
    state.update(tensors or {})
    save_file(state, directory / "model.safetensors")
    return directory


REFUSALS = {
    "hidden size": (
        {"config": {"target_hidden_size": 32}},
        InputError,
        "reads target hidden states of size 32 .* target's hidden_size is 64",
    ),
    "vocabulary": ({"config": {"vocab_size": 96}}, InputError, "vocab_size 96 is not the target's 128"),
    "d2t out of range": (
        {"tensors": {"d2t": torch.full((DRAFT_VOCAB,), 100, dtype=torch.int64)}},
        InputError,
        r"d2t maps draft ids to target ids outside 0\.\.127",
    ),
    "d2t not one-to-one": (
        {"tensors": {"d2t": -torch.arange(DRAFT_VOCAB)}},
        InputError,
        "several draft ids to one target id",
    ),
    "aux layers out of range": (
        {"config": {"eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 2, 5]}}},
        InputError,
        r"name layers \[5\] outside the target's 5 layers",
    ),
    "no model_type": ({"config": {"model_type": None}}, InputError, 'has no model_type.*"model_type": "llama"'),
    "unexpected tensors": (
        {"tensors": {"layers.0.mlp.down_proj.weight": torch.zeros(64, 96)}},
        CheckpointError,
        r"unexpected tensors: layers\.0\.mlp\.down_proj\.weight",
    ),
    "missing tensors": ({"drop": ("fc.weight", "d2t")}, CheckpointError, "missing tensors: d2t, fc.weight"),
    "fc width": (
        {"tensors": {"fc.weight": torch.zeros(64, 128)}},
        CheckpointError,
        r"mis-shaped tensors: fc\.weight \(checkpoint \[64, 128\], expected \[64, 192\]\)",
    ),
    "draft vocabulary": ({"config": {"draft_vocab_size": 40}}, CheckpointError, r"lm_head\.weight \(checkpoint \[48"),
}


@pytest.mark.parametrize("problem", REFUSALS)
def test_bad_head_is_refused_before_any_weight_is_read(target_dir, tmp_path, no_weight_loading, problem):
    edits, error, message = REFUSALS[problem]
    head = edit_head(make_eagle3_head(tmp_path / "head", target_dir, seed=6, draft_vocab=DRAFT_VOCAB), **edits)
    with pytest.raises(error, match=message):
        graphspec.compile(target_dir, head, k=2, dtype="float32", device="cpu", max_seq_len=64)


def test_default_aux_layers_need_a_deep_enough_target(checkpoint_factory, tmp_path, no_weight_loading):
    shallow = checkpoint_factory("llama", seed=0)  # 2 layers: L - 3 < 0
    head = make_eagle3_head(tmp_path / "head", shallow, seed=6, draft_vocab=DRAFT_VOCAB, aux_layers=[0, 1, 1])
    edit_head(head, config={"eagle_config": {}})
    with pytest.raises(InputError, match=r"default aux layers .* name layers \[2, -1\] outside the target's 2 layers"):
        graphspec.compile(shallow, head, k=2, dtype="float32", device="cpu", max_seq_len=64)


# --- a token map over the head's own reduced vocabulary (drafters/token_map.py) ---------------------


@pytest.mark.parametrize("case", ["residual_after_norm"], indirect=True)
def test_a_token_map_keeps_the_heads_logits_on_the_overlap_only(case, tmp_path):
    """With a map, draft_scores are the head's own logits at the draft ids whose target ids the map holds,
    in target-id order, and every other id is -inf in the draft distribution."""
    from graphspec.drafters.token_map import write_token_map

    target, drafter, _, _, ids, _ = case
    head_dir = drafter.loaded.path
    # Half the head's target ids (unsorted), plus ids outside its vocabulary, which the overlap drops.
    outside = [i for i in range(VOCAB) if i not in set(ids.tolist())][:5]
    chosen = ids[torch.randperm(DRAFT_VOCAB, generator=torch.Generator().manual_seed(3))[: DRAFT_VOCAB // 2]]
    path = write_token_map(tmp_path / "map.safetensors", [*chosen.tolist(), *outside])
    mapped = Eagle3(head_dir, target, torch.float32, "cpu", token_map=path)
    assert mapped.describe()["draft_vocab_size"] == DRAFT_VOCAB // 2
    assert mapped.settings == {"token_map": str(path.absolute())}
    out = torch.randn(3, 64, generator=torch.Generator().manual_seed(4))
    logits, target_ids = mapped.draft_scores(mapped.params(), out)
    assert target_ids.tolist() == sorted(chosen.tolist())
    full, all_ids = drafter.draft_scores(drafter.params(), out)
    rows = [all_ids.tolist().index(i) for i in target_ids.tolist()]
    torch.testing.assert_close(logits, full[:, rows], rtol=0, atol=0)
    q = scatter_to_vocab(logits, target_ids, VOCAB)
    assert torch.isinf(q).sum() == 3 * (VOCAB - DRAFT_VOCAB // 2)


def test_a_token_map_sharing_no_id_with_the_head_is_refused_before_any_weight_is_read(
    target_dir, tmp_path, no_weight_loading
):
    from graphspec.drafters.token_map import write_token_map

    head = make_eagle3_head(tmp_path / "head", target_dir, seed=6, draft_vocab=DRAFT_VOCAB)
    d2t = load_file(head / "model.safetensors")["d2t"]
    used = set((torch.arange(DRAFT_VOCAB) + d2t).tolist())
    path = write_token_map(tmp_path / "map.safetensors", [i for i in range(VOCAB) if i not in used])
    with pytest.raises(InputError, match="none of the token map's 80 ids is in the head's draft vocabulary"):
        graphspec.compile(target_dir, head, k=2, dtype="float32", device="cpu", max_seq_len=64, token_map=path)
