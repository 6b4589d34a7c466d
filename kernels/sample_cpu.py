"""graphspec::sample on the CPU: the reference's draw over kernels/sampling_cpu.py's weights, which equal
ops.sampling_weights' but skip its full-vocabulary sort when each row's top candidates settle its cuts.
The same tokens as the reference op, bit for bit."""

from __future__ import annotations

import torch
from graphspec.kernels import cpu_library, sampling_cpu
from torch import Tensor

from graphspec import ops

__all__ = ["CONFIGS", "sample", "sample_cpu"]

CONFIGS: dict[str, dict[str, int]] = {"cpu": {}}


def sample(
    logits: Tensor, temperature: Tensor, top_k: Tensor, top_p: Tensor, seed: Tensor, counter: Tensor, lane: int
) -> Tensor:
    weight = sampling_cpu.sampling_weights(logits, temperature, top_k, top_p)
    return ops.sample_from(weight, ops.uniform(seed, counter, lane))


def _fake(logits, temperature, top_k, top_p, seed, counter, lane):
    return logits.new_empty(logits.shape[:1], dtype=torch.int64)


# Opaque (a fake of its own): whether the candidates settle the batch is read on the host.
sample_cpu = cpu_library.define("sample", sample, _fake)
