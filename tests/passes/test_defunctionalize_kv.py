import pytest
import torch

from graphspec.config import PassContext
from graphspec.passes import defunctionalize_kv
from tests import graphs

CTX = PassContext(k=2, batch=2, mode="greedy", sm=None)


def test_functional_updates_become_in_place_writes():
    result = defunctionalize_kv.run(graphs.kv_chain(layers=2), CTX)
    assert result.stats == {"in_place_writes": 2, "kept_functional": 0, "cache_copies_left": 0}
    graphs.assert_graph_equal(result.gm, graphs.kv_chain(layers=2, functional=False))


def test_in_place_graph_computes_the_same_and_mutates_the_input():
    inputs = graphs.kv_chain_inputs()
    expected_out, expected_cache = graphs.kv_chain()(*[x.clone() for x in inputs])
    gm = defunctionalize_kv.run(graphs.kv_chain(), CTX).gm
    mutated = [x.clone() for x in inputs]
    out, cache = gm(*mutated)
    torch.testing.assert_close(out, expected_out, rtol=0, atol=0)
    assert cache is mutated[1]  # the returned cache is the input buffer itself
    torch.testing.assert_close(mutated[1], expected_cache, rtol=0, atol=0)


def test_update_whose_old_version_is_read_later_stays_functional():
    gm = graphs.kv_chain(layers=1)
    graph = gm.graph
    cache = next(n for n in graph.nodes if n.name == "cache")
    output = graph.find_nodes(op="output")[0]
    # Read the pre-update cache after the update: writing in place would change what it sees.
    with graph.inserting_before(output):
        late = graph.call_function(
            graphs.ATTENTION, (output.args[0][0].args[0], cache, 0, *output.args[0][0].args[2:4], 0.5)
        )
    output.args = ((output.args[0][0], output.args[0][1], late),)
    gm.recompile()
    result = defunctionalize_kv.run(gm, CTX)
    assert not result.changed and result.stats["kept_functional"] == 1
    assert defunctionalize_kv.count_cache_copies(result.gm) == 1


def test_nothing_to_do_without_functional_updates():
    result = defunctionalize_kv.run(graphs.kv_chain(functional=False), CTX)
    assert not result.changed


@pytest.mark.parametrize("mode", ["greedy", "sample"])
def test_real_step_has_no_cache_copies_and_matches_eager(step_case, mode):
    before = step_case.through(mode, "mask_padding")
    # target: 1 forward x 2 layers; draft: K=2 forwards x 2 layers
    assert defunctionalize_kv.count_cache_copies(before) == 1 * 2 + 2 * 2
    gm = step_case.through(mode, "defunctionalize_kv")
    assert defunctionalize_kv.count_cache_copies(gm) == 0
    writes = [n for n in gm.graph.nodes if n.target is torch.ops.graphspec.kv_write.default]
    assert len(writes) == 6
    step_case.assert_matches_eager(gm, mode)


def test_drafter_state_updates_become_in_place_writes():
    graph = torch.fx.Graph()
    state, slots, start, values = (graph.placeholder(n) for n in ("state", "slot_ids", "start_pos", "values"))
    update = torch.ops.graphspec.slot_update.default
    first = graph.call_function(update, (state, slots, start, values))
    read = graph.call_function(torch.ops.aten.index_select.default, (first, 0, slots))
    second = graph.call_function(update, (first, slots, start, values))
    graph.output((read, second))
    gm = torch.fx.GraphModule(torch.nn.Module(), graph)
    result = defunctionalize_kv.run(gm, PassContext(k=1, batch=1, mode="greedy", sm=None))
    assert result.stats["in_place_writes"] == 2 and result.stats["cache_copies_left"] == 0
    targets = [n.target for n in result.gm.graph.nodes if n.op == "call_function"]
    write = torch.ops.graphspec.slot_write.default
    assert targets == [write, torch.ops.aten.index_select.default, write]
    history = torch.zeros(2, 8, dtype=torch.int64)
    out = result.gm(history, torch.tensor([1]), torch.tensor([3]), torch.tensor([[5, 6]]))
    assert out[1] is history and history[1, 3:5].tolist() == [5, 6] and out[0].tolist() == [history[1].tolist()]
