"""Hybrid (Gated DeltaNet) targets through the speculation step (CPU, fp32; transformers'
Qwen3_5ForCausalLM as the oracle): for every accepted count 0..K the state the accept region selects
equals the state transformers reaches feeding the accepted tokens one by one; NaN in the snapshots the
selection does not pick changes nothing; padded rows write only the spare slot; compiled chunked prefill
leaves the reference prefill's state; greedy output is lossless against transformers' greedy generate
with the draft-model, n-gram, MTP, EAGLE-3 and DFlash drafters (the heads' features equal transformers'
hidden states, and their accepted counts an oracle loop's at every step); sampled output follows
transformers' distribution (G-test)."""

from __future__ import annotations

import copy

import pytest
import torch

import graphspec
from graphspec import checks, library, ops, pipeline, trace
from graphspec.config import PassContext
from graphspec.drafters.base import Drafter, PrefillChunk, PrefillView, Proposal, State, StepView
from graphspec.drafters.mtp import Mtp
from graphspec.models import load_model
from graphspec.models.hybrid import CONV_STATE, RECURRENT_STATE
from graphspec.models.target import target_forward, target_states
from graphspec.reference import reference_generate
from tests.checkpoints import (
    cache_argument,
    kv_cache,
    load_hf,
    load_hf_mtp,
    make_checkpoint,
    make_hybrid_checkpoint,
    make_hybrid_mtp_checkpoint,
)
from tests.test_ops import g_test_p_value

K = 3
SLOTS, MAX_SEQ = 7, 32  # K+1 real rows, one padding row, one untouched slot, the spare slot
PROMPT_LENGTHS = (5, 9, 6, 7)  # one row per accepted count 0..K
SLOT_IDS = (3, 0, 5, 1)
UNTOUCHED_SLOT = 4  # the padding row names it; mask_padding must send the row to the spare slot instead
SNAPSHOT_STATES = (CONV_STATE, RECURRENT_STATE)


class ScriptedDrafter(Drafter):
    """Proposes the K tokens the test wrote into its slot's row: drafts built to hit a chosen accepted count."""

    kind = "scripted"

    def __init__(self) -> None:
        self.settings = {}

    def states(self, slots: int, max_seq_len: int, k: int, dtype: torch.dtype) -> tuple[State, ...]:
        return (State("scripted", (slots, k), torch.int64, "length"),)

    def propose(self, params, step: StepView, state) -> Proposal:
        return Proposal(state["scripted"].index_select(0, step.inputs["slot_ids"]), dict(state))

    def prefill(self, prompt: PrefillView, state) -> None:
        pass

    def prefill_chunk(self, params, chunk: PrefillChunk, state):
        return dict(state)


@pytest.fixture(scope="module")
def target_dir(tmp_path_factory):
    return make_hybrid_checkpoint(tmp_path_factory.mktemp("hybrid_target"), "qwen3_5_text", seed=3)


@pytest.fixture(scope="module")
def hf(target_dir):
    return load_hf(target_dir)


