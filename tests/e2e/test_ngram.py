"""The n-gram drafter end to end on a tiny real target (CPU, fp32): lossless against transformers'
greedy generate, the accepted count of transformers' own prompt-lookup matcher at every step, dead
history never read, reproducible sampling, and an artifact round trip."""

import pytest
import torch
from transformers.generation.candidate_generator import PromptLookupCandidateGenerator

import graphspec
from tests.e2e.conftest import MAX_SEQ
from tests.e2e.seeded_sampling import assert_seeded_sampling_repeats_and_top_k_1_is_greedy
from tests.engine_hooks import between_steps

# Mixed lengths, five prompts over buckets (1, 4): padding rows and a split batch. Repetitive prompts
# (a few distinct tokens) so the history holds matches.
LENGTHS = [2, 9, 40, 5, 23]


def prompts(seed: int, lengths=LENGTHS) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(3, 9, (n,), generator=generator).tolist() for n in lengths]


@pytest.fixture(scope="session")
def ngram_runtime(pair_dirs):
    cache = {}

    def make(k: int, modes=("greedy",), **options) -> graphspec.Runtime:
        key = (k, modes, tuple(sorted(options.items())))
        if key not in cache:
            target, _ = pair_dirs("unrelated")
            cache[key] = graphspec.Runtime.from_pretrained(
                target, "ngram", k=k, batch_sizes=(1, 4), dtype="float32", device="cpu", max_seq_len=MAX_SEQ,
                modes=modes, **options,
            )  # fmt: skip
        return cache[key]

    return make


@pytest.mark.parametrize("k", [1, 2, 4, 6])
def test_greedy_is_lossless_against_transformers(ngram_runtime, hf_greedy, k):
    runtime = ngram_runtime(k)
    batch = prompts(seed=k)
    runtime.stats = type(runtime.stats)(runtime.k)
    results = runtime.generate(batch, max_new_tokens=30, stop_token_ids=[])
    for prompt, result in zip(batch, results, strict=True):
        assert result.token_ids == hf_greedy("unrelated", prompt, 30, [])
    assert runtime.stats.accepted > 0  # the history did propose accepted drafts


def test_rows_that_stop_early_leave_the_others_exact(ngram_runtime, hf_greedy):
    runtime = ngram_runtime(4)
    batch = prompts(seed=11)
    free = [hf_greedy("unrelated", prompt, 30, []) for prompt in batch]
    stop = free[1][3]  # row 1 stops at its 4th token; others may stop too where they emit it
    results = runtime.generate(batch, max_new_tokens=30, stop_token_ids=[stop])
    for prompt, result in zip(batch, results, strict=True):
        assert result.token_ids == hf_greedy("unrelated", prompt, 30, [stop])
    assert results[1].finish_reason == "stop" and len(results[1].token_ids) <= 4


def test_accepted_counts_equal_transformers_prompt_lookup_at_every_step(ngram_runtime, hf_greedy):
    """At every step, graphspec accepts exactly as many drafts as transformers' PromptLookupCandidateGenerator
    would get accepted on the same history by the target's greedy continuation."""
    runtime = ngram_runtime(4, ngram_min=1, ngram_max=2)
    matcher = PromptLookupCandidateGenerator(num_output_tokens=4, max_matching_ngram_size=2, max_length=10**6)
    for prompt in prompts(seed=5, lengths=[12, 30]):
        result = runtime.generate([prompt], max_new_tokens=40, stop_token_ids=[])[0]
        continuation = hf_greedy("unrelated", prompt, 40 + 8, [])
        history, expected = prompt + continuation[:1], []  # the first token comes from prefill
        while len(history) - len(prompt) < len(result.token_ids):
            candidates, _ = matcher.get_candidates(torch.tensor([history]))
            drafts = candidates[0, len(history) :].tolist()
            truth = continuation[len(history) - len(prompt) :]
            accepted = next((i for i, (d, t) in enumerate(zip(drafts, truth, strict=False)) if d != t), len(drafts))
            expected.append(accepted)
            history += truth[: accepted + 1]
        assert result.stats.accepted_per_step == expected
        assert sum(expected) > 0


def test_dead_history_is_never_read(ngram_runtime):
    """After every step, every history entry from a row's committed length - 2 on (the step rewrites the
    last two committed tokens from its inputs before matching; poisoning one entry earlier changes the
    drafts) and the whole spare slot get ids no model has: the output and every step's accepted count
    are unchanged, so nothing reads dead history."""
    runtime = ngram_runtime(4)
    batch = prompts(seed=3, lengths=[4, 17, 2])
    clean = runtime.generate(batch, max_new_tokens=30, stop_token_ids=[])
    history = runtime.state["token_history"]

    def poison(slots: list[int], lengths: list[int]) -> None:
        for slot, length in zip(slots, lengths, strict=True):
            history[slot, length - 2 :] = 10**9 + slot
        history[-1] = -(10**9)

    with between_steps(runtime, poison):
        poisoned = runtime.generate(batch, max_new_tokens=30, stop_token_ids=[])
    assert [r.token_ids for r in poisoned] == [r.token_ids for r in clean]
    # Greedy verify would emit the same tokens from any drafts: the drafts themselves must not change.
    assert [r.stats.accepted_per_step for r in poisoned] == [r.stats.accepted_per_step for r in clean]


def test_sampling_is_reproducible_and_greedy_at_top_k_1(ngram_runtime):
    runtime = ngram_runtime(3, modes=("greedy", "sample"))
    batch = prompts(seed=4, lengths=[6, 9, 3])
    assert_seeded_sampling_repeats_and_top_k_1_is_greedy(runtime, batch)


def test_artifact_round_trip_keeps_the_drafter(pair_dirs, tmp_path):
    target, _ = pair_dirs("unrelated")
    compiled = graphspec.compile(
        target, "ngram", k=3, batch_sizes=(2,), dtype="float32", device="cpu", max_seq_len=MAX_SEQ,
        modes=("greedy",), out=tmp_path / "art", ngram_max=2,
    )  # fmt: skip
    loaded = graphspec.Runtime.load(tmp_path / "art")
    assert loaded.drafter.describe() == {"kind": "ngram", "ngram_min": 1, "ngram_max": 2}
    assert "draft" not in loaded.compiled.signature.input_names[0]
    batch = prompts(seed=8, lengths=[7, 12])
    expected = graphspec.Runtime(compiled).generate(batch, max_new_tokens=12, stop_token_ids=[])
    got = loaded.generate(batch, max_new_tokens=12, stop_token_ids=[])
    assert [r.token_ids for r in got] == [r.token_ids for r in expected]
