"""verify_rejection kernels vs graphspec.ops.verify_rejection_reference.

Three bars: the counter-based uniform is bit-exact; the tokens and accepted counts are exactly the
reference's, on bf16 logits with ties at the top-k and top-p cuts too (both keep every tied token);
and the emitted tokens follow the target distribution (the lossless property) in a G-test over many
rows with different seeds.
"""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl
from graphspec.kernels import verify_rejection as kernel

from graphspec import ops
from tests.kernels.candidate_rows import KINDS, decided_rows, kind_logits, kind_parameters, record_decided
from tests.kernels.helpers import DEVICE, generator, poison_allocator


@triton.jit
def uniform_test_kernel(seed_ptr, counter_ptr, out_ptr, lanes: tl.constexpr):
    b = tl.program_id(0)
    lane = tl.arange(0, lanes)
    u = kernel.uniform(tl.load(seed_ptr + b), tl.load(counter_ptr + b), lane * 37)
    tl.store(out_ptr + b * lanes + lane, u)


def test_uniform_is_the_reference_hash_bit_for_bit() -> None:
    g = generator(0)
    seed = torch.randint(-(2**63), 2**63 - 1, (6,), generator=g)
    seed[0], seed[1] = 0, -1  # all-zero and all-one bit patterns
    counter = torch.randint(0, 2**40, (6,), generator=g)
    out = torch.empty(6, 8, dtype=torch.float64, device=DEVICE)
    uniform_test_kernel[(6,)](seed.to(DEVICE), counter.to(DEVICE), out, lanes=8)
    expected = ops.uniform(seed, counter, torch.arange(8) * 37)
    torch.testing.assert_close(out.cpu(), expected, rtol=0, atol=0)


def make_case(
    batch: int, k: int, vocab: int, dtype: torch.dtype, seed: int, filters: bool, device=DEVICE, scale: float = 2.0
):
    """Logits (slices of wider tensors; `scale` sets how peaked the distributions are), per-row sampling
    parameters covering greedy rows, top-k, top-p and both, and draft tokens drawn from the processed
    draft distribution like the step does."""
    g = generator(seed)
    target = (torch.randn(batch, k + 1, vocab + 3, generator=g) * scale)[:, :, 2 : vocab + 2]
    draft = target[:, :k] + torch.randn(batch, k, vocab, generator=g)
    temperature = torch.rand(batch, generator=g) * 1.5 + 0.3
    temperature[0] = 0.0  # greedy row
    top_k = torch.zeros(batch, dtype=torch.int64)
    top_p = torch.ones(batch)
    if filters:
        top_k = torch.where(torch.rand(batch, generator=g) < 0.5, torch.randint(1, 10, (batch,), generator=g), 0)
        top_p = torch.where(torch.rand(batch, generator=g) < 0.5, torch.rand(batch, generator=g) * 0.6 + 0.3, 1.0)
    seeds = torch.randint(-(2**62), 2**62, (batch,), generator=g)
    counter = torch.randint(0, 1000, (batch,), generator=g)
    q = ops.process_logits(draft.to(dtype), temperature, top_k, top_p)
    drafts = torch.stack([ops.sample_from(q[:, j], ops.uniform(seeds, counter, j)) for j in range(k)], dim=1)
    args = (target.to(dtype), draft.to(dtype), drafts, temperature, top_k, top_p, seeds, counter)
    return tuple(a.to(device) for a in args)


def run_both(args, **config):
    poison_allocator()
    tokens, accepted = kernel.verify_rejection(*args, **config)
    ref_tokens, ref_accepted = kernel.verify_rejection_reference(*args)
    assert tokens.dtype == accepted.dtype == torch.int64
    return tokens, accepted, ref_tokens, ref_accepted


def test_verify_rejection_matches_reference_with_filters() -> None:
    """fp32 logits (no ties): greedy, temperature, top-k, top-p and top-k + top-p rows all match."""
    args = make_case(8, 3, 100, torch.float32, seed=1, filters=True)
    tokens, accepted, ref_tokens, ref_accepted = run_both(args, block_v=128, nprobe=256)
    torch.testing.assert_close(accepted, ref_accepted, rtol=0, atol=0)
    torch.testing.assert_close(tokens, ref_tokens, rtol=0, atol=0)


def test_verify_rejection_matches_reference_bf16() -> None:
    """bf16 logits over several vocab blocks with top-k and top-p rows: bf16 logits tie often, and the
    kernel and ops.sampling_weights both keep every token tied with a cut."""
    args = make_case(6, 2, 1000, torch.bfloat16, seed=2, filters=True)
    tokens, accepted, ref_tokens, ref_accepted = run_both(args, block_v=256, nprobe=16)
    torch.testing.assert_close(accepted, ref_accepted, rtol=0, atol=0)
    torch.testing.assert_close(tokens, ref_tokens, rtol=0, atol=0)


