"""The DFlash drafter end to end on a tiny Llama target with random drafters (CPU, fp32): lossless against
transformers' greedy generate for blocks 4, 8 and 16, and a block-8 drafter at K = 3, with mixed batches
(padding rows, a split batch), every step's accepted count equal to transformers'
generate(speculation_type="dflash"), dead context rows never read, an all-padding step, sampling
reproducible, and an artifact round trip (transformers' layout)."""

import pytest
import torch

import graphspec
from graphspec.runtime.buffers import StepBuffers
from graphspec.runtime.graphs import StepGraph
from tests.checkpoints import load_hf
from tests.e2e.seeded_sampling import assert_seeded_sampling_repeats_and_top_k_1_is_greedy
from tests.e2e.test_mtp import assert_gpu_run_is_lossless, hf_greedy, prompts
from tests.engine_hooks import between_steps

MAX_SEQ = 128
VOCAB, MASK = 12, 2  # a small vocabulary, so a random drafter still gets drafts accepted now and then


@pytest.fixture(scope="module")
def target_dir(checkpoint_factory):
    return checkpoint_factory("llama", seed=21, num_hidden_layers=4, vocab_size=VOCAB)


@pytest.fixture(scope="module")
def drafter_dir(target_dir, tmp_path_factory):
    from tests.dflash_oracle import make_dflash_drafter

    def make(block: int, layout: str = "zlab"):
        directory = tmp_path_factory.mktemp(f"dflash_{block}_{layout}")
        return make_dflash_drafter(
            directory, target_dir, seed=8, block_size=block, layer_ids=(1, 3), mask_token_id=MASK, layout=layout
        )

    return make


@pytest.fixture(scope="module")
def dflash_runtime(target_dir, drafter_dir):
    cache = {}

    def make(block: int, k: int | None = None) -> graphspec.Runtime:
        # Block 4 with its 3 drafts serves the other tests (both modes); the rest only the lossless test,
        # one bucket of 4 (five prompts still make a split batch with padding rows). k None: block - 1.
        k = block - 1 if k is None else k
        if (block, k) not in cache:
            buckets, modes = ((1, 4), ("greedy", "sample")) if (block, k) == (4, 3) else ((4,), ("greedy",))
            cache[block, k] = graphspec.Runtime.from_pretrained(
                target_dir, drafter_dir(block), k=k, batch_sizes=buckets, dtype="float32", device="cpu",
                max_seq_len=MAX_SEQ, modes=modes,
            )  # fmt: skip
        return cache[block, k]

    return make


@pytest.mark.parametrize(("block", "k"), [(4, 3), (8, 7), (16, 15), (8, 3)])
def test_greedy_is_lossless_against_transformers(target_dir, dflash_runtime, block, k):
    """Every block size with its full K, and a block-8 drafter at K = 3 (a 4-token block, as vLLM's
    num_speculative_tokens below the block)."""
    model = load_hf(target_dir)
    runtime = dflash_runtime(block, k)
    assert runtime.drafter.kind == "dflash" and runtime.k == k
    batch = prompts(seed=block, vocab=VOCAB)  # five prompts: padding rows and a split batch
    results = runtime.generate(batch, max_new_tokens=24, stop_token_ids=[])
    for prompt, result in zip(batch, results, strict=True):
        assert result.token_ids == hf_greedy(model, prompt, 24)
    assert sum(a for r in results for a in r.stats.accepted_per_step) > 0  # not a drafter that never hits


