"""Turn functional state updates back into in-place writes so no step copies a whole cache or drafter state.

Input:  KV, drafter-state and linear-attention state writes as functional ops (graphspec::kv_update /
        slot_update / layer_state_update / select_update return an updated copy).
Output: each such op whose input version of the cache is not read afterwards becomes the in-place
        op (graphspec::kv_write; graphspec.library.IN_PLACE pairs them) on the graph input it derives
        from; readers of the new version read that input. Nothing after this pass may assume the graph
        is pure.

    c1 = kv_update(cache, ...); attention(q, c1, ...)   becomes   kv_write(cache, ...); attention(q, cache, ...)
"""

from __future__ import annotations

import torch.fx as fx

from graphspec.config import PassContext, PassResult
from graphspec.library import IN_PLACE  # functional update -> in-place write; the state is argument 0
from graphspec.passes.cleanup import region_for, tag, tidy

NAME = "defunctionalize_kv"


def count_cache_copies(gm: fx.GraphModule) -> int:
    """Whole-cache copies left in the graph: one per functional cache update."""
    return sum(1 for node in gm.graph.nodes if node.op == "call_function" and node.target in IN_PLACE)


def run(gm: fx.GraphModule, ctx: PassContext) -> PassResult:
    graph = gm.graph
    order = {node: index for index, node in enumerate(graph.nodes)}
    root: dict[fx.Node, fx.Node] = {}  # cache version -> the graph input it will alias
    rewritten, kept = 0, 0
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target not in IN_PLACE:
            continue
        in_place_op = IN_PLACE[node.target]
        base = node.args[0]
        # Writing in place is legal only if nothing reads the old version after this write.
        late_readers = [user for user in base.users if user is not node and order[user] > order[node]]
        origin = root.get(base, base)
        if late_readers or origin.op != "placeholder":
            kept += 1
            continue
        with graph.inserting_before(node):
            write = graph.call_function(in_place_op, (origin, *node.args[1:]), dict(node.kwargs))
        tag([write], NAME, region_for(node))  # the region of the update it replaces
        order[write] = order[node]
        root[node] = origin
        node.replace_all_uses_with(origin)
        graph.erase_node(node)
        rewritten += 1
    if not rewritten:
        return PassResult(gm, changed=False, stats={"kept_functional": kept}, note="no functional cache updates")
    tidy(gm, dead_code=False)
    return PassResult(
        gm,
        changed=True,
        stats={"in_place_writes": rewritten, "kept_functional": kept, "cache_copies_left": count_cache_copies(gm)},
    )
