"""graphspec::verify_rejection on the CPU: the reference's rejection sampling over p and q from
kernels/sampling_cpu.py, which equal ops.process_logits' but skip its full-vocabulary sort when each
row's top candidates settle its cuts. The same tokens and accepted counts as the reference op."""

from __future__ import annotations

import torch
from graphspec.kernels import cpu_library, sampling_cpu
from torch import Tensor

from graphspec import ops

__all__ = ["CONFIGS", "verify_rejection", "verify_rejection_cpu"]

CONFIGS: dict[str, dict[str, int]] = {"cpu": {}}


def verify_rejection(
    target_logits: Tensor,
    draft_logits: Tensor,
    draft_tokens: Tensor,
    temperature: Tensor,
    top_k: Tensor,
    top_p: Tensor,
    seed: Tensor,
    counter: Tensor,
) -> tuple[Tensor, Tensor]:
    p = sampling_cpu.process_logits(target_logits, temperature, top_k, top_p)  # [B, K+1, V]
    q = sampling_cpu.process_logits(draft_logits, temperature, top_k, top_p)  # [B, K, V]
    return ops.rejection_from_probabilities(p, q, draft_tokens, seed, counter)


def _fake(target_logits, draft_logits, draft_tokens, temperature, top_k, top_p, seed, counter):
    batch, positions, _ = target_logits.shape
    return (
        target_logits.new_empty((batch, positions), dtype=torch.int64),
        target_logits.new_empty((batch,), dtype=torch.int64),
    )


# Opaque (a fake of its own): whether the candidates settle the batch is read on the host.
verify_rejection_cpu = cpu_library.define("verify_rejection", verify_rejection, _fake)
