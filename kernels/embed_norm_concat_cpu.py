"""graphspec::embed_norm_concat on the CPU: the reference's arithmetic (the same bits), as a composite op: the
Inductor CPU step (compile_cpu) fuses its torch ops with their neighbours, as it did the embedding, the two
norms (kernels/rms_norm_cpu.py) and the cat this op replaced."""

from __future__ import annotations

from graphspec.kernels import cpu_library

from graphspec.ops import embed_norm_concat_reference

__all__ = ["CONFIGS", "embed_norm_concat_cpu", "embed_norm_concat_reference"]

CONFIGS: dict[str, dict[str, int]] = {"cpu": {}}


embed_norm_concat_cpu = cpu_library.define("embed_norm_concat", embed_norm_concat_reference)
