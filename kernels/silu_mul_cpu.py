"""graphspec::silu_mul on the CPU: the reference's arithmetic (the same bits), as a composite op:
the Inductor CPU step (compile_cpu) fuses its torch ops with their neighbours."""

from __future__ import annotations

from graphspec.kernels import cpu_library
from torch import Tensor

from graphspec.ops import silu_mul_reference

__all__ = ["CONFIGS", "silu_mul", "silu_mul_cpu", "silu_mul_reference"]

CONFIGS: dict[str, dict[str, int]] = {"cpu": {}}


def silu_mul(gate_up: Tensor) -> Tensor:
    return silu_mul_reference(gate_up).contiguous()


silu_mul_cpu = cpu_library.define("silu_mul", silu_mul)
