"""The plain reference decoder: greedy output equals transformers' generate token for token (stop
tokens included), sampling draws from the right distribution with the runtime's random-stream
convention, and bad input is refused with InputError."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from graphspec import ops
from graphspec.errors import InputError
from graphspec.models import load_model
from graphspec.reference import reference_generate, row_seeds
from tests.checkpoints import LLAMA3_ROPE, load_hf, make_checkpoint

VARIANTS = {
    "llama": ("llama", {}),
    "llama3_rope_tied": ("llama", {"rope_scaling": LLAMA3_ROPE, "tie_word_embeddings": True}),
    "mistral": ("mistral", {}),
    "qwen2": ("qwen2", {}),
    "qwen3": ("qwen3", {}),
}
PROMPTS = [[5, 6, 7, 8, 9], [3, 4], [10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20]]
NEW_TOKENS = 14


class Case:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.model = load_model(directory).model
        self.hf = load_hf(directory)
        # Stop only where a test asks to: the tiny checkpoints' generation_config says eos=2.
        self.hf.generation_config.eos_token_id = None
        self._free: list[list[int]] | None = None

    def hf_greedy(self, prompt: list[int], max_new_tokens: int, eos: list[int] | None = None) -> list[int]:
        """transformers' greedy generate for one unpadded prompt; only the new tokens."""
        ids = torch.tensor([prompt])
        with torch.no_grad():
            out = self.hf.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                do_sample=False,
                max_new_tokens=max_new_tokens,
                eos_token_id=eos,
                pad_token_id=0,
            )
        return out[0, len(prompt) :].tolist()

    def free_running(self) -> list[list[int]]:
        """transformers' greedy continuations of PROMPTS with no stop token, computed once."""
        if self._free is None:
            self._free = [self.hf_greedy(p, NEW_TOKENS) for p in PROMPTS]
        return self._free


@pytest.fixture(scope="module")
def cases(tmp_path_factory: pytest.TempPathFactory):
    made: dict[str, Case] = {}

    def get(name: str) -> Case:
        if name not in made:
            family, overrides = VARIANTS[name]
            directory = make_checkpoint(tmp_path_factory.mktemp(f"reference_{name}"), family, seed=5, **overrides)
            made[name] = Case(directory)
        return made[name]

    return get


# --------------------------------------------------------------------------------------------------
# Greedy against transformers
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("variant", VARIANTS)
def test_greedy_equals_transformers_generate(cases, variant: str) -> None:
    case = cases(variant)
    expected = case.free_running()
    assert all(len(tokens) == NEW_TOKENS for tokens in expected)  # transformers did not stop early
    assert reference_generate(case.model, PROMPTS, NEW_TOKENS) == expected


@pytest.mark.parametrize("variant", VARIANTS)
def test_greedy_stops_right_after_a_stop_token_like_transformers(cases, variant: str) -> None:
    case = cases(variant)
    free = case.free_running()
    # A stop token that first appears in the middle of some row's free-running output (not first, not last).
    found = [
        (row, i) for row, tokens in enumerate(free) for i in range(1, NEW_TOKENS - 1) if tokens[i] not in tokens[:i]
    ]
    assert found, f"no token first occurs mid-sequence in {free}; pick other PROMPTS"
    stopped_row, cut = found[0]
    stop = free[stopped_row][cut]

    ours = reference_generate(case.model, PROMPTS, NEW_TOKENS, stop_token_ids=[stop])
    assert ours[stopped_row] == free[stopped_row][: cut + 1]  # the stop token is included, nothing after it
    for row, prompt in enumerate(PROMPTS):
        assert ours[row] == case.hf_greedy(prompt, NEW_TOKENS, eos=[stop]), f"row {row}"
        # A row that never emits the stop token runs to full length, unaffected by rows that stopped.
        if stop not in free[row]:
            assert ours[row] == free[row]


