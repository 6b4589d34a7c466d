"""Registration shared by the CPU kernel files (kernels/<op>_cpu.py; no op lives here).

A CPU kernel op graphspec::<op>_cpu has exactly the reference op's schema under the new name, so
lowering swaps a node's target and keeps its arguments. It is registered with torch.library.Library
rather than torch.library.custom_op: the same schema and fake, without custom_op's per-call wrappers
(aliasing checks, autograd and dynamo guards), which cost about 60 us a call on the CPU, more than the
work of most ops at decode sizes (an add + RMSNorm of a few hundred floats). Imports torch only.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from graphspec import ops

LIBRARY = torch.library.Library("graphspec", "FRAGMENT")


def define(op: str, impl: Callable, fake: Callable | None = None) -> torch._ops.OpOverload:
    """Register graphspec::<op>_cpu with the schema of graphspec.ops.OPS[op], running `impl`.

    Without `fake` the op is a composite of the torch ops `impl` calls (CompositeImplicitAutograd):
    eager calls run `impl`, and tracing (torch.compile's, for the Inductor CPU step) sees those torch
    ops, so they fuse with their neighbours. With `fake` (ops that read values on the host, or that
    must stay one call) it is opaque: `fake` gives its output shapes to tracing."""
    schema = str(ops.OPS[op]._schema)
    return define_schema(f"{op}_cpu{schema[schema.index('(') :]}", impl, fake)


def define_schema(schema: str, impl: Callable, fake: Callable | None = None) -> torch._ops.OpOverload:
    """define() for an op of its own schema ("name(args) -> returns") in the graphspec namespace."""
    name = schema[: schema.index("(")]
    LIBRARY.define(schema)
    if fake is None:
        LIBRARY.impl(name, impl, "CompositeImplicitAutograd")
    else:
        LIBRARY.impl(name, impl, "CompositeExplicitAutograd")
        torch.library.register_fake(f"graphspec::{name}", fake, lib=LIBRARY)
    return getattr(torch.ops.graphspec, name).default
