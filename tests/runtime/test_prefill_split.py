"""split_first_token on hand-built graphs: what goes to the first part (the first token's outputs, their
inputs, every node touching a state they touch), what crosses, and that running the parts one after the
other computes what the whole graph computes. The compiled programs of every drafter are split and run
against the reference prefill in tests/runtime/test_prefill.py."""

from __future__ import annotations

import operator

import torch
import torch.fx as fx
from torch.fx.experimental.proxy_tensor import make_fx

from graphspec.runtime.prefill_split import split_first_token


def traced(program, *args: torch.Tensor, states: tuple[int, ...]) -> fx.GraphModule:
    """make_fx of `program` (in-place writes kept), its placeholders at `states` tagged as states."""
    gm = make_fx(program)(*args)
    placeholders = gm.graph.find_nodes(op="placeholder")
    for index in states:
        placeholders[index].meta["gs_state"] = "test"
    return gm


def target_then_drafter(x, w, target_state, draft_state):
    hidden = x @ w
    target_state[0].copy_(hidden)  # through a view of the state, as a cache write
    logits = target_state[0].sum(-1)  # read back, as attention reads the cache
    draft_state[1].copy_(hidden * 2)
    return logits, target_state, draft_state


def example() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return [torch.randn(3, 4, generator=g), torch.randn(4, 4, generator=g), torch.zeros(2, 3, 4), torch.zeros(2, 3, 4)]


def copies_into(gm: fx.GraphModule) -> set[str]:
    """Names of the placeholders whose views the graph's copy_ nodes write."""
    written = set()
    for node in gm.graph.find_nodes(op="call_function", target=torch.ops.aten.copy_.default):
        view = node.args[0]
        written.add(view.args[0].name)
    return written


def run_split(gm: fx.GraphModule, first_outputs: int, args: list[torch.Tensor]) -> list[torch.Tensor]:
    split = split_first_token(gm, first_outputs)
    outputs = split.first(*args)
    assert split.rest(*args, *outputs[first_outputs:]) == ()
    return list(outputs[:first_outputs])


def test_drafter_work_goes_to_the_rest_and_the_hidden_states_cross():
    gm = traced(target_then_drafter, *example(), states=(2, 3))
    split = split_first_token(gm, 1)
    assert copies_into(split.first) == {"target_state_1"}
    assert copies_into(split.rest) == {"draft_state_1"}
    assert split.crossing == 1  # the hidden states the drafter's write reads
    first_ops = {n.target for n in split.first.graph.nodes if n.op == "call_function"}
    assert torch.ops.aten.mul.Tensor not in first_ops and torch.ops.aten.sum.dim_IntList in first_ops


def test_running_the_parts_in_turn_computes_what_the_graph_computes():
    gm = traced(target_then_drafter, *example(), states=(2, 3))
    whole, parts = example(), example()
    expected = gm(*whole)
    got = run_split(gm, 1, parts)
    torch.testing.assert_close(got[0], expected[0], rtol=0, atol=0)
    for state in (2, 3):
        torch.testing.assert_close(parts[state], whole[state], rtol=0, atol=0)
    assert parts[3].abs().sum() > 0  # the drafter's write happened


def test_a_write_to_a_state_the_first_part_touches_joins_it():
    """The drafter's part writing the target's state would race the first part's reads of it if the two
    ran apart: it joins the first part, with what it reads."""

    def program(x, w, target_state, draft_state):
        hidden = x @ w
        target_state[0].copy_(hidden)
        logits = target_state[0].sum(-1)
        target_state[1].copy_(torch.tanh(hidden))  # not needed by logits, but the same state
        draft_state[1].copy_(hidden * 2)
        return logits, target_state, draft_state

    gm = traced(program, *example(), states=(2, 3))
    split = split_first_token(gm, 1)
    assert [n.target for n in split.first.graph.nodes].count(torch.ops.aten.copy_.default) == 2
    assert torch.ops.aten.tanh.default in {n.target for n in split.first.graph.nodes}
    assert copies_into(split.rest) == {"draft_state_1"}
    whole, parts = example(), example()
    gm(*whole)
    run_split(gm, 1, parts)
    for state in (2, 3):
        torch.testing.assert_close(parts[state], whole[state], rtol=0, atol=0)


def test_a_tuple_element_stays_with_its_tuple():
    def program(x, w, target_state, draft_state):
        a, b = torch.split(x @ w, 2, dim=-1)
        target_state[0, :, :2].copy_(a)
        draft_state[0, :, :2].copy_(b)
        return target_state[0, :, :2].sum(-1), target_state, draft_state

    gm = traced(program, *example(), states=(2, 3))
    split = split_first_token(gm, 1)
    rest_getitems = split.rest.graph.find_nodes(op="call_function", target=operator.getitem)
    assert rest_getitems == [] and split.crossing == 1  # element b crosses, not the tuple
    whole, parts = example(), example()
    gm(*whole)
    run_split(gm, 1, parts)
    torch.testing.assert_close(parts[3], whole[3], rtol=0, atol=0)


def test_a_write_the_first_token_does_not_need_goes_to_the_rest():
    """Nothing the first token needs reads that state: the write may run after it."""

    def program(x, w, target_state, draft_state):
        hidden = x @ w
        target_state[0].copy_(hidden)
        return hidden.sum(-1), target_state, draft_state

    split = split_first_token(traced(program, *example(), states=(2, 3)), 1)
    assert copies_into(split.first) == set() and copies_into(split.rest) == {"target_state_1"}


def test_nothing_left_for_a_second_part():
    def program(x, w, target_state):
        target_state[0].copy_(x @ w)
        return target_state[0].sum(-1), target_state

    args = example()[:3]
    assert split_first_token(traced(program, *args, states=(2,)), 1) is None
