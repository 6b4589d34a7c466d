"""Questions about FX nodes that call graphspec ops, shared by the passes, the lowering and the runtime.

They live below all three so none of them imports another's module for a helper (the runtime must not
import a pass, a pass must not import the lowering).
"""

from __future__ import annotations

import operator

import torch
import torch.fx as fx

# aten ops that only view their first argument (no copy, no arithmetic): what fuse_pointwise may take into a group
# as a view, and what the registry looks through to find whether a product's operand is a model weight.
VIEW_OPS = frozenset(
    {
        torch.ops.aten.unsqueeze.default,
        torch.ops.aten.expand.default,
        torch.ops.aten.slice.Tensor,
        torch.ops.aten.select.int,
        torch.ops.aten.permute.default,
        torch.ops.aten.transpose.int,
        torch.ops.aten.t.default,
        torch.ops.aten.view.default,
        torch.ops.aten._unsafe_view.default,
        torch.ops.aten.reshape.default,
        torch.ops.aten.alias.default,
    }
)

# What a node's output aliases, from the op's schema (is_view, is_in_place, is_alias): the passes that reason about
# memory (addmm_in_place, fuse_row_scale) ask these of any op. VIEW_OPS above is a fixed subset, for the code that
# must know exactly which views it handles (fuse_pointwise generates code for them).
# Views whose schema does not say so: make_fx reshapes an op's fresh result with _unsafe_view, which aliases it.
UNDECLARED_VIEWS = frozenset({torch.ops.aten._unsafe_view.default})


def op_returns(node: fx.Node) -> list | None:
    """The schema returns of the op node (of its tuple's producer for a getitem), None for other targets."""
    target = node.target
    if target is operator.getitem and isinstance(node.args[0], fx.Node):
        target = node.args[0].target
    schema = getattr(target, "_schema", None)
    return None if schema is None else list(schema.returns)


def is_view(node: fx.Node) -> bool:
    """Whether the node's output aliases its first argument without writing it (aten.view, t, slice..., and an
    item of a split's or unbind's list of views)."""
    if node.op != "call_function":
        return False
    if node.target is operator.getitem:
        return isinstance(node.args[0], fx.Node) and is_view(node.args[0])
    if node.target in UNDECLARED_VIEWS:
        return True
    returns = op_returns(node)
    if not returns or len(returns) != 1:
        return False
    alias = returns[0].alias_info
    return alias is not None and not alias.is_write


def is_in_place(node: fx.Node) -> bool:
    """Whether the node writes its first argument and returns it (aten.addmm_, ...): its output is that memory."""
    returns = op_returns(node) if node.op == "call_function" and node.target is not operator.getitem else None
    alias = returns[0].alias_info if returns and len(returns) == 1 else None
    return alias is not None and alias.is_write


def is_alias(node: fx.Node) -> bool:
    """Whether the node's output is its first argument's memory: a view of it, or the result of writing it."""
    return is_view(node) or is_in_place(node)


# Ops that read the KV cache across a row's whole length (their kernels pick a split grid per launch);
# each, reference or lowered (<op>_triton), is an eager-break point of piecewise capture.
ATTENTION_OPS = ("attention", "block_attention", "rotary_kv_attention")


def is_attention(node: fx.Node) -> bool:
    """An attention op of ATTENTION_OPS: the reference or its lowered kernel op."""
    target = node.target
    return (
        node.op == "call_function"
        and isinstance(target, torch._ops.OpOverload)
        and target.namespace == "graphspec"
        and target._opname.removesuffix("_triton") in ATTENTION_OPS
    )


def positional_args(node: fx.Node) -> tuple:
    """All schema arguments of a reference-op node as positional args (kwargs and defaults filled in),
    so the config ints can follow them."""
    schema = node.target._schema
    args = list(node.args)
    for argument in schema.arguments[len(args) :]:
        if argument.name in node.kwargs:
            args.append(node.kwargs[argument.name])
        elif argument.has_default_value():
            args.append(argument.default_value)
        else:
            raise ValueError(f"{node.name}: missing argument {argument.name!r} of {schema.name}")
    return tuple(args)