def test_verify_rejection_vocab_split_over_programs() -> None:
    """Each stat row's vocab split over 5 programs per pass (as batch 1 runs on a GPU): the searches,
    sums and the inverse CDF combine their per-split partials to the same tokens."""
    args = make_case(2, 1, 300, torch.float32, seed=4, filters=True)
    assert kernel.num_splits(2 * 3, 300, 32, 64, 2) == 5
    tokens, accepted, ref_tokens, ref_accepted = run_both(args, block_v=32, nprobe=256, chunk_v=64)
    torch.testing.assert_close(accepted, ref_accepted, rtol=0, atol=0)
    torch.testing.assert_close(tokens, ref_tokens, rtol=0, atol=0)


def test_verify_rejection_op_takes_config() -> None:
    args = make_case(2, 1, 50, torch.float32, seed=3, filters=True)
    tokens, accepted = torch.ops.graphspec.verify_rejection_triton(*args, 32, 256, 4, 8192, 16)
    ref_tokens, ref_accepted = kernel.verify_rejection_reference(*args)
    assert torch.equal(tokens, ref_tokens) and torch.equal(accepted, ref_accepted)


def candidate_case(k: int, vocab: int, seed: int, device=DEVICE):
    """One batch row of every kind in candidate_rows.KINDS, each of its K+1 target and K draft positions
    a fresh row of that kind, draft tokens drawn from the processed draft distribution: (verify's
    arguments, decided [B * (2K+1)] expected per stat row)."""
    g = generator(seed)
    kinds = list(KINDS)
    target = torch.stack([torch.stack([kind_logits(kind, vocab, g) for _ in range(k + 1)]) for kind in kinds])
    draft = torch.stack([torch.stack([kind_logits(kind, vocab, g) for _ in range(k)]) for kind in kinds])
    temperature, top_k, top_p, decided = kind_parameters(kinds)
    seeds = torch.randint(-(2**62), 2**62, (len(kinds),), generator=g)
    counter = torch.randint(0, 1000, (len(kinds),), generator=g)
    q = ops.process_logits(draft, temperature, top_k, top_p)
    drafts = torch.stack([ops.sample_from(q[:, j], ops.uniform(seeds, counter, j)) for j in range(k)], dim=1)
    args = (target, draft, drafts, temperature, top_k, top_p, seeds, counter)
    return tuple(a.to(device) for a in args), decided.repeat_interleave(2 * k + 1)


