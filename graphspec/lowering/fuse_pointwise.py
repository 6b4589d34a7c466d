"""Run each stretch of a step's small integer and boolean glue as one kernel launch.

Input:  a lowered step graph (after lower_kernels), in place form. Between its kernels are aten ops on a
        few dozen integers: a drafter's positions and clamps, padding-row masks, the commit's lengths, each
        a launch of its own on a GPU (~1-2 us in a captured step).
Output: each group of such ops (ELEMENTWISE, VIEW_OPS, cat, stack; int64/int32/bool results of at most
        MAX_NUMEL elements) is one graphspec::fused_pointwise_triton node (kernels/fused_pointwise.py)
        whose program holds the group, with operator.getitem nodes for the values read outside it; the
        group's nodes are gone. A group is the eligible ops of one region between two points where one
        of its values is read outside it, anything may be written in place, or the region ends: the
        fused node sits right before that point, so every reader still comes after its value, no value
        is read across a write, and the regions stay in order. Groups of fewer than two compute ops are
        left alone (no launch to save); views of tensors from outside a group stay in the graph (their
        aliasing is kept) and the group reads them as inputs. Integer and boolean arithmetic is exact:
        the outputs are bitwise what the ops computed. On the CPU (no SM to lower for) and with
        lowering="reference" nothing changes.

    add = aten.add.Tensor(len, 2); clamp = aten.clamp(add, 0)   becomes
    fused = fused_pointwise_triton('{"inputs": ...}', [len]); clamp = getitem(fused, 0)
"""

from __future__ import annotations

import json
import operator
from typing import Any

import torch
import torch.fx as fx

from graphspec.config import PassContext, PassResult
from graphspec.lowering.lower_kernels import target_sm
from graphspec.lowering.registry import kernel_module
from graphspec.op_nodes import VIEW_OPS
from graphspec.passes.cleanup import may_mutate, tag, tidy

NAME = "fuse_pointwise"

MAX_NUMEL = 4096  # glue, not tensors of the model: a group's every value fits one program's block
_aten = torch.ops.aten
ELEMENTWISE = {
    _aten.add.Tensor: "add", _aten.sub.Tensor: "sub", _aten.mul.Tensor: "mul", _aten.neg.default: "neg",
    _aten.minimum.default: "minimum", _aten.maximum.default: "maximum",
    _aten.eq.Tensor: "eq", _aten.eq.Scalar: "eq", _aten.ne.Tensor: "ne", _aten.ne.Scalar: "ne",
    _aten.lt.Tensor: "lt", _aten.lt.Scalar: "lt", _aten.le.Tensor: "le", _aten.le.Scalar: "le",
    _aten.gt.Tensor: "gt", _aten.gt.Scalar: "gt", _aten.ge.Tensor: "ge", _aten.ge.Scalar: "ge",
    _aten.logical_and.default: "logical_and", _aten.logical_or.default: "logical_or",
    _aten.logical_not.default: "logical_not", _aten.where.self: "where",
}  # fmt: skip
COMPARISONS = frozenset({"eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or", "logical_not"})
OTHERS = frozenset({_aten.clamp.default, _aten._to_copy.default, _aten.cat.default, _aten.stack.default})
# The dtypes a program holds, by their names there (kernels/fused_pointwise.py's DTYPES).
_NAMES = {torch.int64: "int64", torch.int32: "int32", torch.bool: "bool"}


def run(gm: fx.GraphModule, ctx: PassContext) -> PassResult:
    sm = target_sm(ctx)
    if sm is None or ctx.lowering == "reference":
        return PassResult(gm, changed=False, note="no kernels here (CPU or lowering=reference)")
    groups = _groups(gm.graph)
    # A launch is saved only where two compute ops (not views) share one; a group reads at least one tensor
    # from outside (one of constants alone was folded by fold_constants), which gives its outputs' device.
    fused = [group for group in groups if sum(node.target not in VIEW_OPS for node in group) >= 2 and _reads(group)]
    for group in fused:
        _fuse(gm.graph, group, sm)
    if not fused:
        return PassResult(gm, changed=False, note="no group of two or more small integer ops")
    tidy(gm, dead_code=False)  # in place form: nothing may be eliminated as dead
    ops = sum(len(group) for group in fused)
    return PassResult(gm, changed=True, stats={"groups": len(fused), "fused_ops": ops})


