"""NodeProgram: an fx graph run node by node, without its generated code, as fx's code runs it."""

from __future__ import annotations

import operator
import weakref

import pytest
import torch
import torch.fx as fx

import graphspec
from graphspec.artifact import decode_graph_module, encode_graph_module
from graphspec.runtime.buffers import StepBuffers
from graphspec.runtime.node_program import LazyGraphModule, NodeProgram, runner
from graphspec.trace import verified_outputs


class Scale(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 3


def hand_built() -> fx.GraphModule:
    """Every opcode: placeholders, get_attr, call_function (nested list and kwargs), call_method with and
    without arguments, call_module, getitem of a tuple result, and a tuple output."""
    root = torch.nn.Module()
    root.scale = Scale()
    root.offset = torch.tensor([0.5, -1.0])
    graph = fx.Graph()
    x, y = graph.placeholder("x"), graph.placeholder("y")
    offset = graph.get_attr("offset")
    added = graph.call_function(torch.add, (x, offset), {"alpha": 2.0})
    both = graph.call_function(torch.cat, ([added, y],), {"dim": 0})
    pair = graph.call_function(torch.split, (both, 2))
    first = graph.call_function(operator.getitem, (pair, 0))
    scaled = graph.call_module("scale", (first,))
    negated = graph.call_method("neg", (scaled,))
    clamped = graph.call_method("clamp", (negated,), {"min": -4.0})
    graph.output((clamped, [both, first]))
    return fx.GraphModule(root, graph)


def test_a_node_program_returns_what_the_generated_code_returns() -> None:
    gm = hand_built()
    x, y = torch.tensor([1.0, 2.0]), torch.tensor([3.0, 4.0])
    got, want = NodeProgram(gm)(x, y), gm(x, y)
    assert torch.equal(got[0], want[0])
    assert isinstance(got[1], list) and all(torch.equal(a, b) for a, b in zip(got[1], want[1], strict=True))
    with pytest.raises(TypeError, match="takes 2 inputs"):
        NodeProgram(gm)(x)


def test_each_value_is_dropped_after_its_last_use_and_unread_values_at_once() -> None:
    """Memory: a capture's pool reuses the blocks of dead activations only if nothing holds them."""
    alive: dict[str, weakref.ref] = {}

    def make(name: str, x: torch.Tensor) -> torch.Tensor:
        value = x + 1
        alive[name] = weakref.ref(value)
        return value

    def expect_dead(names: tuple[str, ...], x: torch.Tensor) -> torch.Tensor:
        for name in names:
            assert alive[name]() is None, f"{name} is still referenced after its last use"
        return x

    graph = fx.Graph()
    x = graph.placeholder("x")
    a = graph.call_function(make, ("a", x))
    graph.call_function(make, ("unread", x))  # nothing reads it
    b = graph.call_function(make, ("b", a))  # a's last use
    c = graph.call_function(expect_dead, (("a", "unread"), b))
    graph.output(c)
    gm = fx.GraphModule(torch.nn.Module(), graph)
    out = NodeProgram(gm)(torch.zeros(3))
    assert torch.equal(out, torch.full((3,), 2.0))
    with pytest.raises(AssertionError, match="a is still referenced"):
        NodeProgram(_keeping(gm))(torch.zeros(3))


def _keeping(gm: fx.GraphModule) -> fx.GraphModule:
    """gm with a's value read again by the output: alive at the check, which must then fail."""
    graph = gm.graph
    output = next(iter(graph.find_nodes(op="output")))
    a = next(node for node in graph.nodes if node.args[:1] == ("a",))
    output.args = ((output.args[0], a),)
    return fx.GraphModule(gm, graph)


def test_runner_walks_the_nodes_of_a_lazy_module_and_leaves_it_without_code() -> None:
    gm = hand_built()
    lazy = LazyGraphModule(gm, gm.graph)
    assert isinstance(runner(lazy), NodeProgram)
    assert lazy._needs_recompile()  # building and running the program generated nothing
    assert runner(gm) is gm  # a module with its code runs as itself


@pytest.mark.parametrize("capture", ["auto", "piecewise"])
def test_a_step_graph_run_node_by_node_equals_the_step_bitwise(checkpoint_factory, capture: str) -> None:
    """A real compiled step (fp32, CPU), loaded as an artifact loads it (lazily): the node program and the
    generated code give bit-identical outputs and caches from the same rows and cache contents. Piecewise,
    the program walks the top-level graph and calls its pieces (call_module)."""
    compiled = graphspec.compile(
        checkpoint_factory("llama", seed=5),
        checkpoint_factory("llama", seed=6, num_hidden_layers=1, hidden_size=32, intermediate_size=64),
        k=3, batch_sizes=(4,), dtype="float32", device="cpu", max_seq_len=64, capture=capture,
    )  # fmt: skip
    gm = compiled.graphs[("greedy", 4)]
    assert any(node.op == "call_module" for node in gm.graph.nodes) == (capture == "piecewise")
    modules, constants = encode_graph_module(gm, "step")
    loaded = decode_graph_module(modules, constants, "step", lazy=True)
    generator = torch.Generator().manual_seed(0)
    results = []
    for run in (NodeProgram(loaded), loaded):
        generator.manual_seed(0)
        buffers = StepBuffers.allocate(4, "cpu")
        buffers.load_rows(
            {
                "last_tokens": torch.randint(0, 128, (4, 2), generator=generator),
                "committed_len": torch.randint(2, 40, (4,), generator=generator),
                "slot_ids": torch.randperm(4, generator=generator),
            }
        )
        state = {
            name: torch.randn(tensor.shape, generator=generator).to(tensor.dtype)
            for name, tensor in compiled.new_state().items()
        }
        names = [node.meta["gs_input"] for node in loaded.graph.find_nodes(op="placeholder")]
        params = compiled.weights()
        rest = [buffers.inputs[n] if n in buffers.inputs else state[n] for n in names[len(params) :]]
        outputs = run(*params, *rest)
        results.append(([o.clone() for o in outputs], state))
    (got, got_state), (want, want_state) = results
    assert len(got) == len(verified_outputs(loaded))
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
    assert all(torch.equal(got_state[name], want_state[name]) for name in want_state)
