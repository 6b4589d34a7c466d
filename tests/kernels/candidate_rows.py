"""Logits rows built so that the candidates fast path (kernels/candidates.py) either decides them or must
fall back, for the sample and verify_rejection tests: each kind gives a row's logits, its sampling
parameters and whether its top CAP candidates decide it (CAP = 16, V well above it)."""

from __future__ import annotations

import pytest
import torch

CAP = 16

# kind -> (temperature, top_k, top_p, decided by the candidates)
KINDS: dict[str, tuple[float, int, float, bool]] = {
    "greedy_tie": (0.0, 0, 1.0, True),  # two tokens tie at the max, both candidates
    "greedy_tie_past_cap": (0.0, 0, 1.0, False),  # 20 tokens tie at the max: the 17th is no candidate
    "top_k_small": (0.8, 5, 1.0, True),
    "top_k_past_cap": (0.8, 40, 1.0, False),  # top_k > CAP
    "top_k_ties_past_cap": (1.0, 10, 1.0, False),  # the 10th largest ties with tokens past the CAP-th
    "top_p_narrow": (1.0, 0, 0.6, True),  # three large logits hold the mass: decided once Z is known
    "top_p_wide": (1.0, 0, 0.95, False),  # a flat row: 95% of the mass is spread far past CAP tokens
    "top_k_top_p": (0.7, 8, 0.7, True),
    "top_k_top_p_past_cap": (0.8, 50, 0.9, False),
    "no_filters": (1.2, 0, 1.0, False),  # keeps the whole vocab: the draw needs the full-vocab sums
    "signed_zeros": (0.5, 4, 1.0, True),  # the 4th largest is +0.0, a -0.0 right below it is dropped
    "signed_zeros_cut": (1.0, 10, 1.0, False),  # +0.0 and -0.0 tie as floats across the CAP boundary
    "all_equal": (1.0, 0, 1.0, False),
    "all_equal_top_k": (1.0, 3, 1.0, False),
    "greedy_all_equal": (0.0, 0, 1.0, False),
}


def kind_logits(kind: str, vocab: int, g: torch.Generator) -> torch.Tensor:
    """One fp32 logits row [vocab] of `kind`; the special tokens sit at random indices, far enough above
    the randn * 2 bulk that the kind's decision holds at a 128k vocab too."""
    base = torch.randn(vocab, generator=g)
    spots = torch.randperm(vocab, generator=g)  # distinct random indices for the hand-placed values
    row = base * 2
    if kind in ("greedy_tie", "greedy_tie_past_cap"):
        row[spots[: 2 if kind == "greedy_tie" else 20]] = 20.0
    elif kind == "top_k_ties_past_cap":
        row[spots[:8]] = 20.0 + torch.arange(8, dtype=torch.float32)  # 8 distinct largest
        row[spots[8:20]] = 19.0  # then 12 tied: the 10th largest is 19.0, tied up to the 20th
    elif kind == "top_p_narrow":
        row = base.clone()
        row[spots[:3]] = torch.tensor([30.0, 29.5, 29.0])
    elif kind == "top_p_wide":
        row = base * 0.3
    elif kind in ("signed_zeros", "signed_zeros_cut"):
        row = base.abs() * -1 - 5.0  # everything else well below zero
        row[spots[:3]] = torch.tensor([3.0, 2.0, 1.0])
        if kind == "signed_zeros":
            row[spots[3]], row[spots[4]] = 0.0, -0.0
        else:  # 13 + 3 = 16 candidates are 3 positives and any 13 of the 16 zeros
            row[spots[3:11]] = 0.0
            row[spots[11:19]] = -0.0
    elif kind in ("all_equal", "all_equal_top_k", "greedy_all_equal"):
        row = torch.full((vocab,), 1.5)
    return row


def kind_parameters(kinds: list[str]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(temperature [B], top_k [B], top_p [B], decided [B] bool) for rows of these kinds."""
    temperature, top_k, top_p, decided = zip(*(KINDS[kind] for kind in kinds), strict=True)
    return (
        torch.tensor(temperature),
        torch.tensor(top_k, dtype=torch.int64),
        torch.tensor(top_p),
        torch.tensor(decided),
    )


def decided_rows(target: torch.Tensor, draft: torch.Tensor, temperature, top_k, top_p, **config) -> torch.Tensor:
    """[R] bool: which stat rows of target [B, K+1, V] / draft [B, K, V] the candidates decided (the
    DONE flag the stats passes and the draw act on), in stat-row order b * (2K+1) + i."""
    from graphspec.kernels import verify_rejection
    from graphspec.kernels.candidates import DONE

    fields = [config[name] for name in verify_rejection.CONFIG_FIELDS]
    stats = verify_rejection.distribution_stats(target, draft, temperature, top_k, top_p, *fields)
    return (stats.cand[:, 0].cpu() & DONE.value) != 0


def record_decided(monkeypatch: pytest.MonkeyPatch) -> list[torch.Tensor]:
    """The decided_rows flags of every stats run that kernels.sample and kernels.verify_rejection make
    from now on, in call order: a test reads the flags of the very call whose tokens it checks, instead
    of running the stats passes a second time (under the interpreter they are most of a call's time)."""
    from graphspec.kernels import sample, verify_rejection
    from graphspec.kernels.candidates import DONE

    flags: list[torch.Tensor] = []
    original = verify_rejection.distribution_stats

    def recording(*args, **kwargs):
        stats = original(*args, **kwargs)
        flags.append((stats.cand[:, 0].cpu() & DONE.value) != 0)
        return stats

    monkeypatch.setattr(verify_rejection, "distribution_stats", recording)
    monkeypatch.setattr(sample, "distribution_stats", recording)  # sample imports it by name
    return flags