def _groups(graph: fx.Graph) -> list[list[fx.Node]]:
    """The graph's groups in order (see the module docstring for where one ends)."""
    groups: list[list[fx.Node]] = []
    current: list[fx.Node] = []
    members: set[fx.Node] = set()
    for node in graph.nodes:
        eligible = node.op == "call_function" and _eligible(node, members)
        if current and (
            (node.op == "call_function" and node.meta.get("gs_region") != current[0].meta.get("gs_region"))
            or (not eligible and (may_mutate(node) or node.op == "output" or members & set(node.all_input_nodes)))
        ):
            groups.append(current)
            current, members = [], set()
            eligible = node.op == "call_function" and _eligible(node, members)
        if eligible:
            current.append(node)
            members.add(node)
    return groups


def _reads(group: list[fx.Node]) -> bool:
    """Whether the group reads any tensor from outside it."""
    members = set(group)
    return any(source not in members for node in group for source in node.all_input_nodes)


def _eligible(node: fx.Node, members: set[fx.Node]) -> bool:
    """Whether a node may join a group that holds `members`."""
    value = node.meta.get("val")
    if not isinstance(value, torch.Tensor) or value.dtype not in _NAMES or value.numel() > MAX_NUMEL:
        return False
    if node.target in VIEW_OPS:  # only views of the group's own values (a view of an input keeps its aliasing)
        return isinstance(node.args[0], fx.Node) and node.args[0] in members
    if node.target not in ELEMENTWISE and node.target not in OTHERS:
        return False
    tensors = [source.meta.get("val") for source in node.all_input_nodes]
    if not all(isinstance(t, torch.Tensor) and t.dtype in _NAMES for t in tensors):
        return False
    if any(isinstance(arg, float) for arg in node.args):
        return False
    if node.target in (_aten.add.Tensor, _aten.sub.Tensor) and node.kwargs.get("alpha", 1) != 1:
        return False
    if node.target == _aten._to_copy.default:  # a cast, nothing else
        return set(node.kwargs) <= {"dtype", "layout", "device"} and node.kwargs.get("device") in (None, value.device)
    name = ELEMENTWISE.get(node.target)
    if name in COMPARISONS:
        return True
    if name == "where":  # the branches keep the result's dtype
        return all(t.dtype == value.dtype for t in tensors[1:]) and tensors[0].dtype == torch.bool
    return all(t.dtype == value.dtype for t in tensors)  # arithmetic, clamp, cat, stack: no promotion


def _fuse(graph: fx.Graph, group: list[fx.Node], sm: int) -> None:
    program = _Program(set(group))
    for node in group:
        program.add(node)
    outputs = [node for node in group if any(user not in program.members for user in node.users)]
    spec = {
        "inputs": [{"shape": list(n.meta["val"].shape), "dtype": _NAMES[n.meta["val"].dtype]} for n in program.inputs],
        "nodes": program.nodes,
        "outputs": [program.positions[node] for node in outputs],
    }
    kernel_module("fused_pointwise_triton")  # registers the op (kernel modules load lazily: tests/kernels/interpret.py)
    last = group[-1]
    with graph.inserting_after(last):
        text = json.dumps(spec, separators=(",", ":"))
        fused = graph.call_function(torch.ops.graphspec.fused_pointwise_triton.default, (text, program.inputs))
    reads = [fused]
    for index, node in enumerate(outputs):
        with graph.inserting_after(reads[-1]):
            read = graph.call_function(operator.getitem, (fused, index))
        read.meta["val"] = node.meta["val"]
        node.replace_all_uses_with(read, delete_user_cb=lambda user: user not in program.members)
        reads.append(read)
    tag(reads, NAME, last.meta.get("gs_region"))
    fused.meta["gs_kernel"] = {"kernel": "fused_pointwise", "sm": sm, "config": {"ops": len(group)}}
    for node in reversed(group):
        graph.erase_node(node)


