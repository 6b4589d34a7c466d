"""Shared tail of every pass: dead-code elimination where legal, lint, recompile, refresh meta["val"];
and the tags every created node carries (meta["gs_pass"], meta["gs_region"]).

Never eliminate dead code after defunctionalize_kv: in-place KV writes return nothing and would look
dead to a naive DCE (FX keeps mutable-schema ops, but the rule keeps us independent of that detail).

Regions (trace.REGIONS) of created nodes: a node inserted before an existing node takes that node's
region (so a replacement inherits the region of the node it replaces, and input sanitizers at the
top of the step count as draft); a node inserted before the output takes the region of the last op
before it. A pass that opens a region of its own (insert_verify: "accept") names it explicitly.
This keeps every region one contiguous run in graph order (checks.regions_run_in_order).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
import torch.fx as fx
from torch._guards import detect_fake_mode
from torch.fx.passes.fake_tensor_prop import FakeTensorProp

# node.meta key of what the last propagation computed for a call_function node: (op target and its
# non-node arguments, its inputs' fingerprints, its fake result).
_PROPAGATED = "cleanup_propagated"  # not a "gs_" key: artifacts do not try to store it


def tidy(gm: fx.GraphModule, dead_code: bool = True) -> fx.GraphModule:
    if dead_code:
        gm.graph.eliminate_dead_code()
    gm.graph.lint()
    gm.recompile()
    propagate_meta(gm)
    return gm


def propagate_meta(gm: fx.GraphModule) -> None:
    """Re-run fake-tensor propagation so nodes a pass created carry meta["val"] like traced ones."""
    placeholders = gm.graph.find_nodes(op="placeholder")
    values = [node.meta.get("val") for node in placeholders]
    fake_mode = detect_fake_mode(values)
    if fake_mode is None or any(value is None for value in values):
        return  # hand-built graphs without fake values: nothing to propagate from
    ReusingFakeTensorProp(gm, mode=fake_mode).propagate_dont_convert_inputs(*values)


class ReusingFakeTensorProp(FakeTensorProp):
    """FakeTensorProp that takes a call_function node's fake result from the last propagation when nothing
    it depends on changed: the same target and non-node arguments, and inputs whose fake values have the
    same fingerprint (shape, strides, offset, dtype, device; _fingerprint). A fake result is a function of
    exactly those, so it is the one a full propagation would compute again, but for aliasing between fake
    tensors, which no pass reads. A pass changes a few nodes of thousands (mask_padding sanitizes the
    inputs, a fusion replaces a node with one of the same output), and propagating every node after every
    pass was 40% of a CPU compile. tests/passes/test_cleanup.py compares the two on real steps."""

    def run_node(self, n: fx.Node) -> Any:
        if n.op != "call_function":  # placeholders, output: cheap; submodules may change inside
            return super().run_node(n)
        key = (n.target, repr(fx.node.map_arg((n.args, n.kwargs), lambda node: f"%{node.name}")))
        inputs = tuple(_fingerprint(self.env[node]) for node in n.all_input_nodes)
        last = n.meta.get(_PROPAGATED)
        if last is not None and "val" in n.meta and last[0] == key and last[1] == inputs:
            return last[2]
        result = super().run_node(n)
        n.meta[_PROPAGATED] = (key, inputs, result)
        return result


class _Same:
    """Equal only to a _Same of the very same object (a fake tensor holding a constant: its value counts)."""

    def __init__(self, value: object) -> None:
        self.value = value

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Same) and other.value is self.value

    __hash__ = None  # type: ignore[assignment]


def _fingerprint(value: object) -> object:
    """What a fake result depends on of an input value: a tensor's metadata, a sequence's items, else the
    value itself (ints, floats, None)."""
    if isinstance(value, torch.Tensor):
        if getattr(value, "constant", None) is not None:
            return _Same(value)
        return (tuple(value.shape), value.stride(), value.storage_offset(), value.dtype, value.device)
    if isinstance(value, (tuple, list)):
        return (type(value).__name__, tuple(_fingerprint(item) for item in value))
    return value


def tag(nodes: list[fx.Node], pass_name: str, region: str | None = None) -> None:
    """meta["gs_pass"] = pass_name and, when given, meta["gs_region"] = region on every node."""
    for node in nodes:
        node.meta["gs_pass"] = pass_name
        if region is not None:
            node.meta["gs_region"] = region


def may_mutate(node: fx.Node) -> bool:
    """Whether a node may write some tensor in place: a mutable-schema op, or a module/method call
    whose effects a pass cannot see."""
    if node.op in ("call_module", "call_method"):
        return True
    schema = getattr(node.target, "_schema", None)
    return node.op == "call_function" and schema is not None and schema.is_mutable


def nodes_between(first: fx.Node, last: fx.Node) -> Iterator[fx.Node]:
    """The nodes strictly after `first` and before `last` in graph order (last must follow first):
    what a fusion that moves work from one to the other must check."""
    node = first.next
    while node is not last:
        yield node
        node = node.next


def region_for(position: fx.Node) -> str | None:
    """The region of nodes inserted right before `position`: its own, else that of the first later
    node with one, else (before the output) that of the last earlier one; None in untagged graphs."""
    node = position
    while node.op != "root":  # the graph's sentinel: both ends of the node list
        if "gs_region" in node.meta:
            return node.meta["gs_region"]
        node = node.next
    node = position.prev
    while node.op != "root":
        if "gs_region" in node.meta:
            return node.meta["gs_region"]
        node = node.prev
    return None
