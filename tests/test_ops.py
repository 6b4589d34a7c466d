"""graphspec:: ops: opcheck for every op, reference semantics, and the statistical losslessness of
rejection sampling (the emitted token follows the target distribution whatever the draft)."""

import pytest
import torch
from torch.library import opcheck

from graphspec import ops
from graphspec.errors import InputError

G = torch.Generator().manual_seed(0)


def rand(*shape, dtype=torch.float32):
    return torch.randn(*shape, generator=G, dtype=dtype)


def cache_case(batch=2, q_heads=4, kv_heads=2, t=3, d=8, s=16, layers=2):
    cache = rand(layers, 2, batch + 1, kv_heads, s, d)
    return (
        rand(batch, q_heads, t, d),
        cache,
        rand(batch, kv_heads, t, d),
        rand(batch, kv_heads, t, d),
        torch.tensor([1, 0][:batch]),
        torch.tensor([4, 0][:batch]),
    )


def test_opcheck_every_op():
    q, cache, k, v, slots, start = cache_case()
    logits = rand(2, 3, 10)
    params = (torch.tensor([1.0, 0.0]), torch.tensor([0, 3]), torch.tensor([0.9, 1.0]), torch.tensor([1, 2]))
    counter = torch.tensor([5, 6])
    cases = [
        (torch.ops.graphspec.rms_norm.default, (rand(2, 5, 8), rand(8), 1e-6)),
        (torch.ops.graphspec.add_rms_norm.default, (rand(2, 5, 8), rand(2, 5, 8), rand(8), 1e-6)),
        (
            torch.ops.graphspec.embed_norm_concat.default,
            (torch.randint(0, 4, (2, 5), generator=G), rand(4, 8), rand(8), rand(2, 5, 8), rand(8), 1e-6),
        ),
        (torch.ops.graphspec.rotary.default, (q, k, rand(2, 3, 8), rand(2, 3, 8))),
        (torch.ops.graphspec.kv_update.default, (cache, 1, slots, start, k, v)),
        (torch.ops.graphspec.kv_write.default, (cache.clone(), 1, slots, start, k, v)),
        (
            torch.ops.graphspec.rotary_kv_write.default,
            (q, k, v, rand(2, 3, 8), rand(2, 3, 8), cache.clone(), 1, slots, start),
        ),
        (torch.ops.graphspec.attention.default, (q, cache, 1, slots, start, 0.3)),
        (torch.ops.graphspec.prefill_attention.default, (q, k, v, cache.clone(), 1, slots, start, 0.3)),
        (torch.ops.graphspec.sample.default, (logits[:, 0], *params[:3], params[3], counter, 3)),
        (torch.ops.graphspec.argmax.default, (logits,)),
        (torch.ops.graphspec.verify_greedy.default, (logits, torch.randint(0, 10, (2, 2), generator=G))),
        (
            torch.ops.graphspec.verify_rejection.default,
            (logits, rand(2, 2, 10), torch.randint(0, 10, (2, 2), generator=G), *params, counter),
        ),
        (
            torch.ops.graphspec.slot_update.default,
            (torch.zeros(3, 6, dtype=torch.int64), slots, start[:2] * 0 + 1, torch.ones(2, 2, dtype=torch.int64)),
        ),
        (
            torch.ops.graphspec.slot_write.default,
            (torch.zeros(3, 6, dtype=torch.int64), slots, start[:2] * 0 + 1, torch.ones(2, 2, dtype=torch.int64)),
        ),
        (
            torch.ops.graphspec.limit_accepted.default,
            (
                torch.randint(0, 10, (2, 3), generator=G),
                torch.tensor([2, 0]),
                torch.tensor([1, 1]),
                logits,
                *params,
                counter,
            ),
        ),
        (
            torch.ops.graphspec.commit.default,
            (
                torch.tensor([5, 6]),
                torch.tensor([[1, 2], [3, 4]]),
                torch.tensor([[7, 8, 9], [10, 11, 12]]),
                torch.tensor([0, 2]),
            ),
        ),
    ]
    for op, args in cases:
        opcheck(op, args)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_embed_norm_concat_is_the_ops_it_replaces(dtype):
    """The MTP / EAGLE-3 input op computes exactly what the drafters computed before it: the embedding, each
    half's rms_norm, then the cat (so no drafter's output moved when it came in)."""
    tokens, table, hidden = torch.randint(0, 4, (2, 5), generator=G), rand(4, 8).to(dtype), rand(2, 5, 8).to(dtype)
    embed_norm, hidden_norm = rand(8).to(dtype), rand(8).to(dtype)
    halves = (
        ops.rms_norm(torch.nn.functional.embedding(tokens, table), embed_norm, 1e-6),
        ops.rms_norm(hidden, hidden_norm, 1e-6),
    )
    got = ops.embed_norm_concat(tokens, table, embed_norm, hidden, hidden_norm, 1e-6)
    assert got.shape == (2, 5, 16) and got.is_contiguous()
    assert torch.equal(got, torch.cat(halves, dim=-1))