class _Program:
    """A group's program (kernels/fused_pointwise.py's format) as its nodes are added in graph order."""

    def __init__(self, members: set[fx.Node]) -> None:
        self.members = members
        self.inputs: list[fx.Node] = []  # the tensors from outside the group, in first-read order
        self.nodes: list[dict[str, Any]] = []
        self.positions: dict[fx.Node, int] = {}  # group node -> its record's index

    def ref(self, arg: Any) -> Any:
        if not isinstance(arg, fx.Node):
            return arg
        if arg in self.members:
            return {"node": self.positions[arg]}
        if arg not in self.inputs:
            self.inputs.append(arg)
        return {"in": self.inputs.index(arg)}

    def append(self, record: dict[str, Any]) -> dict[str, Any]:
        self.nodes.append(record)
        return {"node": len(self.nodes) - 1}

    def add(self, node: fx.Node) -> None:
        self.append(self.record(node))
        self.positions[node] = len(self.nodes) - 1

    def record(self, node: fx.Node) -> dict[str, Any]:
        value, target, args = node.meta["val"], node.target, node.args
        base = {"shape": list(value.shape), "dtype": _NAMES[value.dtype]}
        source = args[0].meta["val"] if isinstance(args[0], fx.Node) else None
        if target in ELEMENTWISE:
            return {"op": ELEMENTWISE[target], "args": [self.ref(a) for a in args], **base}
        if target == _aten.clamp.default:
            low = args[1] if len(args) > 1 else node.kwargs.get("min")
            high = args[2] if len(args) > 2 else node.kwargs.get("max")
            return {"op": "clamp", "args": [self.ref(args[0]), low, high], **base}
        if target == _aten._to_copy.default:
            return {"op": "to", "args": [self.ref(args[0])], **base}
        if target in (_aten.cat.default, _aten.stack.default):
            dim = (args[1] if len(args) > 1 else node.kwargs.get("dim", 0)) % value.dim()
            parts = [self.ref(a) for a in args[0]]
            if target == _aten.stack.default:  # stack: cat of the parts unsqueezed at dim
                shapes = [list(a.meta["val"].shape) for a in args[0]]
                parts = [
                    self.append({"op": "unsqueeze", "args": [part], "dim": dim, "dtype": base["dtype"],
                                 "shape": [*shape[:dim], 1, *shape[dim:]]})
                    for part, shape in zip(parts, shapes, strict=True)
                ]  # fmt: skip
            return {"op": "cat", "args": parts, "dim": dim, **base}
        # Views of the group's own values.
        view = {"args": [self.ref(args[0])], **base}
        if target == _aten.unsqueeze.default:
            return {"op": "unsqueeze", "dim": args[1] % value.dim(), **view}
        if target == _aten.expand.default:
            return {"op": "expand", **view}
        if target == _aten.slice.Tensor:
            dim = (args[1] if len(args) > 1 else 0) % source.dim()
            size = source.shape[dim]
            start, end, step = ((*args, None, None, None)[i] for i in (2, 3, 4))
            start, end, step = _bound(start, size, 0), _bound(end, size, size), 1 if step is None else step
            return {"op": "slice", "dim": dim, "start": start, "end": end, "step": step, **view}
        if target == _aten.select.int:
            dim = args[1] % source.dim()
            return {"op": "select", "dim": dim, "index": args[2] % source.shape[dim], **view}
        if target == _aten.transpose.int:
            dims = list(range(source.dim()))
            a, b = args[1] % source.dim(), args[2] % source.dim()
            dims[a], dims[b] = dims[b], dims[a]
            return {"op": "permute", "dims": dims, **view}
        if target == _aten.t.default:  # a transpose of the (at most) two dims
            return {"op": "permute", "dims": list(reversed(range(source.dim()))), **view}
        if target == _aten.permute.default:
            return {"op": "permute", "dims": [d % source.dim() for d in args[1]], **view}
        return {"op": "reshape", **view}  # view, _unsafe_view, reshape, alias


def _bound(index: int | None, size: int, default: int) -> int:
    """A slice bound as Python reads it: None -> default, negative from the end, clipped to 0..size."""
    if index is None:
        return default
    return min(max(index + size if index < 0 else index, 0), size)
