"""graphspec/fake_meta.py: after a pass, an unchanged node keeps the fake value recorded at trace time or at
the last propagation; every node must still carry what a full FakeTensorProp computes."""

from __future__ import annotations

import torch
import torch.fx as fx
from torch._guards import detect_fake_mode
from torch.fx.experimental.proxy_tensor import make_fx

from graphspec import fake_meta, pipeline
from graphspec.passes import cleanup


def metadata(gm: fx.GraphModule) -> dict[str, object]:
    """Every node's meta["val"] as comparable metadata (fake_meta.fingerprint: shapes, strides, offsets,
    dtypes, devices)."""
    return {node.name: fake_meta.fingerprint(node.meta.get("val")) for node in gm.graph.nodes}


def full_propagation(gm: fx.GraphModule) -> dict[str, object]:
    """The metadata a plain FakeTensorProp (constants read as fake) over a copy of gm computes from its placeholders."""
    values = [node.meta["val"] for node in gm.graph.find_nodes(op="placeholder")]
    copy = fx.GraphModule(gm, gm.graph.__deepcopy__())
    for node in copy.graph.nodes:
        if node.op != "placeholder":
            node.meta.clear()
    fake_meta.ConstantsFakeTensorProp(copy, mode=detect_fake_mode(values)).propagate_dont_convert_inputs(*values)
    return metadata(copy)


def test_every_pass_of_a_real_step_leaves_the_metadata_a_full_propagation_gives(step_case):
    """The whole pipeline over a traced step (both modes: sampling keeps the draft logits, greedy's
    insert_verify makes them dead), compared after every pass that changed the graph; the first reuses
    the values recorded at trace time."""
    for mode in ("greedy", "sample"):
        gm, ctx = step_case.traced(mode), step_case.context(mode)
        for step in pipeline.PIPELINE:
            result = step.run(gm, ctx)
            gm = result.gm
            if result.changed:
                assert metadata(gm) == full_propagation(gm), f"{mode}: after {step.NAME}"


def test_an_unchanged_node_keeps_its_result_and_a_changed_input_reaches_its_users():
    def program(x, y):
        a = torch.ops.aten.add.Tensor(x, y)
        b = torch.ops.aten.mul.Tensor(a, 2)
        return torch.ops.aten.sum.dim_IntList(b, [1])

    gm = make_fx(program, tracing_mode="fake")(torch.randn(3, 4), torch.randn(3, 4))
    fake_meta.record(gm)  # as trace_step does: make_fx's values, recorded
    add, mul, total = (node for node in gm.graph.nodes if node.op == "call_function")
    kept = total.meta[fake_meta.RECORD][2]
    cleanup.propagate_meta(gm)
    assert total.meta[fake_meta.RECORD][2] is kept  # nothing changed: the same fake result

    # Equal metadata upstream (a new node in place of `add`): the users keep their results.
    with gm.graph.inserting_after(add):
        sub = gm.graph.call_function(torch.ops.aten.sub.Tensor, add.args)
    add.replace_all_uses_with(sub)
    gm.graph.erase_node(add)
    cleanup.tidy(gm)
    assert total.meta[fake_meta.RECORD][2] is kept and sub.meta["val"].shape == (3, 4)

    # Different metadata upstream (x's first row only, added to itself): every user downstream is
    # propagated again, down to the sum.
    with gm.graph.inserting_before(sub):
        row = gm.graph.call_function(torch.ops.aten.slice.Tensor, (sub.args[0], 0, 0, 1))
    sub.args = (row, row)
    cleanup.tidy(gm)
    assert tuple(sub.meta["val"].shape) == (1, 4) and tuple(mul.meta["val"].shape) == (1, 4)
    assert tuple(total.meta["val"].shape) == (1,) and total.meta[fake_meta.RECORD][2] is not kept
    assert metadata(gm) == full_propagation(gm)