@pytest.mark.parametrize(("block_v", "k"), [(128, 2), (32, 1)], ids=["whole", "split"])
def test_verify_rejection_candidates_decide_exactly_the_rows_they_can(
    block_v: int, k: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Target and draft rows the top-16 candidates decide, and rows that must take the full-vocab
    passes (see candidate_rows.KINDS), in one batch: each stat row's flag is the one intended, and the
    accepted counts and tokens are the reference's (so p and q are, where the drafts land). The flags
    are those of the verify call itself (record_decided), not of a second run of its stats passes."""
    args, decided = candidate_case(k, 160, seed=21)
    config = {"block_v": block_v, "nprobe": 256, "num_warps": 4, "chunk_v": 2 * block_v, "candidates": 16}
    flags = record_decided(monkeypatch)
    tokens, accepted, ref_tokens, ref_accepted = run_both(args, **config)
    assert len(flags) == 1 and torch.equal(flags[0], decided)
    torch.testing.assert_close(accepted, ref_accepted, rtol=0, atol=0)
    torch.testing.assert_close(tokens, ref_tokens, rtol=0, atol=0)


def g_test_p_value(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """P-value of a G-test of observed counts against category probabilities (categories with
    expected count 0 must be empty: any count there fails outright)."""
    counts, probs = counts.double().cpu(), probs.double().cpu()
    if (counts[probs == 0] > 0).any():
        return 0.0
    expected = probs * counts.sum()
    seen = counts > 0
    g = 2 * (counts[seen] * (counts[seen] / expected[seen]).log()).sum()
    dof = int((probs > 0).sum()) - 1
    return torch.special.gammaincc(torch.tensor(dof / 2.0, dtype=torch.float64), g / 2).item()


def emitted_first_token_test(rows: int, vocab: int, k: int, top_k: int, top_p: float, device, **config) -> float:
    """The first emitted token of rejection sampling is distributed as the processed target p_0 when
    the draft token is drawn from the processed draft q_0: one fixed distribution pair, `rows` seeds."""
    g = generator(rows + vocab)
    target = (torch.randn(1, k + 1, vocab, generator=g) * 1.5).expand(rows, -1, -1).contiguous()
    draft = (target[:, :k] + torch.randn(1, k, vocab, generator=g)).contiguous()
    temperature = torch.full((rows,), 0.8)
    top_ks, top_ps = torch.full((rows,), top_k), torch.full((rows,), top_p)
    seeds, counter = torch.arange(rows, dtype=torch.int64) * 7919 + 1, torch.zeros(rows, dtype=torch.int64)
    q = ops.process_logits(draft, temperature, top_ks, top_ps)
    drafts = torch.stack([ops.sample_from(q[:, j], ops.uniform(seeds, counter, j)) for j in range(k)], dim=1)
    args = [a.to(device) for a in (target, draft, drafts, temperature, top_ks, top_ps, seeds, counter)]
    tokens, _ = kernel.verify_rejection(*args, **config)
    p_first = ops.process_logits(target[:1, 0], temperature[:1], top_ks[:1], top_ps[:1])[0]
    return g_test_p_value(torch.bincount(tokens[:, 0].cpu(), minlength=vocab), p_first)


def test_verify_rejection_emits_target_distribution() -> None:
    """A small G-test (32 rows: the interpreter runs ~20 launches per call); the GPU one uses 200k rows."""
    p_value = emitted_first_token_test(32, 4, 1, 0, 1.0, DEVICE, block_v=16, nprobe=256)
    assert p_value > 1e-4, p_value


@pytest.mark.gpu
@pytest.mark.parametrize("candidates", [128, 0], ids=["candidates", "full_vocab"])
@pytest.mark.parametrize(("top_k", "top_p"), [(0, 1.0), (8, 1.0), (0, 0.8), (6, 0.9)])
def test_verify_rejection_emits_target_distribution_gpu(top_k: int, top_p: float, candidates: int) -> None:
    config = {**kernel.CONFIGS[90], "candidates": candidates}
    p_value = emitted_first_token_test(200_000, 16, 3, top_k, top_p, torch.device("cuda"), **config)
    assert p_value > 1e-4, p_value


@pytest.mark.gpu
def test_verify_rejection_candidates_real_vocab_gpu() -> None:
    """candidate_rows' kinds at the Llama-3 vocab (fp32), K=4, 16 candidates: each stat row decided or
    not as intended; accepted counts and tokens the reference's but where tl.exp and torch.exp differ in
    a last bit right at a bound."""
    cuda = torch.device("cuda")
    args, decided = candidate_case(4, 128256, seed=22, device=cuda)
    config = {**kernel.CONFIGS[90], "candidates": 16}
    assert torch.equal(decided_rows(args[0], args[1], *args[3:6], **config), decided)
    tokens, accepted, ref_tokens, ref_accepted = run_both(args, **config)
    same = (tokens == ref_tokens).all(1) & (accepted == ref_accepted)
    assert same.float().mean().item() >= 0.93, (tokens, ref_tokens)  # at most 1 row of 15


@pytest.mark.gpu
@pytest.mark.parametrize(("batch", "k"), [(1, 4), (64, 4), (32, 8)])
def test_verify_rejection_real_shapes_gpu(batch: int, k: int) -> None:
    """Qwen-size vocab, fp32 logits: the same tokens but where tl.exp and torch.exp differ in a last
    bit right at a bound or a CDF step (the sums themselves are exact integers on both sides)."""
    cuda = torch.device("cuda")
    args = make_case(batch, k, 151936, torch.float32, seed=batch + k, filters=True, device=cuda, scale=6)
    tokens, accepted, ref_tokens, ref_accepted = run_both(args, **kernel.CONFIGS[90])
    same = (tokens == ref_tokens).all(1) & (accepted == ref_accepted)
    assert same.float().mean().item() >= 0.98, (tokens, ref_tokens)


@pytest.mark.gpu
def test_verify_rejection_replays_in_cuda_graph_gpu() -> None:
    args = make_case(8, 4, 151936, torch.bfloat16, seed=5, filters=True, device=torch.device("cuda"))
    config = kernel.CONFIGS[90]
    kernel.verify_rejection(*args, **config)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        tokens, accepted = torch.ops.graphspec.verify_rejection_triton(*args, *config.values())
    args[7].add_(1)  # the step counter advances between replays
    graph.replay()
    eager_tokens, eager_accepted = kernel.verify_rejection(*args, **config)
    assert torch.equal(tokens, eager_tokens) and torch.equal(accepted, eager_accepted)
