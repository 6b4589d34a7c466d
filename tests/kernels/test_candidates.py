"""kernels/candidates.py: what decide_kernel decides from a row's top candidates is ops.sampling_weights' own
distribution (exactly the kept tokens; Z their weights' sum), and it decides exactly the rows it can."""

from __future__ import annotations

import torch
from graphspec.kernels import candidates as kernel
from graphspec.kernels.candidates import CAND_WIDTH, DONE, MAX_KNOWN

from graphspec import ops
from tests.kernels.candidate_rows import CAP, KINDS, kind_logits, kind_parameters
from tests.kernels.helpers import DEVICE, generator

VOCAB = 160


def random_rows(count: int, g: torch.Generator) -> tuple[torch.Tensor, ...]:
    """Rows of bf16-rounded logits (ties within a row) with random sampling parameters: top-k below and above
    CAP, top-p from narrow to off, both, neither, a few greedy rows."""
    logits = (torch.randn(count, VOCAB, generator=g) * torch.rand(count, 1, generator=g) * 8).bfloat16().float()
    temperature = torch.rand(count, generator=g) * 1.5 + 0.2
    temperature[::7] = 0.0
    top_k = torch.randint(0, 2 * CAP, (count,), generator=g)
    top_k[::3] = 0
    top_p = torch.rand(count, generator=g) * 0.9 + 0.05
    top_p[1::4] = 1.0
    return logits, temperature, top_k, top_p


def decide_both_stages(logits, temperature, top_k, top_p) -> torch.Tensor:
    """cand [R, CAND_WIDTH] after stage 0 and stage 1, with stage 1's full-vocab Z (the MASS_K pass's sum at
    probe 0) taken from the reference weights."""
    rows = logits.shape[0]
    values, index = kernel.candidates(logits[:, None, :], logits[:, None, :0], CAP)  # K = 0: target rows only
    cand = torch.zeros(rows, CAND_WIDTH, dtype=torch.int64, device=logits.device)
    part = torch.zeros(rows, 1, 1, dtype=torch.int64, device=logits.device)
    kernel.decide(0, values, index, cand, part, temperature, top_k, top_p, VOCAB, 0, num_warps=4)
    scaled, row_max = ops.scaled_logits(logits, temperature)
    part[:, 0, 0] = ops.fixed_point_weights(scaled, row_max).sum(-1)  # Z before any cut, what top-p alone needs
    kernel.decide(1, values, index, cand, part, temperature, top_k, top_p, VOCAB, 0, num_warps=4)
    return cand.cpu()


def assert_decisions_are_exact(logits, temperature, top_k, top_p, cand) -> None:
    """Every decided row keeps exactly the reference's tokens, and its Z is their weights' sum; every row whose max
    is known has the reference's max (and argmax)."""
    logits, temperature, top_k, top_p = (t.cpu() for t in (logits, temperature, top_k, top_p))
    scaled, row_max = ops.scaled_logits(logits, temperature)
    full = ops.fixed_point_weights(scaled, row_max)
    key = ops.order_key(scaled)
    reference = ops.sampling_weights(logits, temperature, top_k, top_p)
    for row in range(logits.shape[0]):
        flags, argmax, threshold, mass, max_bits = cand[row].tolist()
        if flags & MAX_KNOWN.value:
            assert torch.tensor([max_bits], dtype=torch.int32).view(torch.float32).item() == row_max[row].item(), row
            if temperature[row] <= 0:
                assert argmax == logits[row].argmax().item(), row
        if flags & DONE.value and temperature[row] > 0:
            kept = torch.where(key[row] >= threshold, full[row], 0)
            assert torch.equal(kept, reference[row]), row
            # Z: their sum, in the kernel's own fp32 exp (an ulp from torch's here and there)
            assert abs(mass - reference[row].sum().item()) <= 1e-6 * mass, row


def test_every_kind_is_decided_as_intended_and_exactly() -> None:
    g = generator(3)
    kinds = list(KINDS)
    logits = torch.stack([kind_logits(kind, VOCAB, g) for kind in kinds]).to(DEVICE)
    temperature, top_k, top_p, decided = (t.to(DEVICE) for t in kind_parameters(kinds))
    cand = decide_both_stages(logits, temperature, top_k, top_p)
    assert torch.equal((cand[:, 0] & DONE.value) != 0, decided.cpu())
    assert_decisions_are_exact(logits, temperature, top_k, top_p, cand)


def test_random_rows_are_decided_exactly() -> None:
    """Many random rows (ties from bf16 rounding): whatever the candidates decide is the reference's distribution,
    and they do decide rows of every filter kind (the test would pass vacuously otherwise)."""
    g = generator(5)
    logits, temperature, top_k, top_p = (t.to(DEVICE) for t in random_rows(96, g))
    cand = decide_both_stages(logits, temperature, top_k, top_p)
    assert_decisions_are_exact(logits, temperature, top_k, top_p, cand)
    done = (cand[:, 0] & DONE.value) != 0
    sampled = temperature.cpu() > 0
    for kind in (top_k.cpu() > 0, (top_k.cpu() == 0) & (top_p.cpu() < 1)):
        assert bool((done & sampled & kind).any())