def test_accepted_counts_equal_transformers_dflash_generate(target_dir, drafter_dir, dflash_runtime, monkeypatch):
    """Lossless output alone would not notice a drafter that drafts wrongly: every step's accepted count
    equals that of transformers' own DFlash assisted generation (batch 1, MuseGlimmerAssistantModel with
    the same weights; DFlashTokenCandidateGenerator.update_candidate_strategy records num_matches)."""
    from transformers.generation.candidate_generator import DFlashTokenCandidateGenerator

    from tests.dflash_oracle import load_oracle

    model, oracle = load_hf(target_dir), load_oracle(drafter_dir(4))
    counts: list[int] = []
    original = DFlashTokenCandidateGenerator.update_candidate_strategy

    def record(self, input_ids, scores, num_matches):
        counts.append(int(num_matches))
        return original(self, input_ids, scores, num_matches)

    monkeypatch.setattr(DFlashTokenCandidateGenerator, "update_candidate_strategy", record)
    runtime = dflash_runtime(4)
    total = 0
    for prompt in prompts(seed=51, lengths=[6, 19], vocab=VOCAB):
        result = runtime.generate([prompt], max_new_tokens=30, stop_token_ids=[])[0]
        counts.clear()
        ids = torch.tensor([prompt])
        out = model.generate(
            ids, attention_mask=torch.ones_like(ids), assistant_model=oracle, speculation_type="dflash",
            max_new_tokens=30, do_sample=False, eos_token_id=None, pad_token_id=0,
        )  # fmt: skip
        assert result.token_ids == out[0, len(prompt) :].tolist()
        # transformers' first round only runs the target (its "prefill" step drafts nothing), and its
        # last round's count is cut to the tokens left under max_new_tokens (graphspec's is not).
        ours, theirs = result.stats.accepted_per_step, counts[1:]
        assert counts[0] == 0 and len(ours) == len(theirs) and ours[:-1] == theirs[:-1] and ours[-1] >= theirs[-1]
        total += sum(theirs[:-1])
    assert total > 0  # some drafts were accepted, so the comparison is not all zeros


def test_dead_context_rows_are_never_read(dflash_runtime):
    """After every step: NaN into the drafter's cache from each row's start - 1 on (the step rewrites the
    context of the last verify's rows, from position start - 1, before the block reads it; poisoning one
    entry earlier changes the drafts), into the feature rows past the accepted count, and into the spare
    slot: the output and every step's accepted count are unchanged."""
    runtime = dflash_runtime(4)
    batch = prompts(seed=3, lengths=[4, 17, 2], vocab=VOCAB)
    clean = runtime.generate(batch, max_new_tokens=30, stop_token_ids=[])
    assert any(0 < a for r in clean for a in r.stats.accepted_per_step)
    state = runtime.state

    def poison(slots: list[int], lengths: list[int]) -> None:  # on the engine thread, between two steps
        for slot, length in zip(slots, lengths, strict=True):
            start = int(state["dflash_start"][slot, 0])
            accepted = length - 1 - start
            state["dflash_cache"][:, :, slot, :, max(start - 1, 0) :] = float("nan")
            state["dflash_features"][slot, accepted + 1 :] = float("nan")
        state["dflash_cache"][:, :, -1] = float("nan")
        state["dflash_features"][-1] = float("nan")

    with between_steps(runtime, poison):
        poisoned = runtime.generate(batch, max_new_tokens=30, stop_token_ids=[])
    assert [r.token_ids for r in poisoned] == [r.token_ids for r in clean]
    # Greedy verify would emit the same tokens from any drafts: the drafts themselves must not change.
    assert [r.stats.accepted_per_step for r in poisoned] == [r.stats.accepted_per_step for r in clean]


def test_all_padding_step_runs(dflash_runtime):
    """A bucket with no real row (every row_valid False) runs the whole step: neutral outputs."""
    compiled = dflash_runtime(4).compiled
    graph = StepGraph(
        compiled.graphs[("greedy", 4)], compiled.weights(), StepBuffers.allocate(4, "cpu"), compiled.new_state(), False
    )
    outputs = graph()
    assert outputs["tokens"].eq(-1).all() and outputs["num_accepted"].eq(0).all()


def test_sampling_is_reproducible_and_greedy_at_top_k_1(dflash_runtime):
    runtime = dflash_runtime(4)
    batch = prompts(seed=4, lengths=[6, 9, 3], vocab=VOCAB)
    assert_seeded_sampling_repeats_and_top_k_1_is_greedy(runtime, batch)


