"""sample kernel vs graphspec.ops.sample (ops.sampling_weights + sample_from with the counter uniform).

Bars: token for token equal to the reference on random logits, float ties included (bf16 logits and
hand-made tied rows, at top-k and top-p boundaries), with top-k/top-p on and off, greedy rows and -inf
logits; split over several programs per row like batch 1 on a GPU; the draws follow process_logits'
distribution (G-test); the op passes opcheck.
"""

from __future__ import annotations

import pytest
import torch
from graphspec.kernels import sample as kernel
from torch.library import opcheck

from graphspec import ops
from tests.kernels.candidate_rows import CAP, KINDS, decided_rows, kind_logits, kind_parameters, record_decided
from tests.kernels.helpers import DEVICE, generator, poison_allocator
from tests.kernels.test_verify_rejection import g_test_p_value

SMALL = {"block_v": 32, "nprobe": 16, "num_warps": 4, "chunk_v": 64, "candidates": CAP}
FEW_PASSES = {**SMALL, "nprobe": 256}  # 4 search passes instead of 8: half the interpreted launches


def make_case(batch: int, vocab: int, dtype: torch.dtype, seed: int, filters: bool, device=DEVICE):
    """Logits (a strided slice of a wider tensor) and per-row parameters: greedy row 0, temperatures,
    and with `filters` top-k and top-p on about half the rows each."""
    g = generator(seed)
    logits = (torch.randn(batch, vocab + 3, generator=g) * 2.0)[:, 2 : vocab + 2]
    temperature = torch.rand(batch, generator=g) * 1.5 + 0.3
    temperature[0] = 0.0
    top_k = torch.zeros(batch, dtype=torch.int64)
    top_p = torch.ones(batch)
    if filters:
        top_k = torch.where(torch.rand(batch, generator=g) < 0.5, torch.randint(1, 12, (batch,), generator=g), 0)
        top_p = torch.where(torch.rand(batch, generator=g) < 0.5, torch.rand(batch, generator=g) * 0.6 + 0.3, 1.0)
    seeds = torch.randint(-(2**62), 2**62, (batch,), generator=g)
    counter = torch.randint(0, 1000, (batch,), generator=g)
    args = (logits.to(dtype), temperature, top_k, top_p, seeds, counter)
    return tuple(a.to(device) for a in args)


def assert_matches_reference(args, lane: int, **config) -> torch.Tensor:
    poison_allocator()
    tokens = kernel.sample(*args, lane, **config)
    expected = ops.sample(*(a.cpu() for a in args), lane)
    assert tokens.dtype == torch.int64
    torch.testing.assert_close(tokens.cpu(), expected, rtol=0, atol=0)
    return tokens


@pytest.mark.parametrize("filters", [False, True])
def test_sample_matches_reference_fp32(filters: bool) -> None:
    args = make_case(12, 100, torch.float32, seed=1, filters=filters)
    assert_matches_reference(args, lane=3, block_v=64, nprobe=16)


def test_sample_matches_reference_bf16_ties() -> None:
    """bf16 logits repeat values often: top-k and top-p cuts land on tied tokens."""
    args = make_case(12, 300, torch.bfloat16, seed=2, filters=True)
    logits = args[0]
    assert logits[1].unique().numel() < logits.shape[1]  # the rows really tie
    assert_matches_reference(args, lane=0, block_v=128, nprobe=16)


