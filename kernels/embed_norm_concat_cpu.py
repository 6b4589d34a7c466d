"""graphspec::embed_norm_concat on the CPU: the reference's arithmetic (the same bits), as a composite op: the
Inductor CPU step (compile_cpu) fuses its torch ops with their neighbours, as it did the embedding, the two
norms (kernels/rms_norm_cpu.py) and the cat this op replaced."""

from __future__ import annotations

from graphspec.kernels import cpu_library
from torch import Tensor

from graphspec.ops import embed_norm_concat_reference

__all__ = ["CONFIGS", "embed_norm_concat", "embed_norm_concat_cpu", "embed_norm_concat_reference"]

CONFIGS: dict[str, dict[str, int]] = {"cpu": {}}


def embed_norm_concat(
    tokens: Tensor, embed_weight: Tensor, embed_norm: Tensor, hidden: Tensor, hidden_norm: Tensor, eps: float
) -> Tensor:
    return embed_norm_concat_reference(tokens, embed_weight, embed_norm, hidden, hidden_norm, eps)


embed_norm_concat_cpu = cpu_library.define("embed_norm_concat", embed_norm_concat)
