"""graphspec::rms_norm on the CPU: the reference's arithmetic (the same bits), as a composite op:
the Inductor CPU step (compile_cpu) fuses its torch ops with their neighbours."""

from __future__ import annotations

from graphspec.kernels import cpu_library
from torch import Tensor

from graphspec.ops import rms_norm_reference

__all__ = ["CONFIGS", "rms_norm", "rms_norm_cpu", "rms_norm_reference"]

CONFIGS: dict[str, dict[str, int]] = {"cpu": {}}


def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    return rms_norm_reference(x, weight, eps).contiguous()


rms_norm_cpu = cpu_library.define("rms_norm", rms_norm)
