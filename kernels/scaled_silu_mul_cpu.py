"""graphspec::scaled_silu_mul on the CPU: the reference's arithmetic (the same bits), as a composite op:
the Inductor CPU step (compile_cpu) fuses its torch ops with their neighbours."""

from __future__ import annotations

from graphspec.kernels import cpu_library
from torch import Tensor

from graphspec.ops import scaled_silu_mul_reference

__all__ = ["CONFIGS", "scaled_silu_mul", "scaled_silu_mul_cpu", "scaled_silu_mul_reference"]

CONFIGS: dict[str, dict[str, int]] = {"cpu": {}}


def scaled_silu_mul(gate_up: Tensor, x: Tensor, eps: float) -> Tensor:
    return scaled_silu_mul_reference(gate_up, x, eps).contiguous()


scaled_silu_mul_cpu = cpu_library.define("scaled_silu_mul", scaled_silu_mul)