def test_sample_keeps_every_token_tied_at_the_cut() -> None:
    """Hand-made ties exactly at the top-k and top-p thresholds: the kernel keeps all of them, as the
    reference does, so over many lanes it draws each tied token."""
    logits = torch.tensor([[0.0, 3.0, 2.0, 2.0, 2.0, -1.0, 1.0, 2.0]] * 4)
    temperature = torch.ones(4)
    top_k = torch.tensor([2, 3, 0, 2])  # rows 0, 1, 3: the 2nd/3rd largest is tied four ways
    top_p = torch.tensor([1.0, 1.0, 0.45, 0.9])  # rows 2, 3: the cut falls inside the tied group
    seeds, counter = torch.arange(4, dtype=torch.int64), torch.zeros(4, dtype=torch.int64)
    args = tuple(a.to(DEVICE) for a in (logits, temperature, top_k, top_p, seeds, counter))
    # 8 lanes (32 draws, about 5 of each tied token): the reference's draws cover every kept token by lane 2.
    drawn = torch.stack([assert_matches_reference(args, lane, **FEW_PASSES).cpu() for lane in range(8)])
    kept = ops.sampling_weights(logits, temperature, top_k, top_p) > 0
    assert kept[0].tolist() == [False, True, True, True, True, False, False, True]
    assert (kept == kept[0]).all()
    assert set(drawn.flatten().tolist()) == {1, 2, 3, 4, 7}


def test_sample_greedy_rows_and_minus_inf_logits() -> None:
    """temperature 0 takes the first argmax; -inf logits are never drawn (and a row that is -inf but
    for two tokens draws only those)."""
    g = generator(7)
    logits = torch.randn(6, 50, generator=g)
    logits[:, ::3] = float("-inf")
    logits[4, :] = float("-inf")
    logits[4, 10], logits[4, 20] = 1.0, 1.0  # a tie at the maximum too
    temperature = torch.tensor([0.0, 1.0, 0.5, 2.0, 1.0, 0.0])
    top_k = torch.tensor([0, 5, 0, 40, 0, 3])
    top_p = torch.tensor([1.0, 1.0, 0.8, 0.95, 1.0, 0.5])
    seeds, counter = torch.arange(6, dtype=torch.int64) * 31, torch.full((6,), 5, dtype=torch.int64)
    args = tuple(a.to(DEVICE) for a in (logits, temperature, top_k, top_p, seeds, counter))
    for lane in range(6):  # 4 search passes, not 8: the 16-probe searches run in the tests above
        tokens = assert_matches_reference(args, lane, **FEW_PASSES).cpu()
        assert torch.isfinite(logits.gather(1, tokens[:, None])).all()
        assert tokens[0] == logits[0].argmax() and tokens[5] == logits[5].argmax()
        assert tokens[4] in (10, 20)


def test_sample_vocab_split_over_programs() -> None:
    """Each row's vocab split over 5 programs per pass (as batch 1 runs on a GPU): the searches, the
    exact split sums and the draw's scan of one split give the reference's tokens."""
    args = make_case(2, 300, torch.float32, seed=4, filters=True)
    assert (
        kernel.distribution_stats(args[0].unsqueeze(1), args[0].unsqueeze(1), *args[1:4], 32, 16, 4, 64, 0).splits == 5
    )
    for lane in range(4):
        assert_matches_reference(args, lane, block_v=32, nprobe=16, chunk_v=64)


def candidate_case(vocab: int, seed: int, device=DEVICE):
    """One row of every kind in candidate_rows.KINDS: (sample's arguments, decided [B] expected)."""
    g = generator(seed)
    kinds = list(KINDS)
    logits = torch.stack([kind_logits(kind, vocab, g) for kind in kinds])
    temperature, top_k, top_p, decided = kind_parameters(kinds)
    seeds = torch.randint(-(2**62), 2**62, (len(kinds),), generator=g)
    counter = torch.randint(0, 1000, (len(kinds),), generator=g)
    return tuple(a.to(device) for a in (logits, temperature, top_k, top_p, seeds, counter)), decided


