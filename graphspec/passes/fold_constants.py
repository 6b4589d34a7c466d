"""Compute once, at compile time, the small tensors a step would rebuild from nothing at every replay.

Input:  a pure (functional) graph, after mask_padding. Some of its ops depend on no input data: factory
        ops (aten.arange, aten.full, aten.scalar_tensor, ...), ops of only the shape of an input
        (aten.zeros_like, ones_like, full_like), and deterministic aten ops over those; and
        aten.where with a Python number for a branch, which materializes that number as a device
        tensor (a fill kernel) at every call. On a GPU each is a launch of its own (~1-2 us in a
        captured step: the position arithmetic of every drafter has a dozen).
Output: each such value that an input-dependent op reads is a constant (a get_attr of a contiguous tensor
        computed here, on the graph's device, by the same op; stored in the artifact like any graph
        constant), and where(c, x, number) reads a 0-dim constant of the result's dtype instead of the
        number. What only fed folded values is gone. Values over FOLD_BYTES, graph outputs and views of
        them stay as they were (a constant must never be an output: the runtime writes into outputs).
        Every result is bitwise what the op computed before (the same op on the same values, once).

    arange = aten.arange(5); le = aten.le(arange, x)   becomes   _folded_0 = self._folded_0; le = aten.le(_folded_0, x)
    where = aten.where.ScalarOther(c, x, 0)            becomes   where = aten.where.self(c, x, self._folded_1)
"""

from __future__ import annotations

import torch
import torch.fx as fx

from graphspec.config import PassContext, PassResult
from graphspec.passes.cleanup import region_for, tag, tidy

NAME = "fold_constants"

FOLD_BYTES = 64 * 1024  # a folded value's size limit: position tables, not logits rows
PREFIX = "_folded_"
_aten = torch.ops.aten
# Ops of an input's metadata only (shape, dtype, device, strides), never of its values.
SHAPE_ONLY = frozenset({_aten.zeros_like.default, _aten.ones_like.default, _aten.full_like.default})
# where with a Python number for a branch: which argument positions hold numbers.
WHERE_NUMBERS = {_aten.where.ScalarOther: (2,), _aten.where.ScalarSelf: (1,), _aten.where.Scalar: (1, 2)}


def run(gm: fx.GraphModule, ctx: PassContext) -> PassResult:
    graph = gm.graph
    outputs = _returned(graph)
    values: dict[fx.Node, torch.Tensor] = {}  # node -> its value, for every foldable node
    for node in graph.nodes:
        value = _fold(node, values, gm)
        if value is not None:
            values[node] = value
    folded = 0
    for node, value in values.items():
        readers = [user for user in node.users if user not in values]
        if not readers or node.op == "get_attr" or node in outputs:
            continue
        with graph.inserting_before(node):
            constant = _constant(gm, value.contiguous().clone())
        tag([constant], NAME)  # not an op: no region (checks.regions_run_in_order reads ops)
        for user in readers:
            user.replace_input_with(node, constant)
        folded += 1
    numbers = 0
    for node in list(graph.nodes):
        if node.op == "call_function" and node.target in WHERE_NUMBERS and _where_keeps_dtype(node):
            numbers += _where_with_constants(gm, node)
    if not folded and not numbers:
        return PassResult(gm, changed=False, note="no constant values")
    tidy(gm)  # the graph is still pure: what only fed folded values is dead
    return PassResult(gm, changed=True, stats={"folded_values": folded, "where_numbers": numbers})


def _fold(node: fx.Node, values: dict[fx.Node, torch.Tensor], gm: fx.GraphModule) -> torch.Tensor | None:
    """node's value when it depends on no input data and is small, else None."""
    if node.op == "get_attr":
        value = getattr(gm, node.target, None)
        return value if isinstance(value, torch.Tensor) else None
    if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
        return None
    target = node.target
    if target.namespace != "aten" or target._schema.is_mutable or torch.Tag.nondeterministic_seeded in target.tags:
        return None
    fake = node.meta.get("val")
    if not isinstance(fake, torch.Tensor) or fake.numel() * fake.element_size() > FOLD_BYTES:
        return None
    if target in SHAPE_ONLY:  # the first argument only says shape, dtype, device and strides
        like = fake_like(node.args[0].meta.get("val")) if isinstance(node.args[0], fx.Node) else None
        if like is None:
            return None
        args = (like, *node.args[1:])
    elif all(source in values for source in node.all_input_nodes):
        args = node.args
    else:
        return None
    args, kwargs = fx.node.map_arg((args, node.kwargs), lambda source: values[source])
    value = target(*args, **kwargs)
    return value if isinstance(value, torch.Tensor) else None


def fake_like(fake: object) -> torch.Tensor | None:
    """A real, uninitialized tensor with a fake tensor's shape, strides, dtype and device."""
    if not isinstance(fake, torch.Tensor):
        return None
    return torch.empty_strided(fake.shape, fake.stride(), dtype=fake.dtype, device=fake.device)


def _returned(graph: fx.Graph) -> set[fx.Node]:
    """The graph's outputs and every node they are views of (nothing returned may become a constant)."""
    output = graph.find_nodes(op="output")[0]
    returned: set[fx.Node] = set()
    todo = list(output.all_input_nodes)
    while todo:
        node = todo.pop()
        if node in returned:
            continue
        returned.add(node)
        if node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload) and node.target.is_view:
            todo += node.all_input_nodes
    return returned


def _where_keeps_dtype(node: fx.Node) -> bool:
    """Whether every tensor branch already has the result's dtype, so a number of that dtype in a 0-dim
    tensor promotes to the same result as the number itself."""
    fake = node.meta.get("val")
    branches = [arg.meta.get("val") for arg in node.args[1:] if isinstance(arg, fx.Node)]
    return isinstance(fake, torch.Tensor) and all(
        isinstance(branch, torch.Tensor) and branch.dtype == fake.dtype for branch in branches
    )


def _where_with_constants(gm: fx.GraphModule, node: fx.Node) -> int:
    """where(c, x, number) -> where.self(c, x, constant): each number as a 0-dim tensor of the result's
    dtype on its device, made once. Returns how many numbers became constants."""
    fake, args, region = node.meta["val"], list(node.args), region_for(node)
    with gm.graph.inserting_before(node):
        for position in WHERE_NUMBERS[node.target]:
            args[position] = _constant(gm, torch.tensor(args[position], dtype=fake.dtype, device=fake.device))
            tag([args[position]], NAME)
        replacement = gm.graph.call_function(_aten.where.self, tuple(args))
    replacement.meta["val"] = fake
    tag([replacement], NAME, region)
    node.replace_all_uses_with(replacement)
    gm.graph.erase_node(node)
    return len(WHERE_NUMBERS[node.target])


def _constant(gm: fx.GraphModule, value: torch.Tensor) -> fx.Node:
    """A get_attr node (at the graph's insertion point) of `value`, registered under a fresh name."""
    index = 0
    while hasattr(gm, f"{PREFIX}{index}"):
        index += 1
    gm.register_buffer(f"{PREFIX}{index}", value)
    return gm.graph.get_attr(f"{PREFIX}{index}")
