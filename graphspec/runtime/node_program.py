"""Run an fx graph without generating its Python code.

fx runs a GraphModule through Python source it generates for the whole graph and compiles
(`GraphModule.recompile`): about 0.1 s for an 8B/1B step graph of some 4,000 nodes, and a cold start
rebuilds six step graphs and sixteen prefill parts (docs/BENCHMARKS.md). On CUDA a program runs in Python
twice, its warm-up run and its capture; every later call replays the captured graph. NodeProgram walks the
nodes instead: built in milliseconds, it calls each node's target on the values already computed and
drops each value after its last use, as fx's generated code does (so a capture's memory pool can reuse the
blocks of dead activations, as it does under the generated code). Graphs loaded from an artifact are
built lazily (LazyGraphModule), so nothing generates their code unless something calls them directly.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import torch.fx as fx

try:  # fx's lazily compiled GraphModule (torch >= 2.3; what Inductor builds its graphs with)
    from torch.fx._lazy_graph_module import _LazyGraphModule as LazyGraphModule
except ImportError:  # pragma: no cover - another torch: every graph compiles its code at once
    LazyGraphModule = fx.GraphModule


class _Slot:
    """A reference to the value of the node at `index` in the program's value list."""

    __slots__ = ("index",)

    def __init__(self, index: int) -> None:
        self.index = index


def _template(value: Any, slots: dict[fx.Node, int]) -> Any:
    return fx.node.map_arg(value, lambda node: _Slot(slots[node]))


def _resolve(value: Any, values: list[Any]) -> Any:
    if isinstance(value, _Slot):
        return values[value.index]
    if isinstance(value, (tuple, list)):
        resolved = [_resolve(item, values) for item in value]
        return resolved if isinstance(value, list) else tuple(resolved)
    if isinstance(value, dict):
        return {key: _resolve(item, values) for key, item in value.items()}
    return value


def _has_slots(value: Any) -> bool:
    if isinstance(value, _Slot):
        return True
    if isinstance(value, (tuple, list)):
        return any(map(_has_slots, value))
    if isinstance(value, dict):
        return any(map(_has_slots, value.values()))
    return False


class NodeProgram:
    """gm's graph as a list of calls; `program(*inputs)` returns what `gm(*inputs)` returns, computed by the
    same calls in the same order, without gm's generated code."""

    def __init__(self, gm: fx.GraphModule) -> None:
        nodes = list(gm.graph.nodes)
        slots = {node: index for index, node in enumerate(nodes)}
        last_use: dict[fx.Node, fx.Node] = {}
        for node in nodes:
            for used in node.all_input_nodes:
                last_use[used] = node
        dead_after: dict[fx.Node, list[int]] = {node: [] for node in nodes}
        for value, user in last_use.items():
            dead_after[user].append(slots[value])
        for node in nodes:  # a value nothing reads (an in-place op's result) dies at once, as in fx's code
            if not node.users and node.op not in ("output", "placeholder"):
                dead_after[node].append(slots[node])
        self.size = len(nodes)
        self.placeholders: list[int] = []
        # (slot, callable, args, kwargs, whether args/kwargs need resolving, slots dead after it)
        self.calls: list[tuple[int, Callable[..., Any], Any, Any, bool, tuple[int, ...]]] = []
        self.output: Any = None
        for node in nodes:
            slot = slots[node]
            if node.op == "placeholder":
                if node.args or node.kwargs:
                    raise NotImplementedError(f"{node.name}: placeholders with defaults are not supported")
                self.placeholders.append(slot)
                continue
            if node.op == "output":
                self.output = _template(node.args[0], slots)
                continue
            if node.op == "get_attr":
                function: Callable[..., Any] = operator.attrgetter(node.target)
                args, kwargs = (gm,), {}
            elif node.op == "call_function":
                function, args, kwargs = node.target, node.args, node.kwargs
            elif node.op == "call_module":
                function, args, kwargs = gm.get_submodule(node.target), node.args, node.kwargs
            elif node.op == "call_method":
                function, args, kwargs = _method_call(node.target), node.args, node.kwargs
            else:  # pragma: no cover - fx has no other opcodes
                raise NotImplementedError(f"{node.name}: opcode {node.op}")
            args, kwargs = _template(tuple(args), slots), _template(dict(kwargs), slots)
            dynamic = _has_slots(args) or _has_slots(kwargs)
            self.calls.append((slot, function, args, kwargs, dynamic, tuple(dead_after[node])))

    def __call__(self, *inputs: Any) -> Any:
        if len(inputs) != len(self.placeholders):
            raise TypeError(f"the program takes {len(self.placeholders)} inputs, {len(inputs)} were given")
        values: list[Any] = [None] * self.size
        for slot, value in zip(self.placeholders, inputs, strict=True):
            values[slot] = value
        del inputs  # the program, not the caller's tuple, decides when an input may be freed
        for slot, function, args, kwargs, dynamic, dead in self.calls:
            if dynamic:
                values[slot] = function(*_resolve(args, values), **_resolve(kwargs, values))
            else:
                values[slot] = function(*args, **kwargs)
            for index in dead:
                values[index] = None
        return _resolve(self.output, values)


def _method_call(name: str) -> Callable[..., Any]:
    def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        return getattr(self, name)(*args, **kwargs)

    return call


def runner(gm: fx.GraphModule) -> Callable[..., Any]:
    """What to call to run gm once or twice (a warm-up, a capture): a NodeProgram over its nodes, unless gm
    already has its generated code (then gm itself is as quick)."""
    if isinstance(gm, LazyGraphModule) and getattr(gm, "_needs_recompile", lambda: False)():
        return NodeProgram(gm)
    return gm


def with_code(gm: fx.GraphModule) -> fx.GraphModule:
    """gm as a GraphModule with its generated code: gm itself, or for a lazy one a plain GraphModule over
    the same graph and attributes, for torch.compile, which cannot trace a lazy module's forward."""
    if isinstance(gm, LazyGraphModule) and LazyGraphModule is not fx.GraphModule:
        return fx.GraphModule(gm, gm.graph, class_name=type(gm).__name__)
    return gm
