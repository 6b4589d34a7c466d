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
    if torch.cuda.is_available():
        return
    if os.environ.get("TRITON_INTERPRET", "0") in ("", "0") or not _stdlib_interpreted():
        _interpret_stdlib()
    _no_overflow_checks()
    _patch_lang_once_per_launch()


def _interpret_stdlib() -> None:
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


def _no_overflow_checks() -> None:
    """The interpreter checks every int32 add, sub and mul for overflow (an int64 copy of both operands,
    two comparisons and an assert per element), which compiled kernels do not: a third of an interpreted
    kernel's time in the sampling tests. Tests run small shapes, whose index arithmetic cannot overflow
    int32 unless it is wrong, and then the outputs the tests compare are wrong too. So the check is off."""
    # HACK(triton 3.6-3.9): the interpreter's one builder holds InterpreterOptions() and there is no
    # switch; remove when there is one.
    import dataclasses

    from triton.runtime import interpreter

    builder = interpreter.interpreter_builder
    if getattr(builder.options, "sanitize_overflow", False):
        builder.options = dataclasses.replace(builder.options, sanitize_overflow=False)


def _patch_lang_once_per_launch() -> None:
    """The interpreter re-patches triton.language (a scan of every member of tl and tl.core) at every
    call of a @jit helper inside a kernel, though the launch patched the same modules already: a fifth of
    an interpreted kernel's time. A call whose modules the launch in progress has patched skips it."""
    # HACK(triton 3.6-3.9): relies on the interpreter's module-level _patch_lang(fn) -> scope, called by a
    # launch (which restores the scope when the grid is done) and by every nested call (which never does).
    import inspect

    import triton.language as tl
    from triton.runtime import interpreter

    original = interpreter._patch_lang
    if getattr(original, "graphspec_once", False):
        return
    patched: set[int] = set()  # the lang modules the launch in progress has patched

    class Unpatched:
        def restore(self) -> None:
            pass

    def patch_lang(fn):
        langs = {id(value) for value in fn.__globals__.values() if inspect.ismodule(value) and value in (tl, tl.core)}
        if patched and langs <= patched:
            return Unpatched()
        scope = original(fn)
        patched.update(langs)
        restore = scope.restore

        def restore_and_forget() -> None:  # only a launch restores its scope: the next one patches anew
            restore()
            patched.clear()

        scope.restore = restore_and_forget
        return scope

    patch_lang.graphspec_once = True
    interpreter._patch_lang = patch_lang


def _stdlib_interpreted() -> bool:
    import triton.language as tl
    from triton.runtime.jit import JITFunction

    return not isinstance(tl.standard.cdiv, JITFunction)
