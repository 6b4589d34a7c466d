import pytest
import torch

from graphspec import trace
from graphspec.config import PassContext
from graphspec.passes import insert_verify
from tests import graphs


def ctx(mode: str = "greedy") -> PassContext:
    return PassContext(k=2, batch=3, mode=mode, sm=None)


def test_greedy_inserts_verify_and_commit():
    values = graphs.step_values()
    result = insert_verify.run(graphs.speculate_stub(values), ctx())
    assert result.changed
    assert result.stats == {"verify": "graphspec::verify_greedy", "k": 2}
    graphs.assert_graph_equal(result.gm, graphs.verified_stub_expected(values))
    assert tuple(trace.output_nodes(result.gm)) == (*trace.ROW_OUTPUTS, *graphs.STATES)


def test_sample_mode_uses_rejection_sampling_with_row_parameters():
    result = insert_verify.run(graphs.speculate_stub(graphs.step_values()), ctx("sample"))
    verify = [n for n in result.gm.graph.nodes if n.target is torch.ops.graphspec.verify_rejection.default]
    assert len(verify) == 1
    assert [a.name for a in verify[0].args] == [
        "target_logits",
        "draft_logits",
        "draft_tokens",
        "temperature",
        "top_k",
        "top_p",
        "seed",
        "step_counter",
    ]


def test_nodes_are_tagged():
    result = insert_verify.run(graphs.speculate_stub(graphs.step_values()), ctx())
    created = [n for n in result.gm.graph.nodes if n.op == "call_function"]
    assert created and all(n.meta.get("gs_pass") == "insert_verify" for n in created)


def test_nothing_to_do_on_a_verified_graph():
    gm = insert_verify.run(graphs.speculate_stub(graphs.step_values()), ctx()).gm
    again = insert_verify.run(gm, ctx())
    assert not again.changed and "already" in again.note


def test_stub_graph_computes_verify_and_commit():
    values = graphs.step_values()
    gm = insert_verify.run(graphs.speculate_stub(values), ctx()).gm
    args = [values[n] for n in graphs.stub_inputs()]
    tokens, accepted, next_len, _, counter, *_ = gm(*args)
    torch.testing.assert_close(tokens, values["target_logits"].argmax(-1))
    matches = (values["draft_tokens"] == tokens[:, :-1]).long().cumprod(1).sum(1)
    torch.testing.assert_close(accepted, matches)
    torch.testing.assert_close(next_len, values["committed_len"] + accepted + 1)
    torch.testing.assert_close(counter, values["step_counter"] + 1)


@pytest.mark.parametrize("mode", ["greedy", "sample"])
def test_traced_step_matches_eager_program(step_case, mode):
    step_case.assert_matches_eager(step_case.through(mode, "insert_verify"), mode)


def drafter_stub(values, commit: bool) -> torch.fx.GraphModule:
    """speculate_stub plus a drafter that gives draft_length and keeps a token history with a commit write."""
    gm = graphs.speculate_stub(values)
    graph = gm.graph
    output = graph.find_nodes(op="output")[0]
    with graph.inserting_before(next(n for n in graph.nodes if n.name == "target_logits")):
        length = graphs._placeholder(graph, "draft_length", torch.tensor([0, 1, 2]))
        history = graphs._placeholder(graph, "token_history", torch.zeros(4, 32, dtype=torch.int64))
    history.meta["gs_state"] = "length"
    if commit:
        history.meta["gs_commit"] = ("tokens", "committed_len")
    names = (*output.meta["gs_outputs"], "draft_length", "token_history")
    output.args = ((*output.args[0], length, history),)
    output.meta["gs_outputs"] = names
    gm.recompile()
    return gm


@pytest.mark.parametrize("mode", ["greedy", "sample"])
def test_draft_length_caps_acceptance(mode):
    values = graphs.step_values()
    result = insert_verify.run(drafter_stub(values, commit=False), ctx(mode))
    cap = torch.ops.aten.minimum.default if mode == "greedy" else torch.ops.graphspec.limit_accepted.default
    capped = [n for n in result.gm.graph.nodes if n.target is cap]
    assert len(capped) == 1 and "draft_length" in [getattr(a, "name", None) for a in capped[0].args]
    assert "draft_length" not in trace.output_nodes(result.gm)
    assert tuple(trace.output_nodes(result.gm)) == (*trace.ROW_OUTPUTS, *graphs.STATES, "token_history")


def test_commit_write_puts_the_tokens_into_the_state():
    values = graphs.step_values()
    gm = insert_verify.run(drafter_stub(values, commit=True), ctx()).gm
    writes = [n for n in gm.graph.nodes if n.target is torch.ops.graphspec.slot_update.default]
    assert len(writes) == 1 and writes[0].meta["gs_region"] == "accept"
    history = torch.zeros(4, 32, dtype=torch.int64)
    feed = {**values, "draft_length": torch.tensor([0, 1, 2]), "token_history": history}
    order = [n.meta["gs_input"] for n in gm.graph.find_nodes(op="placeholder")]
    outputs = dict(zip(trace.output_nodes(gm), gm(*(feed[name] for name in order)), strict=True))
    length = values["committed_len"]
    for row in range(3):
        start = int(length[row])
        assert torch.equal(outputs["token_history"][row, start : start + 3], outputs["tokens"][row])
    assert outputs["num_accepted"].le(torch.tensor([0, 1, 2])).all()