def test_any_of_several_stop_tokens_stops_a_row(cases) -> None:
    case = cases("llama")
    free = case.free_running()
    # One stop token per row, taken from each row's own output, so every row stops somewhere.
    stops = sorted({tokens[NEW_TOKENS // 2] for tokens in free})
    ours = reference_generate(case.model, PROMPTS, NEW_TOKENS, stop_token_ids=stops)
    for row, tokens in enumerate(free):
        first = min(i for i, token in enumerate(tokens) if token in stops)
        assert ours[row] == tokens[: first + 1]
        assert ours[row] == case.hf_greedy(PROMPTS[row], NEW_TOKENS, eos=stops)


def test_stop_token_inside_the_prompt_does_not_stop_generation(cases) -> None:
    case = cases("llama")
    free = case.free_running()[0]
    absent = next(t for t in PROMPTS[0] if t not in free)
    assert reference_generate(case.model, [PROMPTS[0]], NEW_TOKENS, stop_token_ids=[absent]) == [free]


def test_single_new_token_is_transformers_first_greedy_token(cases) -> None:
    case = cases("qwen3")
    assert reference_generate(case.model, PROMPTS, 1) == [tokens[:1] for tokens in case.free_running()]


def test_bfloat16_model_generates(cases) -> None:
    # The cache takes the model's dtype; a mismatch would raise inside the KV write.
    model = load_model(cases("llama").directory, dtype="bfloat16").model
    outputs = reference_generate(model, PROMPTS, 4)
    assert [len(o) for o in outputs] == [4, 4, 4]
    assert all(0 <= t < model.spec.vocab_size for o in outputs for t in o)


# --------------------------------------------------------------------------------------------------
# Sampling
# --------------------------------------------------------------------------------------------------


def test_seeded_sampling_is_reproducible(cases) -> None:
    model = cases("llama").model
    first = reference_generate(model, PROMPTS, NEW_TOKENS, temperature=1.0, seed=1234)
    again = reference_generate(model, PROMPTS, NEW_TOKENS, temperature=1.0, seed=1234)
    other = reference_generate(model, PROMPTS, NEW_TOKENS, temperature=1.0, seed=1235)
    assert first == again
    assert first != other


def test_sampling_without_seed_differs_between_calls(cases) -> None:
    model = cases("llama").model
    first = reference_generate(model, PROMPTS, NEW_TOKENS, temperature=1.0)
    second = reference_generate(model, PROMPTS, NEW_TOKENS, temperature=1.0)
    assert first != second


def test_sampled_row_does_not_depend_on_the_rest_of_the_batch(cases) -> None:
    model = cases("llama").model
    batch = reference_generate(model, PROMPTS, NEW_TOKENS, temperature=1.0, seed=77)
    alone = reference_generate(model, PROMPTS[:1], NEW_TOKENS, temperature=1.0, seed=77)
    other_company = reference_generate(model, [[1, 2], [40] * 9, PROMPTS[2]], NEW_TOKENS, temperature=1.0, seed=77)
    assert alone[0] == batch[0]
    assert other_company[2] == batch[2]


def test_top_k_one_equals_greedy(cases) -> None:
    case = cases("mistral")
    sampled = reference_generate(case.model, PROMPTS, NEW_TOKENS, temperature=1.0, top_k=1, seed=3)
    assert sampled == case.free_running()


def test_tiny_top_p_equals_greedy(cases) -> None:
    # top-p always keeps the most likely token, so a tiny top_p leaves only it.
    case = cases("qwen2")
    sampled = reference_generate(case.model, PROMPTS, NEW_TOKENS, temperature=0.7, top_p=1e-6, seed=3)
    assert sampled == case.free_running()


def test_sampled_tokens_follow_the_documented_random_stream(cases) -> None:
    # Recompute every draw independently: transformers' logits for the prefix so far, processed,
    # then inverse-CDF with uniform(row seed, counter = tokens generated so far, lane 0).
    case = cases("llama")
    temperature, top_k, seed = 0.9, 20, 2024
    sampled = reference_generate(case.model, PROMPTS, 8, temperature=temperature, top_k=top_k, seed=seed)
    seeds = row_seeds(seed, len(PROMPTS))
    for row, (prompt, tokens) in enumerate(zip(PROMPTS, sampled, strict=True)):
        for count, token in enumerate(tokens):
            with torch.no_grad():
                logits = case.hf(torch.tensor([prompt + tokens[:count]])).logits[:, -1]  # [1, V]
            probs = ops.sampling_weights(
                logits, torch.tensor([temperature]), torch.tensor([top_k]), torch.tensor([1.0])
            )
            u = ops.uniform(seeds[row : row + 1], torch.tensor([count]), ops.DRAFT_LANE)
            assert token == ops.sample_from(probs, u).item(), f"row {row} token {count}"


def expected_distribution(logits: torch.Tensor, temperature: float, top_k: int | None, top_p: float | None):
    """Written independently of graphspec.ops: softmax(logits / T), then top-k, then top-p nucleus."""
    probs = torch.softmax(logits.double() / temperature, dim=-1)
    if top_k is not None:
        kept = torch.zeros_like(probs)
        index = probs.topk(top_k).indices
        kept[index] = probs[index]
        probs = kept / kept.sum()
    if top_p is not None:
        ordered, index = probs.sort(descending=True)
        # Keep tokens until the mass before them reaches top_p.
        keep = (ordered.cumsum(0) - ordered) < top_p
        kept = torch.zeros_like(probs)
        kept[index[keep]] = ordered[keep]
        probs = kept / kept.sum()
    return probs


@pytest.fixture(scope="module")
def peaked_model(cases):
    """The llama model with a sharpened lm_head, so temperature, top-k and top-p change the
    distribution a lot (a random tiny model's logits are nearly flat)."""
    model = load_model(cases("llama").directory).model
    with torch.no_grad():
        model.lm_head.weight.mul_(12.0)
    return model


@pytest.mark.parametrize(
    ("temperature", "top_k", "top_p"),
    [(1.0, None, None), (0.5, None, None), (1.0, 4, None), (1.0, None, 0.6), (2.0, 10, 0.9)],
)
def test_first_token_distribution_matches_processed_softmax(peaked_model, temperature, top_k, top_p) -> None:
    samples = 4000
    prompt = [9, 8, 7]
    # Identical prompts with their own seeds draw from independent streams: one prefill, many samples.
    seeds = [11 + row for row in range(samples)]
    tokens = reference_generate(
        peaked_model, [prompt] * samples, 1, temperature=temperature, top_k=top_k, top_p=top_p, seed=seeds
    )
    counts = torch.bincount(torch.tensor([t[0] for t in tokens]), minlength=peaked_model.spec.vocab_size).double()
    with torch.no_grad():
        cache = peaked_model.new_cache(1, len(prompt), torch.float32, "cpu")
        logits, _ = peaked_model(
            torch.tensor([prompt]),
            torch.zeros(1, dtype=torch.int64),
            torch.zeros(1, dtype=torch.int64),
            cache,
            output="last_logits",
        )
    expected = expected_distribution(logits[0], temperature, top_k, top_p)
    plain = expected_distribution(logits[0], 1.0, None, None)
    # The case is only meaningful if its processing moved the distribution far from plain softmax.
    if (temperature, top_k, top_p) != (1.0, None, None):
        assert 0.5 * (expected - plain).abs().sum() > 0.1
    assert counts[expected == 0].sum() == 0, "sampled a token outside the top-k/top-p support"
    support = expected > 0
    observed, wanted = counts[support], expected[support] * samples
    # Pearson chi-square over the support; the bound is mean + 6 standard deviations of chi2(df).
    chi_square = ((observed - wanted) ** 2 / wanted).sum().item()
    df = int(support.sum()) - 1
    assert chi_square < df + 6 * (2 * df) ** 0.5, (chi_square, df)
    assert 0.5 * (observed / samples - expected[support]).abs().sum() < 0.05


# --------------------------------------------------------------------------------------------------
# row_seeds
# --------------------------------------------------------------------------------------------------


def test_row_seeds_are_deterministic_per_request_seed() -> None:
    seeds = row_seeds(42, 6)
    assert seeds.dtype == torch.int64 and seeds.shape == (6,)
    assert torch.equal(seeds, row_seeds(42, 6))
    assert len(set(seeds.tolist())) == 1  # the seed belongs to the request, not to the row index
    assert torch.equal(row_seeds([43, 42], 2)[1:], seeds[:1])
    assert not torch.equal(seeds, row_seeds(43, 6))


def test_row_seeds_use_the_high_bits_of_the_seed() -> None:
    assert not torch.equal(row_seeds(5, 4), row_seeds(5 + 2**40, 4))


def test_row_seeds_without_seed_are_random() -> None:
    assert not torch.equal(row_seeds(None, 4), row_seeds(None, 4))


@pytest.mark.parametrize("seed", [-1, 2**63, 1.5, True, "7"])
def test_row_seeds_reject_bad_seeds(seed) -> None:
    with pytest.raises(InputError, match="seed"):
        row_seeds(seed, 3)


# --------------------------------------------------------------------------------------------------
# Input validation
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("prompts", "kwargs", "words"),
    [
        ([], {}, "non-empty"),
        ([[5], []], {}, "prompt 1 is empty"),
        ([[5, 128]], {}, "outside [0, 128)"),
        ([[-1, 5]], {}, "outside [0, 128)"),
        ([[5, 1.5]], {}, "int token ids"),
        ("hello", {}, "token-id lists"),
        ([[5]], {"max_new_tokens": 0}, "max_new_tokens"),
        ([[5, 6, 7]], {"max_new_tokens": 6, "max_seq_len": 8}, "exceeds max_seq_len 8"),
        ([[5]], {"temperature": -0.1}, "temperature"),
        ([[5]], {"temperature": float("nan")}, "temperature"),
        ([[5]], {"top_k": -1}, "top_k"),
        ([[5]], {"top_p": 0.0}, "top_p"),
        ([[5]], {"top_p": 1.5}, "top_p"),
        ([[5]], {"stop_token_ids": ["x"]}, "stop_token_ids"),
    ],
    ids=lambda value: None,
)
def test_bad_input_is_refused(cases, prompts, kwargs, words: str) -> None:
    model = cases("llama").model
    kwargs = {"max_new_tokens": 4, **kwargs}
    max_new_tokens = kwargs.pop("max_new_tokens")
    with pytest.raises(InputError) as info:
        reference_generate(model, prompts, max_new_tokens, **kwargs)
    assert words in str(info.value)


def test_sequence_filling_max_seq_len_exactly_is_allowed(cases) -> None:
    case = cases("llama")
    out = reference_generate(case.model, [PROMPTS[0]], NEW_TOKENS, max_seq_len=len(PROMPTS[0]) + NEW_TOKENS)
    assert out == case.free_running()[:1]


def test_sequences_past_a_sliding_window_are_refused(tmp_path: Path) -> None:
    # graphspec attention has no sliding window, so it must not silently run past one.
    model = load_model(make_checkpoint(tmp_path, "mistral", sliding_window=16)).model
    assert len(reference_generate(model, [[5] * 10], 6)) == 1  # exactly the window: fine
    with pytest.raises(InputError, match="sliding_window 16"):
        reference_generate(model, [[5] * 10], 7)


def test_bool_arguments_are_not_numbers(cases) -> None:
    model = cases("llama").model
    with pytest.raises(InputError, match="max_new_tokens"):
        reference_generate(model, [[5]], True)
    with pytest.raises(InputError, match="prompt 0"):
        reference_generate(model, [[True]], 2)


def test_transformers_oracle_stops_at_an_explicit_eos(cases) -> None:
    # Guards the fixture: with the checkpoint's eos cleared, transformers must still honour an explicit
    # eos argument, otherwise the stop-token comparisons above would compare against a non-stopping oracle.
    case = cases("llama")
    row0 = case.free_running()[0]
    assert case.hf_greedy(PROMPTS[0], NEW_TOKENS, eos=[row0[3]]) == row0[: row0.index(row0[3]) + 1]
