"""Questions about FX nodes that call graphspec ops, shared by the passes, the lowering and the runtime.

They live below all three so none of them imports another's module for a helper (the runtime must not
import a pass, a pass must not import the lowering).
"""

from __future__ import annotations

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