def test_kv_write_writes_only_the_rows_positions():
    _, cache, k, v, slots, start = cache_case()
    before = cache.clone()
    ops.kv_write(cache, 1, slots, start, k, v)
    torch.testing.assert_close(cache[1, 0, 1, :, 4:7], k[0])
    torch.testing.assert_close(cache[1, 1, 0, :, 0:3], v[1])
    cache[1, 0, 1, :, 4:7] = before[1, 0, 1, :, 4:7]
    cache[1, 1, 1, :, 4:7] = before[1, 1, 1, :, 4:7]
    cache[1, :, 0, :, 0:3] = before[1, :, 0, :, 0:3]
    assert torch.equal(cache, before)  # nothing else changed


def test_attention_matches_sdpa_with_causal_block_mask():
    q, cache, *_ = cache_case(t=3)
    slots, start = torch.tensor([1, 0]), torch.tensor([4, 9])
    out = ops.attention(q, cache, 0, slots, start, 0.35)
    for row in range(2):
        keys = cache[0, 0, slots[row]].repeat_interleave(2, 0)[:, : start[row] + 3]
        values = cache[0, 1, slots[row]].repeat_interleave(2, 0)[:, : start[row] + 3]
        n = start[row] + 3
        mask = torch.arange(n)[None, :] <= (start[row] + torch.arange(3))[:, None]
        expected = torch.nn.functional.scaled_dot_product_attention(q[row], keys, values, attn_mask=mask, scale=0.35)
        torch.testing.assert_close(out[row].transpose(0, 1), expected, rtol=1e-5, atol=1e-5)  # out is [T, Hq, D]


def test_verify_greedy_accepts_the_matching_prefix():
    logits = torch.full((3, 4, 6), -1.0)
    targets = torch.tensor([[1, 2, 3, 4], [5, 0, 1, 2], [3, 3, 3, 3]])
    logits.scatter_(2, targets[..., None], 1.0)
    drafts = torch.tensor([[1, 2, 3], [4, 0, 1], [3, 3, 0]])
    tokens, accepted = ops.verify_greedy(logits, drafts)
    assert accepted.tolist() == [3, 0, 2]
    assert torch.equal(tokens, targets)


def test_commit_advances_past_accepted_tokens():
    new_len, last = ops.commit(
        torch.tensor([5, 6, 7]),
        torch.tensor([[1, 2], [3, 4], [5, 6]]),
        torch.tensor([[7, 8, 9], [10, 11, 12], [13, 14, 15]]),
        torch.tensor([0, 2, 1]),
    )
    assert new_len.tolist() == [6, 9, 9]
    assert last.tolist() == [[2, 7], [11, 12], [13, 14]]


def test_uniform_is_deterministic_uniform_and_distinct_per_lane():
    seeds = torch.arange(200_000)
    u = ops.uniform(seeds, torch.zeros_like(seeds), 0)
    assert torch.equal(u, ops.uniform(seeds, torch.zeros_like(seeds), 0))
    assert 0 <= u.min() and u.max() < 1
    assert abs(u.mean().item() - 0.5) < 0.005
    histogram = torch.histc(u.float(), bins=10, min=0, max=1) / len(u)
    assert (histogram - 0.1).abs().max() < 0.005
    other = ops.uniform(seeds, torch.zeros_like(seeds), 1)
    assert abs(torch.corrcoef(torch.stack((u, other)))[0, 1]) < 0.01


