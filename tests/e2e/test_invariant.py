"""numerics="invariant" end to end on a GPU, in bf16: a draft equal to the target accepts every draft, and
speculative greedy output equals graphspec's own target-only greedy decoding from the same prefill
(benchmarks/bench_invariant.py measures the same at 8B scale). On the CPU the option is refused up front
(tests/e2e/test_generate.py), so everything here needs a GPU."""

from __future__ import annotations

import random

import pytest

import graphspec
from benchmarks import bench_invariant
from graphspec.errors import InputError
from graphspec.runtime.runtime import RuntimeStats

pytestmark = pytest.mark.gpu
HEADS_64 = dict(num_attention_heads=2, num_key_value_heads=1)
OPTIONS = dict(k=4, batch_sizes=(1, 8), dtype="bfloat16", device="cuda", max_seq_len=256, modes=("greedy",))


@pytest.fixture(scope="module")
def invariant_pair(checkpoint_factory):
    target = checkpoint_factory("llama", 0, hidden_size=256, intermediate_size=512, num_hidden_layers=4)
    # Head dim 64, the attention kernels' smallest.
    draft = checkpoint_factory("llama", 1, hidden_size=128, intermediate_size=256, num_hidden_layers=2, **HEADS_64)
    return target, draft


def prompts(count: int, vocab: int) -> list[list[int]]:
    rng = random.Random(count)
    return [[rng.randrange(vocab) for _ in range(rng.randrange(5, 40))] for _ in range(count)]


def test_self_draft_accepts_every_draft_in_bf16(invariant_pair):
    target, _ = invariant_pair
    runtime = graphspec.Runtime.from_pretrained(target, target, numerics="invariant", **OPTIONS)
    for rows in (1, 8):
        runtime.stats = RuntimeStats(runtime.k)
        runtime.generate(prompts(rows, runtime.vocab_size), max_new_tokens=96, stop_token_ids=())
        assert runtime.stats.acceptance_rate == 1.0, (rows, runtime.stats.accepted_histogram)


def test_speculative_output_equals_target_only_output_in_bf16(invariant_pair):
    target, draft = invariant_pair
    runtime = graphspec.Runtime.from_pretrained(target, draft, numerics="invariant", **OPTIONS)
    group = prompts(8, runtime.vocab_size)
    speculative = [list(r.token_ids) for r in runtime.generate(group, max_new_tokens=64, stop_token_ids=())]
    plain, _ = bench_invariant.target_only_outputs(runtime, group, 64, "invariant")
    assert speculative == plain


def test_a_draft_without_invariant_attention_is_refused(checkpoint_factory, invariant_pair):
    """Heads of 32 fit no attention kernel: the compile names the nodes left on the reference."""
    target, _ = invariant_pair
    narrow = checkpoint_factory("llama", 1, hidden_size=128, intermediate_size=256, num_hidden_layers=2)
    with pytest.raises(InputError, match=r"numerics='invariant': \d+ reductions .* rotary_kv_attention"):
        graphspec.compile(target, narrow, numerics="invariant", **OPTIONS)


def test_sampling_steps_are_refused_before_any_work(invariant_pair):
    target, draft = invariant_pair
    with pytest.raises(InputError, match="greedy steps only"):
        graphspec.compile(target, draft, numerics="invariant", **{**OPTIONS, "modes": ("greedy", "sample")})
