"""Run Triton kernels on the CPU: TRITON_INTERPRET=1 for kernel and lowering tests without a GPU.

Triton decides between compiling and interpreting when each @triton.jit function is created, its own
standard library (tl.sum, tl.max, tl.cdiv, ...) included. graphspec imports transformers, which
imports triton.language, so in a whole-suite run the standard library already exists in compiled form
before these tests' conftest runs. use_interpreter() sets the variable (our kernel modules are
imported later, lazily) and swaps the already-created standard-library functions for interpreted ones.
"""

from __future__ import annotations

import os

import torch


def use_interpreter() -> None:
    if torch.cuda.is_available() or (
        os.environ.get("TRITON_INTERPRET", "0") not in ("", "0") and _stdlib_interpreted()
    ):
        return
    os.environ["TRITON_INTERPRET"] = "1"
    # HACK(triton 3.6-3.9): no public way to re-create triton.language's @jit helpers after the
    # variable changes; remove when tests/conftest.py sets TRITON_INTERPRET before importing graphspec.
    import triton.language as tl
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    swapped: dict[int, InterpretedFunction] = {}
    for owner in (tl, tl.standard, tl.random, tl.core.tensor):
        for name, value in list(vars(owner).items()):
            if isinstance(value, JITFunction):
                interpreted = swapped.setdefault(id(value), InterpretedFunction(value.fn))
                setattr(owner, name, interpreted)


def _stdlib_interpreted() -> bool:
    import triton.language as tl
    from triton.runtime.jit import JITFunction

    return not isinstance(tl.standard.cdiv, JITFunction)
