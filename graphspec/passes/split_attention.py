"""Cut the step graph at attention nodes into eager-break regions for piecewise CUDA-graph capture.

Input:  a flat step graph (after defunctionalize_kv and lower_kernels).
Output: with ctx.capture == "piecewise", a GraphModule whose body calls submodules in order:
        capturable pieces (submod_0, submod_2, ...) alternating with one-node attention pieces that
        run eagerly between them. Otherwise unchanged: our attention ops are static-shape and
        host-sync free, so the whole step is captured as one graph (full-graph capture).

    rotary -> kv_write -> attention -> o_proj   becomes   submod_0(...) -> submod_1(attention) -> submod_2(...)
"""

from __future__ import annotations

import networkx as nx
import torch.fx as fx
from torch.fx.passes.split_module import split_module

from graphspec.config import PassContext, PassResult
from graphspec.op_nodes import is_attention

NAME = "split_attention"


def region_of_nodes(gm: fx.GraphModule) -> dict[fx.Node, int]:
    """Region index per node: attention nodes get their own region; runs between them share one."""
    regions, region = {}, 0
    for node in gm.graph.nodes:
        if node.op in ("placeholder", "output", "get_attr"):
            continue
        if is_attention(node):
            region += 1
            regions[node] = region
            region += 1
        else:
            regions[node] = region
    return regions


def region_graph(gm: fx.GraphModule, regions: dict[fx.Node, int]) -> nx.DiGraph:
    """Data dependencies between regions; split_module needs this to be a DAG."""
    dependencies = nx.DiGraph()
    dependencies.add_nodes_from(set(regions.values()))
    for node, region in regions.items():
        for source in node.all_input_nodes:
            if source in regions and regions[source] != region:
                dependencies.add_edge(regions[source], region)
    return dependencies


def run(gm: fx.GraphModule, ctx: PassContext) -> PassResult:
    attention_nodes = [node for node in gm.graph.nodes if is_attention(node)]
    if ctx.capture != "piecewise":
        return PassResult(
            gm, changed=False, note=f"capture={ctx.capture}: full-graph capture, attention stays inside the graph"
        )
    if not attention_nodes:
        return PassResult(gm, changed=False, note="no attention nodes to split at")
    regions = region_of_nodes(gm)
    dependencies = region_graph(gm, regions)
    if not nx.is_directed_acyclic_graph(dependencies):
        raise ValueError(f"attention regions form a cycle: {nx.find_cycle(dependencies)}")
    output_meta = gm.graph.find_nodes(op="output")[0].meta
    split = split_module(gm, gm, lambda node: regions[node], keep_original_order=True, keep_original_node_name=True)
    for node in split.graph.find_nodes(op="placeholder"):
        original = next(p for p in gm.graph.find_nodes(op="placeholder") if p.name == node.name)
        node.meta.update(original.meta)
    split.graph.find_nodes(op="output")[0].meta.update(output_meta)
    for node in split.graph.nodes:
        node.meta.setdefault("gs_pass", NAME) if node.op == "call_module" else None
    split.recompile()
    pieces = len(split.graph.find_nodes(op="call_module"))
    return PassResult(
        split,
        changed=True,
        stats={
            "pieces": pieces,
            "attention_pieces": len(attention_nodes),
            "captured_pieces": pieces - len(attention_nodes),
            "longest_chain": nx.dag_longest_path_length(dependencies) + 1,
        },
    )
