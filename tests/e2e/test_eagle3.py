"""The EAGLE-3 drafter end to end on a tiny Llama target with a random head (CPU, fp32): lossless
against transformers' greedy generate for K in {1, 2, 4, 6} with padding rows and early stops, dead
head state never read, sampling reproducible, and an artifact round trip."""

import pytest
import torch

import graphspec
from tests.checkpoints import load_hf
from tests.e2e.seeded_sampling import assert_seeded_sampling_repeats_and_top_k_1_is_greedy
from tests.e2e.test_mtp import assert_gpu_run_is_lossless, hf_greedy, prompts
from tests.eagle3_oracle import oracle_drafts, oracle_generation
from tests.engine_hooks import between_steps

MAX_SEQ = 128
VOCAB, DRAFT_VOCAB = 12, 8  # small, so a random head still gets drafts accepted now and then


@pytest.fixture(scope="module")
def target_dir(checkpoint_factory):
    return checkpoint_factory("llama", seed=21, num_hidden_layers=6, vocab_size=VOCAB)  # aux layers (2, 3, 3)


@pytest.fixture(scope="module")
def head_dir(target_dir, tmp_path_factory):
    from tests.eagle3_oracle import make_eagle3_head

    return make_eagle3_head(tmp_path_factory.mktemp("eagle3_e2e"), target_dir, seed=8, draft_vocab=DRAFT_VOCAB)


@pytest.fixture(scope="module")
def eagle3_runtime(target_dir, head_dir):
    cache = {}

    def make(k: int) -> graphspec.Runtime:
        if k not in cache:
            cache[k] = graphspec.Runtime.from_pretrained(
                target_dir, head_dir, k=k, batch_sizes=(1, 4), dtype="float32", device="cpu", max_seq_len=MAX_SEQ,
                modes=("greedy", "sample"),
            )  # fmt: skip
        return cache[k]

    return make


@pytest.mark.parametrize("k", [1, 4, 6])  # one draft, the usual four, more (k=2 runs in the tests below)
def test_greedy_is_lossless_against_transformers(target_dir, eagle3_runtime, k):
    model = load_hf(target_dir)
    runtime = eagle3_runtime(k)
    assert runtime.drafter.kind == "eagle3"
    batch = prompts(seed=k, vocab=VOCAB)  # five prompts over buckets (1, 4): padding rows and a split batch
    results = runtime.generate(batch, max_new_tokens=24, stop_token_ids=[])
    for prompt, result in zip(batch, results, strict=True):
        assert result.token_ids == hf_greedy(model, prompt, 24)
    assert sum(a for r in results for a in r.stats.accepted_per_step) > 0  # not a drafter that never hits


@pytest.fixture(scope="module")
def oracle_pair(target_dir, head_dir):
    """(transformers target, oracle head with the target's embedding, draft id -> target id, aux layers)."""
    from tests.eagle3_oracle import load_oracle

    hf_target = load_hf(target_dir)
    oracle, ids, layers = load_oracle(head_dir, hf_target.config)
    oracle.embed_tokens = hf_target.model.embed_tokens
    return hf_target, oracle, ids, layers


def test_accepted_counts_equal_an_oracle_speculative_loop(oracle_pair, eagle3_runtime):
    """Lossless output alone would not notice a drafter that drafts wrongly: every step's accepted count
    must equal that of EAGLE-3 decoding written with transformers' target and the oracle head."""
    runtime = eagle3_runtime(4)
    batch = prompts(seed=51, lengths=[6, 19, 11], vocab=VOCAB)
    results = runtime.generate(batch, max_new_tokens=30, stop_token_ids=[])
    total = 0
    for prompt, result in zip(batch, results, strict=True):
        tokens, counts = oracle_generation(oracle_pair, prompt, 4, 30, VOCAB)
        assert result.token_ids == tokens[:30]
        assert result.stats.accepted_per_step == counts
        total += sum(counts)
    assert total > 0  # some drafts were accepted, so the comparison is not all zeros