def test_artifact_round_trip_keeps_the_drafter(target_dir, drafter_dir, tmp_path):
    """transformers' layout (model_type muse_glimmer_assistant) through compile, save and load."""
    compiled = graphspec.compile(
        target_dir, drafter_dir(4, "muse"), k=3, batch_sizes=(2,), dtype="float32", device="cpu",
        max_seq_len=MAX_SEQ, modes=("greedy",), out=tmp_path / "art",
    )  # fmt: skip
    loaded = graphspec.Runtime.load(tmp_path / "art")
    described = {"kind": "dflash", "block_size": 4, "target_layer_ids": [1, 3], "mask_token_id": MASK}
    assert loaded.drafter.describe() == described
    batch = prompts(seed=8, lengths=[7, 12], vocab=VOCAB)
    expected = graphspec.Runtime(compiled).generate(batch, max_new_tokens=12, stop_token_ids=[])
    got = loaded.generate(batch, max_new_tokens=12, stop_token_ids=[])
    assert [r.token_ids for r in got] == [r.token_ids for r in expected]


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("capture", "mapped", "block", "k"),
    [("auto", False, 8, 7), ("piecewise", False, 8, 7), ("auto", True, 8, 7), ("auto", False, 16, 5)],
)
def test_captured_gpu_steps_are_lossless(target_dir, drafter_dir, tmp_path, capture, mapped, block, k):
    """On the GPU (fp32, Triton kernels incl. the non-causal block attention, CUDA graphs), with and without
    a token map, and a block-16 drafter at k = 5: greedy output equals transformers' greedy generate on the
    same device, with padding rows (buckets 1, 4)."""
    from graphspec.drafters.token_map import write_token_map

    token_map = write_token_map(tmp_path / "map.safetensors", [0, 2, 3, 5, 7, 11]) if mapped else None
    runtime = graphspec.Runtime.from_pretrained(
        target_dir, drafter_dir(block), k=k, batch_sizes=(1, 4), dtype="float32", device="cuda",
        max_seq_len=MAX_SEQ, modes=("greedy", "sample"), capture=capture, token_map=token_map,
    )  # fmt: skip
    assert_gpu_run_is_lossless(runtime, target_dir, prompts(seed=41, vocab=VOCAB), vocab=VOCAB)


def test_a_token_map_keeps_greedy_lossless_and_travels_with_the_artifact(target_dir, drafter_dir, tmp_path):
    """With a token map (half the vocabulary) the block's drafts score only mapped ids: greedy output still
    equals transformers' token for token, ids off the map still come out (the verify emits them), some
    drafts are accepted, and the artifact carries its own copy of the map."""
    from graphspec.drafters.token_map import write_token_map

    hot = torch.tensor([0, 2, 3, 5, 7, 11])
    token_map = write_token_map(tmp_path / "map.safetensors", hot)
    compiled = graphspec.compile(
        target_dir, drafter_dir(4), k=3, batch_sizes=(4,), dtype="float32", device="cpu", max_seq_len=MAX_SEQ,
        modes=("greedy",), token_map=token_map, out=tmp_path / "art",
    )  # fmt: skip
    runtime = graphspec.Runtime(compiled)
    assert runtime.drafter.describe()["draft_vocab_size"] == len(hot)
    model = load_hf(target_dir)
    torch.testing.assert_close(runtime.drafter.params()["hot_lm_head"], model.lm_head.weight[hot], rtol=0, atol=0)
    batch = prompts(seed=4, vocab=VOCAB)
    results = runtime.generate(batch, max_new_tokens=24, stop_token_ids=[])
    assert [r.token_ids for r in results] == [hf_greedy(model, prompt, 24) for prompt in batch]
    assert sum(a for r in results for a in r.stats.accepted_per_step) > 0
    assert any(token not in hot.tolist() for r in results for token in r.token_ids)
    token_map.unlink()  # the artifact loads its own copy
    loaded = graphspec.Runtime.load(tmp_path / "art")
    assert [r.token_ids for r in loaded.generate(batch, max_new_tokens=24, stop_token_ids=[])] == [
        r.token_ids for r in results
    ]