def test_sample_candidates_decide_exactly_the_rows_they_can(monkeypatch: pytest.MonkeyPatch) -> None:
    """A batch mixing rows the top-16 candidates decide (greedy with a tie, top-k < 16, top-p narrow,
    top-k + top-p, a cut between +0.0 and -0.0) with rows that must take the full-vocab passes (ties
    past the 16th candidate, top-k > 16, top-p wide, no filters, all-equal rows): each row's flag is the
    one intended (in both calls' own stats runs: record_decided), and every token is the reference's.
    One vocab split per row here: the verify test's "split" case runs the same stats passes over
    several (the interpreter's time is the limit)."""
    config = {**SMALL, "block_v": 128, "chunk_v": 512}
    args, decided = candidate_case(160, seed=11)
    flags = record_decided(monkeypatch)
    for lane in range(2):
        assert_matches_reference(args, lane, **config)
    assert len(flags) == 2 and all(torch.equal(f, decided) for f in flags)


def test_sample_without_candidates_matches_with_them(monkeypatch: pytest.MonkeyPatch) -> None:
    """candidates=0 turns the fast path off: the full-vocab passes alone give the same (reference) tokens."""
    args, _ = candidate_case(160, seed=12)
    flags = record_decided(monkeypatch)
    assert_matches_reference(args, 0, **{**SMALL, "block_v": 128, "chunk_v": 512, "candidates": 0})
    assert len(flags) == 1 and not flags[0].any()


def test_sample_refuses_bad_shapes() -> None:
    args = make_case(2, 10, torch.float32, seed=5, filters=False)
    with pytest.raises(ValueError, match=r"logits must be \[B, V\]"):
        kernel.sample(args[0].unsqueeze(0), *args[1:], 0)


def test_sample_draws_follow_process_logits() -> None:
    """A G-test of 128 draws (one row, 128 seeds; about 30 per kept token) against process_logits on a
    6-token vocab with top-k; the GPU test draws 200k."""
    assert sample_g_test(128, 6, top_k=4, top_p=1.0, device=DEVICE, **FEW_PASSES) > 1e-4


def sample_g_test(rows: int, vocab: int, top_k: int, top_p: float, device, **config) -> float:
    g = generator(vocab)
    logits = (torch.randn(1, vocab, generator=g) * 1.5).expand(rows, vocab).contiguous()
    temperature = torch.full((rows,), 0.8)
    top_ks, top_ps = torch.full((rows,), top_k), torch.full((rows,), top_p)
    seeds, counter = torch.arange(rows, dtype=torch.int64) * 7919 + 1, torch.zeros(rows, dtype=torch.int64)
    args = [a.to(device) for a in (logits, temperature, top_ks, top_ps, seeds, counter)]
    tokens = kernel.sample(*args, 2, **config)
    probs = ops.process_logits(logits[:1], temperature[:1], top_ks[:1], top_ps[:1])[0]
    return g_test_p_value(torch.bincount(tokens.cpu(), minlength=vocab), probs)


def test_sample_triton_opcheck() -> None:
    args = make_case(3, 40, torch.float32, seed=6, filters=True)
    opcheck(torch.ops.graphspec.sample_triton.default, (*args, 1, *SMALL.values()))
    tokens = torch.ops.graphspec.sample_triton(*args, 1, *SMALL.values())
    assert torch.equal(tokens.cpu(), ops.sample(*(a.cpu() for a in args), 1))


@pytest.mark.gpu
@pytest.mark.parametrize("candidates", [128, 0], ids=["candidates", "full_vocab"])
@pytest.mark.parametrize(("top_k", "top_p"), [(0, 1.0), (8, 1.0), (0, 0.8), (6, 0.9)])
def test_sample_draws_follow_process_logits_gpu(top_k: int, top_p: float, candidates: int) -> None:
    """Both the candidates' draw (16 tokens <= 128: every row decided but keep-all) and the full-vocab one."""
    config = {**kernel.CONFIGS[90], "candidates": candidates}
    assert sample_g_test(200_000, 16, top_k, top_p, torch.device("cuda"), **config) > 1e-4