def test_row_seeds_depend_on_the_request_seed_only():
    assert set(ops.row_seeds(7, 5).tolist()) == set(ops.row_seeds(7, 1).tolist())  # every row alike
    assert ops.row_seeds([8, 7], 2)[1] == ops.row_seeds(7, 1)[0]  # at any index, beside any seed
    assert not torch.equal(ops.row_seeds(7, 3), ops.row_seeds(8, 3))
    assert len(set(ops.row_seeds(list(range(1000)), 1000).tolist())) == 1000
    assert len(set(ops.row_seeds(None, 1000).tolist())) == 1000  # unseeded rows draw independently


def test_process_logits_top_k_top_p_and_greedy():
    logits = torch.tensor([[3.0, 2.0, 1.0, 0.0]] * 3)
    probs = ops.process_logits(
        logits, torch.tensor([1.0, 1.0, 0.0]), torch.tensor([2, 0, 0]), torch.tensor([1.0, 0.7, 1.0])
    )
    assert probs.dtype == torch.float64
    assert (probs[0, 2:] == 0).all() and torch.isclose(probs[0].sum(), torch.tensor(1.0, dtype=torch.float64))
    full = torch.softmax(logits[0].double(), -1)
    assert probs[1, 0] > 0 and probs[1, 1] > 0 and (probs[1, 2:] == 0).all()  # 0.66 < 0.7: needs two
    torch.testing.assert_close(probs[1, :2], full[:2] / full[:2].sum())
    assert probs[2].tolist() == [1.0, 0.0, 0.0, 0.0]


def test_top_k_keeps_every_token_tied_with_the_kth():
    logits = torch.tensor([[1.0, 3.0, 2.0, 2.0, 0.0]])
    weight = ops.sampling_weights(logits, torch.ones(1), torch.tensor([2]), torch.ones(1))
    assert (weight[0] > 0).tolist() == [False, True, True, True, False]


def test_top_p_keeps_a_tied_group_whole():
    # p = (0.4, 0.2, 0.2, 0.2): top_p 0.5 is crossed inside the tied group; the mass strictly above each
    # tied token is 0.4 < 0.5, so all three stay (a sort would keep one of them, whichever came first).
    logits = torch.tensor([[2.0, 1.0, 1.0, 1.0]]).log()
    no_top_k = torch.zeros(1, dtype=torch.int64)
    probs = ops.process_logits(logits, torch.ones(1), no_top_k, torch.tensor([0.5]))
    assert (probs[0] > 0).all()
    probs = ops.process_logits(logits, torch.ones(1), no_top_k, torch.tensor([0.3]))
    assert (probs[0] > 0).tolist() == [True, False, False, False]


def test_sampling_weights_are_exact_integer_sums_in_any_order():
    """Weights are fixed point, so the normalizer is the same whatever the order of the sum."""
    logits = torch.randn(3, 1000, generator=torch.Generator().manual_seed(5)) * 4
    weight = ops.sampling_weights(logits, torch.full((3,), 0.7), torch.zeros(3, dtype=torch.int64), torch.ones(3))
    assert weight.dtype == torch.int64 and (weight.max(-1).values == 2**ops.WEIGHT_BITS).all()
    assert torch.equal(weight.sum(-1), weight.flip(-1).cumsum(-1)[:, -1])


def test_sampling_refuses_a_vocab_too_large_for_exact_sums():
    with pytest.raises(InputError, match="vocab below"):
        ops.sampling_weights(torch.zeros(1, ops.MAX_SAMPLING_VOCAB), torch.ones(1), torch.zeros(1), torch.ones(1))


