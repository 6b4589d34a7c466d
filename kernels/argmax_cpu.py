"""graphspec::argmax on the CPU: torch.argmax itself (the reference), as a composite op (Inductor,
for compile_cpu, sees torch.argmax); the greedy draft picks K tokens per step with it."""

from __future__ import annotations

from graphspec.kernels import cpu_library
from torch import Tensor

__all__ = ["CONFIGS", "argmax", "argmax_cpu"]

CONFIGS: dict[str, dict[str, int]] = {"cpu": {}}


def argmax(logits: Tensor) -> Tensor:
    return logits.argmax(dim=-1)


argmax_cpu = cpu_library.define("argmax", argmax)