@pytest.mark.gpu
@pytest.mark.parametrize("candidates", [CAP, 128])
def test_sample_candidates_real_vocab_gpu(candidates: int) -> None:
    """candidate_rows' kinds at the Llama-3 vocab (fp32, so no bf16 tie moves a cut): with 16 candidates
    each row is decided or not as intended (with 128 at least those); tokens equal the reference's but
    where tl.exp and torch.exp differ in a last bit right at a bound (allowed in 1 draw of 50)."""
    cuda = torch.device("cuda")
    args, decided = candidate_case(128256, seed=13, device=cuda)
    config = {**kernel.CONFIGS[90], "candidates": candidates}
    rows = args[0].unsqueeze(1)
    flags = decided_rows(rows, rows, *args[1:4], **config)
    assert torch.equal(flags, decided) if candidates == CAP else bool(flags[decided].all())
    same = torch.stack([kernel.sample(*args, lane, **config) == ops.sample(*args, lane) for lane in range(8)])
    assert same.float().mean().item() >= 0.98, same


@pytest.mark.gpu
@pytest.mark.parametrize("batch", [1, 8, 64])
def test_sample_real_shapes_gpu(batch: int) -> None:
    """Llama-3 vocab, bf16 logits: equal to the reference token for token but where tl.exp and
    torch.exp differ in a last bit right at a bound (not seen in practice; allowed in 1 row of 50)."""
    cuda = torch.device("cuda")
    args = make_case(batch, 128256, torch.bfloat16, seed=batch, filters=True, device=cuda)
    same = torch.stack(
        [kernel.sample(*args, lane, **kernel.CONFIGS[90]) == ops.sample(*args, lane) for lane in range(4)]
    )
    assert same.float().mean().item() >= 0.98, same


def accepted_with_draft_equal_to_target(batch: int, k: int, vocab: int, device, dtype, **config) -> torch.Tensor:
    """Draft tokens drawn by the sample kernel from logits that are also every target position's:
    q_j == p_j, so verify_rejection's kernel accepts every draft (u * q < p holds for u < 1) exactly
    when its q is the sample kernel's q; a token outside verify's top-k/top-p set, or a q that differs
    by one rounding, is rejected in some rows."""
    from graphspec.kernels import verify_rejection

    logits, temperature, top_k, top_p, seeds, counter = make_case(batch, vocab, dtype, 9, True, device)
    temperature[0] = 0.8  # no greedy row: every row samples
    draft = logits[:, None].expand(batch, k, vocab).contiguous()  # [B, K, V]
    drafts = torch.stack(
        [kernel.sample(draft[:, j], temperature, top_k, top_p, seeds, counter, j, **config) for j in range(k)], dim=1
    )
    target = torch.cat((draft, logits[:, None]), dim=1)
    _, accepted = verify_rejection.verify_rejection(
        target, draft, drafts, temperature, top_k, top_p, seeds, counter, **config
    )
    return accepted


def test_sample_draws_the_q_that_verify_rejection_uses() -> None:
    accepted = accepted_with_draft_equal_to_target(6, 2, 128, DEVICE, torch.bfloat16, **FEW_PASSES)
    assert (accepted == 2).all(), accepted


@pytest.mark.gpu
def test_sample_draws_the_q_that_verify_rejection_uses_gpu() -> None:
    config = kernel.CONFIGS[90]
    accepted = accepted_with_draft_equal_to_target(64, 4, 128256, torch.device("cuda"), torch.bfloat16, **config)
    assert (accepted == 4).all(), accepted


@pytest.mark.gpu
def test_sample_replays_in_cuda_graph_gpu() -> None:
    args = make_case(8, 128256, torch.bfloat16, seed=5, filters=True, device=torch.device("cuda"))
    config = kernel.CONFIGS[90]
    kernel.sample(*args, 0, **config)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        tokens = torch.ops.graphspec.sample_triton(*args, 0, *config.values())
    args[5].add_(1)  # the step counter advances between replays
    graph.replay()
    assert torch.equal(tokens, kernel.sample(*args, 0, **config))
