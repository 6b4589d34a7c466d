"""graphspec::add_rms_norm on the CPU: the reference's arithmetic (the same bits), as a composite op:
the Inductor CPU step (compile_cpu) fuses its torch ops with their neighbours."""

from __future__ import annotations

from graphspec.kernels import cpu_library
from torch import Tensor

from graphspec.ops import add_rms_norm_reference

__all__ = ["CONFIGS", "add_rms_norm", "add_rms_norm_cpu", "add_rms_norm_reference"]

CONFIGS: dict[str, dict[str, int]] = {"cpu": {}}


def add_rms_norm(x: Tensor, residual: Tensor, weight: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    normed, total = add_rms_norm_reference(x, residual, weight, eps)
    return normed.contiguous(), total.contiguous()


add_rms_norm_cpu = cpu_library.define("add_rms_norm", add_rms_norm)
