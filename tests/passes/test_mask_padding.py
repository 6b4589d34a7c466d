import pytest
import torch

from graphspec import trace
from graphspec.config import PassContext
from graphspec.passes import insert_verify, mask_padding
from tests import graphs


def verified_stub():
    values = graphs.step_values()
    gm = insert_verify.run(graphs.speculate_stub(values), PassContext(k=2, batch=3, mode="greedy", sm=None)).gm
    return gm, values


def ctx() -> PassContext:
    return PassContext(k=2, batch=3, mode="greedy", sm=None, scratch_slot=3)


def test_every_row_input_is_sanitized_and_outputs_masked():
    gm, _ = verified_stub()
    result = mask_padding.run(gm, ctx())
    assert result.changed
    assert result.stats == {"sanitized_inputs": 8, "masked_outputs": 5, "spare_slot": 3}
    inputs = trace.placeholders_by_input(result.gm)
    for name in mask_padding.SAFE_INPUTS:
        users = list(inputs[name].users)
        # Raw inputs feed only the sanitizing where() (+ the view of row_valid) and output fallbacks.
        assert all(u.target in (torch.ops.aten.where.ScalarOther, torch.ops.aten.where.self) for u in users), name


def test_invalid_rows_get_neutral_outputs_and_keep_state():
    gm, values = verified_stub()
    gm = mask_padding.run(gm, ctx()).gm
    values["committed_len"][2] = 10_000  # garbage on the padding row
    args = [values[n] for n in graphs.stub_inputs()]
    outputs = dict(zip((*trace.ROW_OUTPUTS, *graphs.STATES), gm(*args), strict=True))
    assert outputs["num_accepted"][2] == 0 and (outputs["tokens"][2] == -1).all()
    assert outputs["next_committed_len"][2] == 10_000  # a stopped/padding row keeps its state
    assert torch.equal(outputs["next_last_tokens"][2], values["last_tokens"][2])
    assert outputs["next_committed_len"][0] == values["committed_len"][0] + outputs["num_accepted"][0] + 1


def test_nothing_to_do_without_row_valid():
    gm = graphs.kv_chain()
    result = mask_padding.run(gm, ctx())
    assert not result.changed and "row_valid" in result.note


def test_nothing_to_do_when_already_masked():
    gm, _ = verified_stub()
    gm = mask_padding.run(gm, ctx()).gm
    assert not mask_padding.run(gm, ctx()).changed


@pytest.mark.parametrize("mode", ["greedy", "sample"])
def test_real_rows_match_eager_program(step_case, mode):
    step_case.assert_matches_eager(step_case.through(mode, "mask_padding"), mode)


def test_padding_row_with_garbage_writes_only_the_spare_slot(step_case):
    gm = step_case.through("greedy", "mask_padding")
    step_case.inputs["slot_ids"][2] = 0  # garbage: points at a real row's slot
    step_case.inputs["committed_len"][2] = 10**6  # garbage: far beyond the cache
    try:
        outputs, _ = step_case.run_graph(gm)
    finally:
        step_case.inputs["slot_ids"][2] = 2
        step_case.inputs["committed_len"][2] = 9
    expected = step_case.eager("greedy")
    for name in ("target_cache", "draft_cache"):
        torch.testing.assert_close(outputs[name][:, :, :2], expected[name][:, :, :2], rtol=0, atol=0)
        torch.testing.assert_close(outputs[name][:, :, 2], step_case.inputs[name][:, :, 2], rtol=0, atol=0)