def test_head_state_after_every_step_drafts_as_a_fresh_oracle_forward(oracle_pair, eagle3_runtime):
    """After every step of a real generation, the drafter's proposals from the state the step left (head
    KV from prefill, catch-ups and chained drafts; feature and token rows; start) equal the oracle's,
    recomputed from scratch over the committed sequence: the catch-up and the chaining leave nothing
    stale behind, whatever the previous step accepted."""
    from graphspec.drafters.base import StepView

    k = 4
    runtime = eagle3_runtime(k)
    drafter = runtime.drafter
    prompt = prompts(seed=61, lengths=[9], vocab=VOCAB)[0]
    snapshots = []  # (the step's inputs, the head's state) after every step, taken on the engine thread

    class Snapshot:
        def on_step(self, buffers, rows: int, accepted: list[int]) -> None:
            names = ("committed_len", "slot_ids", "last_tokens")
            inputs = {name: buffers.inputs[name][:1].clone() for name in names}
            state = {name: tensor.clone() for name, tensor in runtime.state.items() if name.startswith("eagle3_")}
            snapshots.append((inputs, state))

        def on_finish(self, request) -> None:
            pass

    listener = Snapshot()
    runtime.engine.listeners.append(listener)
    try:
        result = runtime.generate([prompt], max_new_tokens=40, stop_token_ids=[])[0]
    finally:
        runtime.engine.listeners.remove(listener)
    checked = 0
    for inputs, state in snapshots:
        committed = prompt + result.token_ids[: int(inputs["committed_len"][0]) - len(prompt)]
        if len(committed) >= len(prompt) + len(result.token_ids):
            continue  # the row finished in this step: nothing is drafted from its state
        step = StepView(inputs, k, lambda logits, index: logits.argmax(-1))
        proposal = drafter.propose(drafter.params(), step, state)
        drafts, logits = oracle_drafts(oracle_pair, committed, k, VOCAB)
        assert proposal.tokens[0].tolist() == drafts
        torch.testing.assert_close(proposal.logits[0], torch.stack(logits), rtol=1e-4, atol=1e-4)
        checked += 1
    assert checked >= 10 and any(a > 0 for a in result.stats.accepted_per_step)


def test_rows_that_stop_early_end_at_their_stop_token(target_dir, eagle3_runtime):
    model = load_hf(target_dir)
    runtime = eagle3_runtime(4)
    batch = prompts(seed=31, lengths=[5, 13, 8], vocab=VOCAB)
    full = [hf_greedy(model, prompt, 30) for prompt in batch]
    stop = full[0][6]  # a token the first row emits; the others stop at it too or run to the limit
    results = runtime.generate(batch, max_new_tokens=30, stop_token_ids=[stop])
    for expected, result in zip(full, results, strict=True):
        cut = expected[: expected.index(stop) + 1] if stop in expected else expected
        assert result.token_ids == cut
        assert result.finish_reason == ("stop" if stop in expected else "length")
    assert len(results[0].token_ids) <= 7


# Dead verify rows get finite garbage, not NaN: the catch-up runs them beside the live rows, and though
# a live row gives their keys exactly zero attention weight, zero times NaN is NaN; finite garbage that
# a live row read would still change its drafts, which the tests compare.
GARBAGE = 1e4


def test_dead_head_state_is_never_read(eagle3_runtime):
    """After every step: NaN into the head's KV from each row's start - 1 on (the catch-up rewrites it
    from the last verify's first row before reading; poisoning one entry earlier changes the drafts),
    garbage into the feature rows past the accepted count, ids no model has into their tokens, and NaN
    (wrong ids for tokens) into the spare slot: the output and every step's accepted count are unchanged."""
    runtime = eagle3_runtime(4)
    batch = prompts(seed=3, lengths=[4, 17, 2], vocab=VOCAB)
    clean = runtime.generate(batch, max_new_tokens=30, stop_token_ids=[])
    assert any(0 < a for r in clean for a in r.stats.accepted_per_step)
    state = runtime.state

    def poison(slots: list[int], lengths: list[int]) -> None:  # on the engine thread, between two steps
        for slot, length in zip(slots, lengths, strict=True):
            start = int(state["eagle3_start"][slot, 0])
            accepted = length - 1 - start
            state["eagle3_cache"][:, :, slot, :, max(start - 1, 0) :] = float("nan")
            state["eagle3_features"][slot, accepted + 1 :] = GARBAGE
            state["eagle3_tokens"][slot, accepted + 1 :] = 10**9
        for name in ("eagle3_cache", "eagle3_features"):
            state[name].select(2 if name == "eagle3_cache" else 0, -1).fill_(float("nan"))
        state["eagle3_tokens"][-1] = 5  # padding rows embed these: wrong but valid ids

    with between_steps(runtime, poison):
        poisoned = runtime.generate(batch, max_new_tokens=30, stop_token_ids=[])
    assert [r.token_ids for r in poisoned] == [r.token_ids for r in clean]
    # Greedy verify would emit the same tokens from any drafts: the drafts themselves must not change.
    assert [r.stats.accepted_per_step for r in poisoned] == [r.stats.accepted_per_step for r in clean]


def test_sampling_is_reproducible_and_greedy_at_top_k_1(eagle3_runtime):
    runtime = eagle3_runtime(2)
    batch = prompts(seed=4, lengths=[6, 9, 3], vocab=VOCAB)
    assert_seeded_sampling_repeats_and_top_k_1_is_greedy(runtime, batch)