@pytest.fixture(scope="module")
def case(target_dir, hf):
    """A step over K+1 rows whose drafts hit accepted counts 0..K (row a accepts a), plus a padding row,
    run through the whole pipeline from a reference prefill; returns what the tests compare."""
    target = load_model(target_dir).model
    drafter = ScriptedDrafter()
    vocab = target.spec.vocab_size
    generator = torch.Generator().manual_seed(11)
    prompts = [torch.randint(3, vocab, (n,), generator=generator) for n in PROMPT_LENGTHS]
    with torch.no_grad():  # transformers' greedy continuation: the first token, then what every draft should be
        greedy = [hf.generate(p[None], max_new_tokens=K + 1, do_sample=False)[0, len(p) :] for p in prompts]
    state = {s.name: s.allocate("cpu") for s in trace.step_states(target, drafter, SLOTS, MAX_SEQ, K, torch.float32)}
    for name in SNAPSHOT_STATES:  # every slot holds garbage: prefill and the step must not read it
        state[name].normal_(generator=generator)
    rows = len(prompts)
    tokens = torch.zeros((rows, max(PROMPT_LENGTHS)), dtype=torch.int64)
    for row, prompt in enumerate(prompts):
        tokens[row, : len(prompt)] = prompt
    lengths = torch.tensor(PROMPT_LENGTHS)
    with torch.no_grad():
        hidden, _ = target_forward(
            target, None, tokens, torch.zeros(rows, dtype=torch.int64), torch.tensor(SLOT_IDS), state, "hidden",
            lengths=lengths, in_place=True,
        )  # fmt: skip
    first = target.logits(hidden[torch.arange(rows), lengths - 1]).argmax(-1)
    assert first.tolist() == [g[0].item() for g in greedy]
    for accepted, (slot, row) in enumerate(zip(SLOT_IDS, greedy, strict=True)):
        drafts = row[1:].clone()  # the target's own next K tokens ...
        if accepted < K:
            drafts[accepted] = (drafts[accepted] + 1) % vocab  # ... wrong from index `accepted` on
        state["scripted"][slot] = drafts
    inputs = trace.new_row_inputs(rows + 1, "cpu")
    inputs["last_tokens"] = torch.tensor(
        [[p[-1].item(), f.item()] for p, f in zip(prompts, first, strict=True)] + [[0, 0]]
    )
    inputs["committed_len"] = torch.tensor([*PROMPT_LENGTHS, 2]) + torch.tensor([1] * rows + [0])
    inputs["slot_ids"] = torch.tensor([*SLOT_IDS, UNTOUCHED_SLOT])
    inputs["row_valid"] = torch.tensor([True] * rows + [False])
    step_inputs = {**inputs, **state}
    gm, signature = trace.trace_step(target, drafter, K, "greedy", step_inputs)
    ctx = PassContext(k=K, batch=rows + 1, mode="greedy", sm=None, scratch_slot=SLOTS - 1)
    gm = pipeline.run_pipeline(gm, ctx, check=True).gm
    params = [*trace.model_inputs(target).values(), *drafter.params().values()]
    return {
        "gm": gm, "signature": signature, "params": params, "inputs": step_inputs, "prompts": prompts,
        "greedy": greedy, "target": target,
    }  # fmt: skip


def run_step(case, gm=None) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """One step on a copy of the case's inputs: (named outputs, the states after it)."""
    values = {name: value.clone() for name, value in case["inputs"].items()}
    gm = case["gm"] if gm is None else gm
    with torch.no_grad():
        outputs = gm(*case["params"], *(values[name] for name in case["signature"].step_inputs))
    return dict(zip(trace.output_nodes(gm), outputs, strict=True)), values


def transformers_state(hf, tokens: torch.Tensor, decoded: list[int]):
    """transformers' cache after the prompt and then `decoded` fed one token at a time."""
    with torch.no_grad():
        cache, name = kv_cache(hf(tokens[None], use_cache=True)), cache_argument(hf)
        for token in decoded:
            cache = kv_cache(hf(torch.tensor([[token]]), **{name: cache}, use_cache=True))
    return cache


def test_selected_state_equals_transformers_for_every_accepted_count(case, hf):
    outputs, state = run_step(case)
    assert outputs["num_accepted"].tolist() == [*range(K + 1), 0]
    layers = case["target"].spec.linear_layers
    for accepted, (slot, prompt, greedy) in enumerate(zip(SLOT_IDS, case["prompts"], case["greedy"], strict=True)):
        # The state after the bonus token and the `accepted` drafts (all equal to greedy's tokens).
        cache = transformers_state(hf, prompt, greedy[: accepted + 1].tolist())
        for index, layer in enumerate(layers):
            expected_conv = cache.layers[layer].conv_states[0][0, :, 1:]
            expected_recurrent = cache.layers[layer].recurrent_states[0][0]
            msg = f"accepted {accepted}, linear layer {index}"
            torch.testing.assert_close(state[CONV_STATE][index, slot], expected_conv, rtol=1e-5, atol=1e-6, msg=msg)
            torch.testing.assert_close(
                state[RECURRENT_STATE][index, slot], expected_recurrent, rtol=1e-4, atol=1e-5, msg=msg
            )


