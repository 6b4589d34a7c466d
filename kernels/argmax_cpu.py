"""graphspec::argmax on the CPU: the reference (torch.argmax, then the id lookup) as a composite op (Inductor,
for compile_cpu, sees torch.argmax); the greedy draft picks K tokens per step with it."""

from __future__ import annotations

from graphspec.kernels import cpu_library

from graphspec.ops import argmax_reference

__all__ = ["CONFIGS", "argmax_cpu", "argmax_reference"]

CONFIGS: dict[str, dict[str, int]] = {"cpu": {}}


argmax_cpu = cpu_library.define("argmax", argmax_reference)