def g_test_p_value(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """G-test of observed counts against expected probabilities (cells with expectation >= 5)."""
    from math import erf, sqrt

    expected = probs * counts.sum()
    keep = expected >= 5
    observed, expected = counts[keep].double(), expected[keep].double()
    expected = expected * observed.sum() / expected.sum()
    nonzero = observed > 0
    g = 2 * (observed[nonzero] * (observed[nonzero] / expected[nonzero]).log()).sum().item()
    dof = int(keep.sum()) - 1
    # Wilson-Hilferty normal approximation of the chi-square tail.
    z = ((g / dof) ** (1 / 3) - (1 - 2 / (9 * dof))) / sqrt(2 / (9 * dof))
    return 0.5 * (1 - erf(z / sqrt(2)))


@pytest.mark.parametrize(
    ("draft_kind", "temperature", "top_k", "top_p"),
    [
        ("adversarial", 1.0, 0, 1.0),
        ("uniform", 0.7, 0, 1.0),
        ("peaked_wrong", 1.0, 5, 1.0),
        ("adversarial", 1.0, 0, 0.8),
    ],
)
def test_rejection_sampling_emits_the_target_distribution(draft_kind, temperature, top_k, top_p):
    """Over 240k rows (each its own seed), the first emitted token is distributed as the processed
    target distribution at position 0, and so is the token after an accepted first draft."""
    rows, vocab, k = 240_000, 12, 2
    generator = torch.Generator().manual_seed(3)
    target = torch.randn(vocab, generator=generator) * 1.5
    if draft_kind == "adversarial":  # draft favours exactly what the target dislikes
        draft = -target
    elif draft_kind == "uniform":
        draft = torch.zeros(vocab)
    else:  # all mass on one token the target finds unlikely
        draft = torch.full((vocab,), -4.0)
        draft[target.argmin()] = 4.0
    params = (
        torch.full((rows,), temperature),
        torch.full((rows,), top_k, dtype=torch.int64),
        torch.full((rows,), top_p),
    )
    seeds, counter = torch.arange(rows, dtype=torch.int64), torch.zeros(rows, dtype=torch.int64)
    draft_logits = draft.expand(rows, k, vocab)
    # Drafts are drawn from the processed draft distribution, as the traced step does.
    q = ops.process_logits(draft_logits, *params)
    draft_tokens = torch.stack([ops.sample_from(q[:, i], ops.uniform(seeds, counter, i)) for i in range(k)], 1)
    target_logits = target.expand(rows, k + 1, vocab)
    tokens, accepted = ops.verify_rejection(target_logits, draft_logits, draft_tokens, *params, seeds, counter)
    p = ops.process_logits(target.expand(1, vocab), *(x[:1] for x in params))[0]
    first = torch.bincount(tokens[:, 0], minlength=vocab)
    assert g_test_p_value(first, p) > 1e-3
    # Tokens with zero target probability are never emitted (top-k/top-p respected).
    assert first[p == 0].sum() == 0
    # Conditioned on accepting the first draft, the second emitted token again follows p.
    second = torch.bincount(tokens[accepted >= 1, 1], minlength=vocab)
    if second.sum() > 2000:
        assert g_test_p_value(second, p) > 1e-3


def test_rejection_sampling_with_a_wrong_distribution_is_detected():
    """The statistical check has power: a biased sampler fails it."""
    vocab = 12
    p = torch.softmax(torch.randn(vocab, generator=torch.Generator().manual_seed(3)) * 1.5, -1)
    biased = p.clone()
    biased[p.argmax()] *= 1.03
    biased /= biased.sum()
    counts = torch.bincount(torch.multinomial(biased, 240_000, replacement=True, generator=G), minlength=vocab)
    assert g_test_p_value(counts, p) < 1e-3


def test_greedy_rows_in_rejection_sampling_equal_greedy_verify():
    logits, draft_logits = rand(4, 4, 20), rand(4, 3, 20)
    drafts = torch.stack([logits[:2, :3].argmax(-1)[0], rand(3, 20).argmax(-1), *logits[2:, :3].argmax(-1)], 0)
    zeros = torch.zeros(4)
    tokens, accepted = ops.verify_rejection(
        logits,
        draft_logits,
        drafts,
        zeros,
        torch.zeros(4, dtype=torch.int64),
        torch.ones(4),
        torch.arange(4),
        torch.zeros(4, dtype=torch.int64),
    )
    greedy_tokens, greedy_accepted = ops.verify_greedy(logits, drafts)
    assert torch.equal(accepted, greedy_accepted)
    for row in range(4):
        n = int(accepted[row])
        assert torch.equal(tokens[row, : n + 1], greedy_tokens[row, : n + 1])
