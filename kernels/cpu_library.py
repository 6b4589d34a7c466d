"""Registration shared by the CPU kernel files (kernels/<op>_cpu.py; no op lives here).

A CPU kernel op graphspec::<op>_cpu has exactly the reference op's schema under the new name, so
lowering swaps a node's target and keeps its arguments. Like every graphspec op it is defined through
graphspec/library.py (no custom_op wrappers per call, which would cost more than most ops' work at
decode sizes on the CPU). Imports torch only.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from graphspec import library, ops


def define(op: str, impl: Callable, fake: Callable | None = None) -> torch._ops.OpOverload:
    """Register graphspec::<op>_cpu with the schema of graphspec.ops.OPS[op], running `impl` (without
    `fake` a composite of the torch ops it calls; library.define_schema says when each is right)."""
    schema = str(ops.OPS[op]._schema)
    return library.define_schema(f"{op}_cpu{schema[schema.index('(') :]}", impl, fake)
