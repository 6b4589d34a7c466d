"""meta["val"] (fake tensors) of a graph's nodes, propagated again after a pass without redoing the nodes
nothing changed for.

A traced graph's nodes carry the fake values make_fx computed; a pass that creates nodes has them
propagated (passes/cleanup.py's tidy). A pass changes a few nodes of thousands (mask_padding sanitizes the
inputs, a fusion replaces a node with one of the same output), and propagating every node after every pass
was 40% of a CPU compile. So each call_function node records what its value was computed from (record: at
trace time, from make_fx's values; ReusingFakeTensorProp: at each propagation), and a later propagation
takes the recorded value when nothing it depends on changed: the same target and non-node arguments, and
inputs whose values have the same fingerprint (shape, strides, offset, dtype, device). A fake result is a
function of exactly those, so it is what a full propagation would compute again, but for aliasing between
fake tensors, which nothing here reads. tests/test_fake_meta.py compares the two after every pass of real
steps.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.fx as fx
from torch._guards import detect_fake_mode
from torch._subclasses.fake_tensor import FakeTensor
from torch.fx.passes.fake_tensor_prop import FakeTensorProp

# node.meta key of what a call_function node's value was computed from: (target and non-node arguments,
# its inputs' fingerprints, the value). Not a "gs_" key: artifacts do not try to store it.
RECORD = "fake_meta_record"


def propagate(gm: fx.GraphModule) -> None:
    """Fake-tensor propagation from the placeholders' values, reusing each unchanged node's recorded value;
    nothing for hand-built graphs without fake values."""
    placeholders = gm.graph.find_nodes(op="placeholder")
    values = [node.meta.get("val") for node in placeholders]
    fake_mode = detect_fake_mode(values)
    if fake_mode is None or any(value is None for value in values):
        return
    ReusingFakeTensorProp(gm, mode=fake_mode).propagate_dont_convert_inputs(*values)


def record(gm: fx.GraphModule) -> None:
    """Record a freshly traced graph's values as computed from its nodes as they are (make_fx ran them), so
    the first propagation after a pass reuses them too."""
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.meta.get("val") is not None:
            inputs = tuple(fingerprint(source.meta.get("val")) for source in node.all_input_nodes)
            node.meta[RECORD] = (_key(node), inputs, node.meta["val"])


class ConstantsFakeTensorProp(FakeTensorProp):
    """FakeTensorProp over graphs with constants: a get_attr tensor (passes/fold_constants.py) is real, and
    its readers run on fake tensors, so it is read as a fake tensor of itself."""

    def get_attr(self, target: Any, args: Any, kwargs: Any) -> Any:
        value = super().get_attr(target, args, kwargs)
        if isinstance(value, torch.Tensor) and not isinstance(value, FakeTensor):
            return self._mode.from_tensor(value, static_shapes=True)
        return value


class ReusingFakeTensorProp(ConstantsFakeTensorProp):
    """FakeTensorProp that takes a call_function node's recorded value when nothing it depends on changed."""

    def run_node(self, n: fx.Node) -> Any:
        if n.op != "call_function":  # placeholders, output: cheap; submodules may change inside
            return super().run_node(n)
        key, inputs = _key(n), tuple(fingerprint(self.env[node]) for node in n.all_input_nodes)
        last = n.meta.get(RECORD)
        if last is not None and "val" in n.meta and last[0] == key and last[1] == inputs:
            return last[2]
        result = super().run_node(n)
        n.meta[RECORD] = (key, inputs, result)
        return result


def _key(node: fx.Node) -> tuple[Any, str]:
    return node.target, repr(fx.node.map_arg((node.args, node.kwargs), lambda source: f"%{source.name}"))


class _Same:
    """Equal only to a _Same of the very same object (a fake tensor holding a constant: its value counts)."""

    def __init__(self, value: object) -> None:
        self.value = value

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Same) and other.value is self.value

    __hash__ = None  # type: ignore[assignment]


def fingerprint(value: object) -> object:
    """What a fake result depends on of an input value: a tensor's metadata, a sequence's items, else the
    value itself (ints, floats, None)."""
    if isinstance(value, torch.Tensor):
        if getattr(value, "constant", None) is not None:
            return _Same(value)
        return (tuple(value.shape), value.stride(), value.storage_offset(), value.dtype, value.device)
    if isinstance(value, (tuple, list)):  # make_fx records a list where FakeTensorProp an immutable_list
        return ("tuple" if isinstance(value, tuple) else "list", tuple(fingerprint(item) for item in value))
    return value
