"""How graphspec defines its ops (the references in ops.py, the kernel ops in kernels/): on one
torch.library.Library fragment of the graphspec namespace, not with torch.library.custom_op.

custom_op wraps every call (aliasing checks, autograd, and torch._compile's dynamo guard). On the CPU the
wrappers cost about 60 us a call, more than the work of most ops at decode sizes; on any device the guard
imports torch._dynamo at the first call of any such op: about 5 s of a cold start on the GPU, for a module
nothing graphspec runs uses. An op defined here has what custom_op would give it for graphspec's use: a
schema inferred from the function's type hints (torch.library.infer_schema, as custom_op infers it),
its mutated arguments marked, a fake for tracing (torch.library.register_fake), and calls that go
straight to the function through the dispatcher. Imports torch only.
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable, Iterable

import torch

LIBRARY = torch.library.Library("graphspec", "FRAGMENT")

# Each functional state update (graphspec::<name>_update) -> its in-place write (graphspec::<name>_write),
# the state being both ops' first argument: filled by state_update_ops, read by defunctionalize_kv (which
# turns one into the other) and by the graph checks.
IN_PLACE: dict[torch._ops.OpOverload, torch._ops.OpOverload] = {}
# The write function behind each such pair, by name, looked up at every call (so a test can swap one in
# for both forms, as the negative control of the hybrid rollback's G-test does).
STATE_WRITES: dict[str, Callable[..., None]] = {}


def op(qualname: str, *, mutates_args: Iterable[str]) -> Callable[[Callable], torch._ops.OpOverload]:
    """Decorator, in place of torch.library.custom_op: define `qualname` ("graphspec::<name>") with the
    schema of the decorated function's type hints, run by that function on every device. Returns the op
    (torch.ops.graphspec.<name>.default); give its fake with torch.library.register_fake(qualname)."""
    namespace, name = qualname.split("::")
    if namespace != "graphspec":
        raise ValueError(f"{qualname}: graphspec's ops live in the graphspec namespace")

    def define(fn: Callable) -> torch._ops.OpOverload:
        schema = torch.library.infer_schema(fn, mutates_args=tuple(mutates_args))
        LIBRARY.define(f"{name}{schema}")
        LIBRARY.impl(name, fn, "CompositeExplicitAutograd")
        return getattr(torch.ops.graphspec, name).default

    return define


def define_schema(schema: str, impl: Callable, fake: Callable | None = None) -> torch._ops.OpOverload:
    """Define an op of a schema given as text ("name(args) -> returns") in the graphspec namespace.

    Without `fake` the op is a composite of the torch ops `impl` calls (CompositeImplicitAutograd):
    eager calls run `impl`, and tracing (torch.compile's, for the Inductor CPU step) sees those torch
    ops, so they fuse with their neighbours. With `fake` (ops that read values on the host, or that
    must stay one call) it is opaque: `fake` gives its output shapes to tracing."""
    name = schema[: schema.index("(")]
    LIBRARY.define(schema)
    if fake is None:
        LIBRARY.impl(name, impl, "CompositeImplicitAutograd")
    else:
        LIBRARY.impl(name, impl, "CompositeExplicitAutograd")
        torch.library.register_fake(f"graphspec::{name}", fake, lib=LIBRARY)
    return getattr(torch.ops.graphspec, name).default


def state_update_ops(name: str, write: Callable[..., None]) -> tuple[torch._ops.OpOverload, torch._ops.OpOverload]:
    """Define the two forms of a state write from one function `write(state, ...) -> None` that writes in
    place: graphspec::<name>_update, functional (a copy of the state with `write` applied: what tracing
    emits, so the traced graph has no mutation), and graphspec::<name>_write, `write` itself, marked as
    mutating the state (what defunctionalize_kv turns the update into). Both schemas come from `write`'s
    type hints; IN_PLACE records the pair and STATE_WRITES the function. Returns (update op, write op)."""
    hints = typing.get_type_hints(write)
    parameters = [p.replace(annotation=hints[p.name]) for p in inspect.signature(write).parameters.values()]

    STATE_WRITES[name] = write

    def update(state: torch.Tensor, *args: object) -> torch.Tensor:
        out = state.clone()
        STATE_WRITES[name](out, *args)
        return out

    def write_in_place(*args: object) -> None:
        STATE_WRITES[name](*args)

    update.__signature__ = inspect.Signature(parameters, return_annotation=torch.Tensor)
    write_in_place.__signature__ = inspect.Signature(parameters, return_annotation=None)
    update_op = op(f"graphspec::{name}_update", mutates_args=())(update)
    write_op = op(f"graphspec::{name}_write", mutates_args=(parameters[0].name,))(write_in_place)
    torch.library.register_fake(f"graphspec::{name}_update", _fake_update, lib=LIBRARY)
    torch.library.register_fake(f"graphspec::{name}_write", _fake_write, lib=LIBRARY)
    IN_PLACE[update_op] = write_op
    return update_op, write_op


def _fake_update(state: torch.Tensor, *args: object) -> torch.Tensor:
    return torch.empty_like(state)


def _fake_write(*args: object) -> None:
    return None