def test_padded_row_writes_only_the_spare_slot(case):
    _, state = run_step(case)
    for name in SNAPSHOT_STATES:
        untouched = case["inputs"][name][:, UNTOUCHED_SLOT]
        assert torch.equal(state[name][:, UNTOUCHED_SLOT], untouched), name


def poison_unselected(snapshots: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """snapshots [L, B, T, ...] with NaN everywhere but each row's snapshot at index[b]."""
    keep = torch.arange(snapshots.shape[2])[None, :] == index[:, None]  # [B, T]
    keep = keep.reshape(1, *keep.shape, *(1,) * (snapshots.dim() - 3))
    return torch.where(keep, snapshots, torch.full_like(snapshots, float("nan")))


def test_nan_in_unselected_snapshots_changes_nothing(case):
    gm = copy.deepcopy(case["gm"])
    poisoned = 0
    for node in gm.graph.find_nodes(op="call_function", target=torch.ops.graphspec.select_write.default):
        with gm.graph.inserting_before(node):
            bad = gm.graph.call_function(poison_unselected, (node.args[2], node.args[3]))
        node.update_arg(2, bad)
        poisoned += 1
    gm.recompile()
    assert poisoned == len(SNAPSHOT_STATES)
    clean_outputs, clean_state = run_step(case)
    outputs, state = run_step(case, gm)
    for name, value in clean_outputs.items():
        if name not in SNAPSHOT_STATES:
            assert torch.equal(outputs[name], value), name
    for name in SNAPSHOT_STATES:
        real = list(SLOT_IDS)
        assert torch.isfinite(state[name][:, real]).all(), name
        assert torch.equal(state[name][:, real], clean_state[name][:, real]), name


# Found by search for this checkpoint: transformers' greedy output repeats a few n-grams (the n-gram
# drafter's drafts get accepted); the third prompt runs with a padding row beside it.
GENERATE_PROMPTS = ([6, 3, 4, 5, 4, 7, 4], [5, 7, 5], [9, 10, 11, 9, 10, 11, 9, 10, 11, 9, 10])
NEW_TOKENS = 16


@pytest.fixture(scope="module")
def runtimes(target_dir, tmp_path_factory):
    """draft-model (a tiny unrelated qwen3 sharing the vocab) and n-gram runtimes over the hybrid target,
    bucket 2 (the third prompt runs with a padding row beside it) and 4 positions per prefill chunk."""
    draft = make_checkpoint(tmp_path_factory.mktemp("hybrid_draft"), "qwen3", seed=1, num_hidden_layers=1)
    options = dict(k=K, batch_sizes=(2,), dtype="float32", device="cpu", max_seq_len=MAX_SEQ, prefill_tokens=8)
    options["modes"] = ("greedy", "sample")
    return {
        name: graphspec.Runtime.from_pretrained(target_dir, d, **options)
        for name, d in (("draft_model", draft), ("ngram", "ngram"))
    }


@pytest.mark.parametrize("drafter", ["draft_model", "ngram"])
def test_greedy_is_lossless_against_transformers_generate(runtimes, hf, drafter):
    results = runtimes[drafter].generate([list(p) for p in GENERATE_PROMPTS], max_new_tokens=NEW_TOKENS)
    for prompt, result in zip(GENERATE_PROMPTS, results, strict=True):
        with torch.no_grad():
            expected = hf.generate(torch.tensor([prompt]), max_new_tokens=NEW_TOKENS, do_sample=False)[0, len(prompt) :]
        assert result.token_ids == expected.tolist()
    if drafter == "ngram":  # the repetitive prompts get drafts accepted: rollback happened mid-sequence too
        assert sum(sum(r.stats.accepted_per_step) for r in results) > 0


def test_sampling_step_with_top_k_one_is_greedy(runtimes, hf):
    """The rejection-sampling step (verify_rejection, then the snapshot selection at its accepted count)
    with top_k = 1: target and draft distributions are one-hot, so the output is transformers' greedy."""
    results = runtimes["draft_model"].generate(
        [list(p) for p in GENERATE_PROMPTS], max_new_tokens=NEW_TOKENS, temperature=0.8, top_k=1, seed=5
    )
    for prompt, result in zip(GENERATE_PROMPTS, results, strict=True):
        with torch.no_grad():
            expected = hf.generate(torch.tensor([prompt]), max_new_tokens=NEW_TOKENS, do_sample=False)[0, len(prompt) :]
        assert result.token_ids == expected.tolist()


@pytest.fixture(scope="module")
def peaky(tmp_path_factory):
    """A hybrid target with peaky next-token distributions (max probability around 0.8, where the default
    test checkpoint's are nearly uniform), so that a wrong state changes what it emits measurably, and a
    draft-model runtime over it in sampling mode."""
    target_dir = make_hybrid_checkpoint(tmp_path_factory.mktemp("peaky"), "qwen3_5_text", seed=3, perturbation=0.5)
    draft = make_checkpoint(tmp_path_factory.mktemp("peaky_draft"), "qwen3", seed=1, num_hidden_layers=1)
    runtime = graphspec.Runtime.from_pretrained(
        target_dir, draft, k=K, batch_sizes=(2,), dtype="float32", device="cpu", max_seq_len=MAX_SEQ,
        prefill_tokens=8, modes=("sample",),
    )  # fmt: skip
    return runtime, load_hf(target_dir)


def sampling_pit_p_value(runtime, hf, prompts: int = 128, new_tokens: int = 8) -> tuple[float, int]:
    """(p-value, accepted drafts): the G-test, over 16 equal bins, of the randomized probability integral
    transform of every token the runtime samples at temperature 1, each against transformers' distribution
    given the prompt and the tokens emitted before it (u = P(< token) + U * P(token), U uniform). Under
    lossless sampling the u are independent and uniform on [0, 1) whatever the position, so every token of
    every step counts, including those after a rollback."""
    generator = torch.Generator().manual_seed(0)
    vocab = hf.config.vocab_size
    lengths = torch.randint(3, 9, (prompts,), generator=generator).tolist()
    batch = [torch.randint(3, vocab, (n,), generator=generator).tolist() for n in lengths]
    results = runtime.generate(
        batch, max_new_tokens=new_tokens, temperature=1.0, seed=list(range(prompts)), stop_token_ids=[]
    )
    transforms = []
    for prompt, result in zip(batch, results, strict=True):
        with torch.no_grad():
            logits = hf(torch.tensor([prompt + result.token_ids])).logits[0].double()
        probs = torch.softmax(logits[len(prompt) - 1 : -1], -1)  # the distribution of each emitted token
        emitted = torch.tensor(result.token_ids)[:, None]
        mass = probs.gather(1, emitted).squeeze(1)
        below = torch.cumsum(probs, -1).gather(1, emitted).squeeze(1) - mass
        transforms.append(below + torch.rand(len(mass), generator=generator, dtype=torch.float64) * mass)
    transforms = torch.cat(transforms)
    counts = torch.bincount((transforms * 16).long().clamp(0, 15), minlength=16)
    accepted = sum(sum(result.stats.accepted_per_step) for result in results)
    return g_test_p_value(counts, torch.full((16,), 1 / 16)), accepted


def test_sampling_emits_the_target_distribution_at_every_position(peaky):
    """Rejection sampling through the step on a hybrid target, then the snapshot selection at the
    accepted count: every emitted token follows transformers' conditional distribution (G-test)."""
    p_value, accepted = sampling_pit_p_value(*peaky)
    assert accepted > 0  # drafts were accepted (and rejected), so rollbacks of every kind happened
    assert p_value > 1e-3


def test_the_sampling_g_test_catches_a_wrong_rollback(peaky, monkeypatch):
    """The test above can fail: selecting the last snapshot (the state after every verified position,
    rejected drafts included) instead of the one at the accepted count is caught."""
    select_rows = ops._select_rows

    def last_snapshot(state, slot_ids, snapshots, index):
        return select_rows(state, slot_ids, snapshots, torch.full_like(index, snapshots.shape[2] - 1))

    monkeypatch.setitem(library.STATE_WRITES, "select", last_snapshot)  # both select_update and select_write
    p_value, _ = sampling_pit_p_value(*peaky)
    assert p_value < 1e-6


def test_compiled_chunked_prefill_state_equals_reference_prefill(runtimes):
    """Prompts of 3, 8 and 11 tokens over 4-position chunks in bucket 2, into NaN-poisoned slots."""
    runtime = runtimes["ngram"]
    assert runtime.compiled.prefill_chunks(2) == (4,)
    params = {
        "temperature": torch.zeros(2), "top_k": torch.zeros(2, dtype=torch.int64), "top_p": torch.ones(2),
        "seed": torch.zeros(2, dtype=torch.int64), "step_counter": torch.zeros(2, dtype=torch.int64),
    }  # fmt: skip
    prompts, slots = [list(GENERATE_PROMPTS[2]), list(GENERATE_PROMPTS[1])], [1, 0]
    results = []
    for run in (runtime.prefill, runtime.reference_prefill):
        for tensor in runtime.state.values():
            tensor.fill_(float("nan") if tensor.dtype.is_floating_point else -1)
        first = run(prompts, slots, params)
        results.append((first.clone(), {name: runtime.state[name][:, slots].clone() for name in SNAPSHOT_STATES}))
    (first, state), (reference_first, reference_state) = results
    assert first.tolist() == reference_first.tolist()
    for name in SNAPSHOT_STATES:
        assert torch.isfinite(state[name]).all(), name
        torch.testing.assert_close(state[name], reference_state[name], rtol=1e-5, atol=1e-6, msg=name)


# --- heads that read the target's hidden states: EAGLE-3 and DFlash --------------------------------------

HEAD_VOCAB, DFLASH_LAYERS, DFLASH_MASK, EAGLE3_LAYERS = 12, (1, 3), 2, (1, 2, 3)


@pytest.fixture(scope="module")
def heads(tmp_path_factory):
    """A small-vocabulary hybrid target (so random heads get drafts accepted), transformers' model of it,
    and a runtime per head kind with the head's oracle: DFlash block K+1 over layer outputs 1 and 3,
    EAGLE-3 over layer inputs 1, 2, 3."""
    from tests import dflash_oracle, eagle3_oracle

    root = tmp_path_factory.mktemp("hybrid_heads")
    target_dir = make_hybrid_checkpoint(root / "target", "qwen3_5_text", seed=3, vocab_size=HEAD_VOCAB)
    hf_target = load_hf(target_dir)
    dflash = dflash_oracle.make_dflash_drafter(
        root / "dflash", target_dir, seed=8, block_size=K + 1, layer_ids=DFLASH_LAYERS, mask_token_id=DFLASH_MASK
    )
    eagle3 = eagle3_oracle.make_eagle3_head(
        root / "eagle3", target_dir, seed=8, draft_vocab=8, aux_layers=EAGLE3_LAYERS
    )
    oracle, ids, layers = eagle3_oracle.load_oracle(eagle3, hf_target.config)
    oracle.embed_tokens = hf_target.model.embed_tokens
    options = dict(k=K, batch_sizes=(1, 4), dtype="float32", device="cpu", max_seq_len=64, prefill_tokens=8)
    options["modes"] = ("greedy",)
    return hf_target, {
        "dflash": (graphspec.Runtime.from_pretrained(target_dir, dflash, **options), dflash_oracle.load_oracle(dflash)),
        "eagle3": (graphspec.Runtime.from_pretrained(target_dir, eagle3, **options), (hf_target, oracle, ids, layers)),
    }


@pytest.mark.parametrize("kind", ["dflash", "eagle3"])
def test_head_features_are_transformers_hidden_states(heads, kind):
    """DFlash reads layer outputs (transformers' hidden_states[i + 1], the last one normed), EAGLE-3
    layer inputs (hidden_states[i]); the hybrid target's forward captures them at every position."""
    hf_target, runtimes = heads
    runtime = runtimes[kind][0]
    tokens = torch.randint(0, HEAD_VOCAB, (2, 7), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        states = hf_target(tokens, output_hidden_states=True).hidden_states
    model = runtime.compiled.target.model
    cache = {s.name: s.allocate("cpu") for s in target_states(model, 3, 16, K, torch.float32)}
    (_, features), _ = target_forward(
        model, None, tokens, torch.zeros(2, dtype=torch.int64), torch.arange(2), cache, "hidden_and_features",
        runtime.drafter.target_features,
    )  # fmt: skip
    indices = [i + 1 for i in DFLASH_LAYERS] if kind == "dflash" else list(EAGLE3_LAYERS)
    torch.testing.assert_close(features, torch.cat([states[i] for i in indices], -1), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("kind", ["dflash", "eagle3"])
def test_head_drafters_are_lossless_and_accept_as_an_oracle_loop(heads, kind):
    """Greedy output equals transformers' greedy generate (a batch with padding rows, prompts across
    prefill chunks), and every step's accepted count equals speculative decoding written with
    transformers' target and the head's oracle (transformers' own assisted generation refuses stateful
    targets), so the snapshot rollback is exercised at the accepted counts the drafts really get."""
    from tests import dflash_oracle, eagle3_oracle

    hf_target, runtimes = heads
    runtime, oracle = runtimes[kind]
    generator = torch.Generator().manual_seed(4)
    batch = [torch.randint(3, HEAD_VOCAB, (n,), generator=generator).tolist() for n in (2, 9, 21, 5, 13)]
    results = runtime.generate(batch, max_new_tokens=20, stop_token_ids=[])
    for prompt, result in zip(batch, results, strict=True):
        if kind == "dflash":
            tokens, counts = dflash_oracle.oracle_generation(
                hf_target, oracle, DFLASH_LAYERS, DFLASH_MASK, prompt, K + 1, 20
            )
        else:
            tokens, counts = eagle3_oracle.oracle_generation(oracle, prompt, K, 20, HEAD_VOCAB)
        with torch.no_grad():
            options = dict(max_new_tokens=20, do_sample=False, eos_token_id=None, pad_token_id=0)
            greedy = hf_target.generate(torch.tensor([prompt]), **options)[0, len(prompt) :].tolist()
        assert result.token_ids == greedy == tokens[:20]
        # The last step is left out: at max_new_tokens the two loops may end it differently.
        steps = len(result.stats.accepted_per_step)
        assert result.stats.accepted_per_step[:-1] == counts[: steps - 1]
    assert sum(a for r in results for a in r.stats.accepted_per_step) > 0


@pytest.fixture(scope="module")
def mtp_dir(tmp_path_factory):
    return make_hybrid_mtp_checkpoint(tmp_path_factory.mktemp("hybrid_mtp"), seed=3)


def test_mtp_head_equals_transformers_mtp_model(mtp_dir):
    """The Qwen3.5 MTP head (mtp.*: zero-centred norms, a gated full-attention block) against
    transformers' MtpModel over Qwen3_5ForCausalLM on the same weights: pairs (ids[t], hidden[t])."""
    _, hf_mtp = load_hf_mtp(mtp_dir, "qwen3_next")
    target = load_model(mtp_dir)
    drafter = Mtp(target, torch.float32, "cpu")
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 128, (2, 9), generator=generator)
    hidden = torch.randn(2, 9, target.model.spec.hidden_size, generator=generator)
    with torch.no_grad():
        want = hf_mtp.forward_layer(0, hidden, 1 + torch.arange(9)[None], None, input_ids=ids)
        cache = drafter.states(SLOTS, MAX_SEQ, K, torch.float32)[0].allocate("cpu")
        cos, sin = target.model.rope(1 + torch.arange(9).expand(2, -1))
        slots, start = torch.arange(2), torch.zeros(2, dtype=torch.int64)
        out, _ = drafter.head(0, ids, hidden, start, slots, cache, cos, sin, True)
    torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-5)


def test_mtp_greedy_is_lossless_against_transformers_generate(mtp_dir):
    """The target's own MTP head drafts (attention only); verify rolls the GDN state back by snapshot."""
    runtime = graphspec.Runtime.from_pretrained(
        mtp_dir, "mtp", k=K, batch_sizes=(2,), dtype="float32", device="cpu", max_seq_len=MAX_SEQ,
        prefill_tokens=8, modes=("greedy",),
    )  # fmt: skip
    hf_target = load_hf(mtp_dir)
    results = runtime.generate([list(p) for p in GENERATE_PROMPTS], max_new_tokens=NEW_TOKENS)
    for prompt, result in zip(GENERATE_PROMPTS, results, strict=True):
        with torch.no_grad():
            expected = hf_target.generate(torch.tensor([prompt]), max_new_tokens=NEW_TOKENS, do_sample=False)
        assert result.token_ids == expected[0, len(prompt) :].tolist()
    assert sum(a for r in results for a in r.stats.accepted_per_step) > 0  # rollbacks after partial acceptance


def test_checks_refuse_a_selection_not_at_the_accepted_count(case):
    checks.snapshot_states_selected_at_accept(case["gm"])  # the compiled step satisfies the rule
    gm = copy.deepcopy(case["gm"])
    select = gm.graph.find_nodes(op="call_function", target=torch.ops.graphspec.select_write.default)[0]
    select.update_arg(3, trace.placeholders_by_input(gm)["step_counter"])  # any [B] int64 but the accepted count
    with pytest.raises(AssertionError, match="not selected at the accepted count"):
        checks.snapshot_states_selected_at_accept(gm)


def test_reference_generate_equals_transformers_generate(target_dir, hf):
    """The plain-decoding oracle (graphspec.reference) runs hybrid targets too: batched, right-padded."""
    prompts = [list(p) for p in GENERATE_PROMPTS]
    outputs = reference_generate(load_model(target_dir).model, prompts, max_new_tokens=6)
    for prompt, output in zip(prompts, outputs, strict=True):
        with torch.no_grad():
            expected = hf.generate(torch.tensor([prompt]), max_new_tokens=6, do_sample=False)[0, len(prompt) :]
        assert output == expected.tolist()


@pytest.mark.gpu
@pytest.mark.parametrize("drafter", ["draft_model", "ngram", "dflash", "eagle3"])
def test_gpu_step_with_snapshot_kernels_is_lossless(target_dir, tmp_path_factory, drafter):
    """On CUDA (fp32, captured CUDA graphs, Triton kernels lowered for the GDN verify ops): greedy output
    equals plain decoding of the same target on the same device."""
    from tests import dflash_oracle, eagle3_oracle

    root = tmp_path_factory.mktemp(f"hybrid_gpu_{drafter}")
    draft = {
        "draft_model": lambda: make_checkpoint(root, "qwen3", seed=1, num_hidden_layers=1),
        "ngram": lambda: "ngram",
        "dflash": lambda: dflash_oracle.make_dflash_drafter(root, target_dir, seed=8, block_size=K + 1),
        "eagle3": lambda: eagle3_oracle.make_eagle3_head(
            root, target_dir, seed=8, draft_vocab=64, aux_layers=[1, 2, 3]
        ),
    }[drafter]()
    runtime = graphspec.Runtime.from_pretrained(
        target_dir, draft, k=K, batch_sizes=(1, 4), dtype="float32", device="cuda", max_seq_len=64, modes=("greedy",)
    )
    step = runtime.compiled.graphs[("greedy", 4)]
    graphs = [m for _, m in step.named_modules() if isinstance(m, torch.fx.GraphModule)]
    kernels = {str(node.target) for m in graphs for node in m.graph.nodes if node.op == "call_function"}
    assert {
        "graphspec.gated_delta_rule_snapshots_triton.default",
        "graphspec.causal_conv1d_snapshots_triton.default",
    } <= kernels
    prompts = [list(p) for p in GENERATE_PROMPTS]
    results = runtime.generate(prompts, max_new_tokens=NEW_TOKENS)
    expected = reference_generate(load_model(target_dir, device="cuda").model, prompts, max_new_tokens=NEW_TOKENS)
    assert [r.token_ids for r in results] == expected


@pytest.mark.gpu
def test_gpu_full_attention_of_head_dim_256_runs_the_kernel_losslessly(tmp_path):
    """Qwen3.5 and Qwen3-Next full-attention heads are 256 wide: the decode attention kernel takes them
    (not the reference attention), and greedy output still equals plain decoding on the device."""
    target = make_hybrid_checkpoint(tmp_path / "head_dim_256", "qwen3_5_text", seed=4, head_dim=256)
    runtime = graphspec.Runtime.from_pretrained(
        target, "ngram", k=K, batch_sizes=(1, 4), dtype="float32", device="cuda", max_seq_len=64, modes=("greedy",)
    )
    step = runtime.compiled.graphs[("greedy", 4)]
    graphs = [m for _, m in step.named_modules() if isinstance(m, torch.fx.GraphModule)]
    assert "graphspec.attention_triton.default" in {
        str(node.target) for m in graphs for node in m.graph.nodes if node.op == "call_function"
    }
    prompts = [list(p) for p in GENERATE_PROMPTS]
    # No stop tokens: plain decoding runs past EOS (this target emits it early for one prompt).
    results = runtime.generate(prompts, max_new_tokens=NEW_TOKENS, stop_token_ids=[])
    expected = reference_generate(load_model(target, device="cuda").model, prompts, max_new_tokens=NEW_TOKENS)
    assert [r.token_ids for r in results] == expected


def test_artifact_round_trip_and_dumps_show_the_state_rules(target_dir, tmp_path):
    """An artifact of a hybrid target reloads and generates the same tokens; every step dump lists the
    states with their rollback rules."""
    out, dumps = tmp_path / "artifact", tmp_path / "dumps"
    compiled = graphspec.compile(
        target_dir, "ngram", k=2, batch_sizes=(1,), dtype="float32", device="cpu", max_seq_len=MAX_SEQ,
        modes=("greedy",), out=out, dump_dir=dumps, prefill_tokens=8,
    )  # fmt: skip
    prompt = [list(GENERATE_PROMPTS[0])]
    fresh = graphspec.Runtime(compiled).generate(prompt, max_new_tokens=6)[0].token_ids
    assert graphspec.Runtime.load(out).generate(prompt, max_new_tokens=6)[0].token_ids == fresh
    header = (dumps / "step_b1_greedy" / "01_insert_verify.py").read_text().splitlines()
    states = next(line for line in header if line.startswith("# states: "))
    assert "target_conv_state (snapshot)" in states and "target_recurrent_state (snapshot)" in states
    assert "target_cache (length)" in states and "token_history (length)" in states


class AdvancingDrafter(ScriptedDrafter):
    """Declares a state of the snapshot rule: a drafter whose own state every draft would advance."""

    def states(self, slots: int, max_seq_len: int, k: int, dtype: torch.dtype) -> tuple[State, ...]:
        return (State("recurrent", (1, slots, 4), dtype, "snapshot"),)


def test_a_drafter_declaring_snapshot_state_is_refused(target_dir):
    with pytest.raises(ValueError, match="drafters must not"):
        trace.step_states(load_model(target_dir).model, AdvancingDrafter(), 3, 16, K, torch.float32)
