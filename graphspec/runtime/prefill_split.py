"""Split a prefill chunk program into the part the first token needs and the rest (the drafter's prefill).

A chunk program (trace_prefill.py) runs the target over the chunk and then the drafter's prefill over
the target's hidden states. The first token depends only on the target's part, so the runtime runs the
two parts as two programs and queues the drafter's parts that can wait after the first token has left
for the host (runtime/prefill.py): the device runs them while the host hands the token out. On a GPU
that takes the drafter's prefill (a 1B draft model's is about an eighth of an 8B target's) out of the
time to first token. The compiled graph and the artifact stay one program: the split is derived here,
at load, from dataflow alone, for every drafter.

The first part is every node the first-token outputs (the PREFILL_OUTPUTS and, when present, the
features) depend on, closed under state: a node that reads or writes a state (through the placeholder
or a view of it) that a first-part node reads or writes joins it, with its own inputs. So the two
parts share no state, and running the first part whole before the rest computes what the program
computes. Values the rest reads from the first part cross as extra outputs of the first and extra
inputs of the rest (the chunk's hidden states, the features).
"""

from __future__ import annotations

import operator
from dataclasses import dataclass

import torch
import torch.fx as fx

from graphspec.runtime.node_program import LazyGraphModule


@dataclass(frozen=True)
class SplitProgram:
    """first(*args) -> (the first-token outputs..., crossing values...); rest(*args, *crossing) -> ()."""

    first: fx.GraphModule
    rest: fx.GraphModule
    crossing: int  # values the rest reads from the first part


def split_first_token(gm: fx.GraphModule, first_outputs: int) -> SplitProgram | None:
    """The two parts of `gm` (module docstring), or None when nothing is left for a second part.

    `first_outputs`: how many leading entries of gm's outputs the first token needs (the later ones
    are the states, returned as their placeholders once cache writes are in place)."""
    graph = gm.graph
    output = graph.find_nodes(op="output")[0]
    outputs = tuple(output.args[0])
    states = {node for node in graph.find_nodes(op="placeholder") if "gs_state" in node.meta}
    touched = _states_touched(graph, states)
    # Inputs, then constants: copied into both parts.
    shared = [*graph.find_nodes(op="placeholder"), *graph.find_nodes(op="get_attr")]
    is_shared = set(shared).__contains__
    first: set[fx.Node] = set()
    first_states: set[fx.Node] = set()
    pending = [value for value in outputs[:first_outputs] if isinstance(value, fx.Node)]
    while pending:
        while pending:
            node = pending.pop()
            if node in first or is_shared(node):
                continue
            first.add(node)
            first_states |= touched[node]
            pending += node.all_input_nodes
        # Nodes that touch a state the first part touches join it, with their inputs.
        pending = [node for node in touched if node not in first and touched[node] & first_states]
    # An element of a tuple the first part computes stays with it (only tensors cross).
    first |= {node for node in graph.nodes if node.target is operator.getitem and node.args[0] in first}
    rest = [node for node in graph.nodes if node not in first and not is_shared(node) and node is not output]
    if not rest:
        return None
    in_rest = set(rest).__contains__
    crossing = [node for node in graph.nodes if node in first and any(map(in_rest, node.users))]

    first_graph = fx.Graph()
    values = {node: first_graph.node_copy(node) for node in shared}
    for node in graph.nodes:
        if node in first:
            values[node] = first_graph.node_copy(node, values.__getitem__)
    first_graph.output(tuple(values[node] for node in outputs[:first_outputs] + tuple(crossing)))

    rest_graph = fx.Graph()
    values = {node: rest_graph.node_copy(node) for node in shared if node.op == "placeholder"}
    for index, node in enumerate(crossing):
        values[node] = rest_graph.placeholder(f"crossing_{index}")
        values[node].meta.update(gs_input=f"prefill.crossing.{index}", val=node.meta.get("val"))
    values |= {node: rest_graph.node_copy(node) for node in shared if node.op == "get_attr"}
    for node in rest:
        values[node] = rest_graph.node_copy(node, values.__getitem__)
    rest_graph.output(())
    # Lazy: on CUDA the parts run only to be warmed up and captured, through node_program.
    return SplitProgram(LazyGraphModule(gm, first_graph), LazyGraphModule(gm, rest_graph), len(crossing))


def _states_touched(graph: fx.Graph, states: set[fx.Node]) -> dict[fx.Node, set[fx.Node]]:
    """Per node, the state placeholders it reads or writes: those among its inputs, directly or through
    a view (an op whose schema says its result aliases an input, or an element of such a result)."""
    aliases: dict[fx.Node, set[fx.Node]] = {}  # node -> the states its value is a view of
    touched: dict[fx.Node, set[fx.Node]] = {}
    for node in graph.nodes:
        if node.op == "output":  # returns the states; reads nothing
            continue
        inputs = node.all_input_nodes
        touched[node] = set().union(*(aliases.get(source, set()) for source in inputs))
        if node in states:
            aliases[node] = {node}
        elif node.target is operator.getitem or _returns_alias(node):
            aliases[node] = touched[node]
    return touched


def _returns_alias(node: fx.Node) -> bool:
    """Whether the op's schema says a result is a view of (or the mutated) input: view, select, copy_, ..."""
    if not isinstance(node.target, torch._ops.OpOverload):
        return False
    return any(result.alias_info is not None for result in node.target._schema.returns)