def test_artifact_round_trip_keeps_the_head(target_dir, head_dir, tmp_path):
    compiled = graphspec.compile(
        target_dir, head_dir, k=2, batch_sizes=(2,), dtype="float32", device="cpu", max_seq_len=MAX_SEQ,
        modes=("greedy",), out=tmp_path / "art",
    )  # fmt: skip
    loaded = graphspec.Runtime.load(tmp_path / "art")
    assert loaded.drafter.describe() == {"kind": "eagle3", "aux_layers": [2, 3, 3], "draft_vocab_size": DRAFT_VOCAB}
    batch = prompts(seed=8, lengths=[7, 12], vocab=VOCAB)
    expected = graphspec.Runtime(compiled).generate(batch, max_new_tokens=12, stop_token_ids=[])
    got = loaded.generate(batch, max_new_tokens=12, stop_token_ids=[])
    assert [r.token_ids for r in got] == [r.token_ids for r in expected]


@pytest.mark.gpu
@pytest.mark.parametrize(("capture", "mapped"), [("auto", False), ("piecewise", False), ("auto", True)])
def test_captured_gpu_steps_are_lossless(target_dir, head_dir, capture, mapped, tmp_path):
    """On the GPU (fp32, Triton kernels, CUDA graphs): greedy output equals transformers' greedy
    generate on the same device, with padding rows (buckets 1, 4, five prompts); with a token map too."""
    from safetensors.torch import load_file

    from graphspec.drafters.token_map import write_token_map

    token_map = None
    if mapped:  # half the head's ids
        d2t = load_file(head_dir / "model.safetensors")["d2t"]
        token_map = write_token_map(tmp_path / "map.safetensors", (torch.arange(DRAFT_VOCAB) + d2t)[::2].tolist())
    runtime = graphspec.Runtime.from_pretrained(
        target_dir, head_dir, k=4, batch_sizes=(1, 4), dtype="float32", device="cuda", max_seq_len=MAX_SEQ,
        modes=("greedy", "sample"), capture=capture, token_map=token_map,
    )  # fmt: skip
    assert_gpu_run_is_lossless(runtime, target_dir, prompts(seed=41, vocab=VOCAB), vocab=VOCAB)


# --- a token map over the head's draft vocabulary (drafters/token_map.py) ---------------------------


def test_a_token_map_keeps_greedy_lossless_drafts_as_a_restricted_oracle_and_travels_with_the_artifact(
    target_dir, head_dir, oracle_pair, tmp_path
):
    """With a map holding half the head's target ids (and one id it cannot draft), greedy output equals
    transformers' greedy generate, every step accepts what the oracle loop with the head's lm_head cut to
    those ids accepts, and the artifact loads from its own copy of the map."""
    import copy
    import json

    from graphspec.drafters.token_map import write_token_map

    hf_target, oracle, ids, layers = oracle_pair
    batch = prompts(seed=61, lengths=[6, 19, 11], vocab=VOCAB)
    keep = torch.tensor([0, 2, 5, 7])  # draft ids of the head
    outside = next(i for i in range(VOCAB) if i not in set(ids.tolist()))
    path = write_token_map(tmp_path / "map.safetensors", [*ids[keep].tolist()[::-1], outside])
    restricted = torch.nn.Linear(oracle.lm_head.in_features, len(keep), bias=False)
    restricted.weight.data = oracle.lm_head.weight.data[keep]
    restricted_oracle = copy.deepcopy(oracle)
    restricted_oracle.lm_head = restricted
    restricted_pair = (hf_target, restricted_oracle, ids[keep], layers)
    # The map matters: the restricted oracle accepts differently from the whole head on these prompts.
    expected = [oracle_generation(restricted_pair, prompt, 4, 24, VOCAB) for prompt in batch]
    whole_head = (oracle_generation(oracle_pair, prompt, 4, 24, VOCAB)[1] for prompt in batch)
    assert any(counts != other for (_, counts), other in zip(expected, whole_head, strict=True))

    compiled = graphspec.compile(
        target_dir, head_dir, k=4, batch_sizes=(1, 4), dtype="float32", device="cpu", max_seq_len=MAX_SEQ,
        modes=("greedy",), token_map=path, out=tmp_path / "art",
    )  # fmt: skip
    path.unlink()  # the artifact loads its own copy
    manifest = json.loads((tmp_path / "art" / "manifest.json").read_text())
    assert manifest["drafter"]["draft_vocab_size"] == len(keep)
    assert manifest["drafter"]["token_map"] == "drafter/token_map.safetensors"
    model = load_hf(target_dir)
    for runtime in (graphspec.Runtime(compiled), graphspec.Runtime.load(tmp_path / "art")):
        results = runtime.generate(batch, max_new_tokens=24, stop_token_ids=[])
        for prompt, result, (tokens, counts) in zip(batch, results, expected, strict=True):
            assert result.token_ids == hf_greedy(model, prompt, 24)
            assert result.token_ids == tokens[:24]
            assert result.stats.accepted_per_step == counts
    assert sum(a for r in results for a in r.stats.accepted_per_step) > 0
