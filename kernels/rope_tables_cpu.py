"""graphspec::rope_tables on the CPU: the reference's arithmetic (the same bits), as a composite op: the Inductor
CPU step (compile_cpu) sees the cast, multiply, cat, cos and sin it saw before the op existed."""

from __future__ import annotations

from graphspec.kernels import cpu_library

from graphspec.ops import rope_tables_reference

__all__ = ["CONFIGS", "rope_tables_cpu", "rope_tables_reference"]

CONFIGS: dict[str, dict[str, int]] = {"cpu": {}}


rope_tables_cpu = cpu_library.define("rope_tables", rope_tables_reference)
