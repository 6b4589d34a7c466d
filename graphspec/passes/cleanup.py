"""Shared tail of every pass: dead-code elimination where legal, lint, recompile, refresh meta["val"];
and the tags every created node carries (meta["gs_pass"], meta["gs_region"]).

Never eliminate dead code after defunctionalize_kv: in-place KV writes return nothing and would look
dead to a naive DCE (FX keeps mutable-schema ops, but the rule keeps us independent of that detail).

Regions (trace.REGIONS) of created nodes: a node inserted before an existing node takes that node's
region (so a replacement inherits the region of the node it replaces, and input sanitizers at the
top of the step count as draft); a node inserted before the output takes the region of the last op
before it. A pass that opens a region of its own (insert_verify: "accept") names it explicitly.
This keeps every region one contiguous run in graph order (checks.regions_run_in_order).
"""

from __future__ import annotations

from collections.abc import Iterator

import torch.fx as fx

from graphspec import fake_meta


def tidy(gm: fx.GraphModule, dead_code: bool = True) -> fx.GraphModule:
    if dead_code:
        gm.graph.eliminate_dead_code()
    gm.graph.lint()
    gm.recompile()
    propagate_meta(gm)
    return gm


def propagate_meta(gm: fx.GraphModule) -> None:
    """Re-run fake-tensor propagation so nodes a pass created carry meta["val"] like traced ones (what no
    change reached keeps its value: graphspec/fake_meta.py)."""
    fake_meta.propagate(gm)


def tag(nodes: list[fx.Node], pass_name: str, region: str | None = None) -> None:
    """meta["gs_pass"] = pass_name and, when given, meta["gs_region"] = region on every node."""
    for node in nodes:
        node.meta["gs_pass"] = pass_name
        if region is not None:
            node.meta["gs_region"] = region


def may_mutate(node: fx.Node) -> bool:
    """Whether a node may write some tensor in place: a mutable-schema op, or a module/method call
    whose effects a pass cannot see."""
    if node.op in ("call_module", "call_method"):
        return True
    schema = getattr(node.target, "_schema", None)
    return node.op == "call_function" and schema is not None and schema.is_mutable


def nodes_between(first: fx.Node, last: fx.Node) -> Iterator[fx.Node]:
    """The nodes strictly after `first` and before `last` in graph order (last must follow first):
    what a fusion that moves work from one to the other must check."""
    node = first.next
    while node is not last:
        yield node
        node = node.next


def region_for(position: fx.Node) -> str | None:
    """The region of nodes inserted right before `position`: its own, else that of the first later
    node with one, else (before the output) that of the last earlier one; None in untagged graphs."""
    node = position
    while node.op != "root":  # the graph's sentinel: both ends of the node list
        if "gs_region" in node.meta:
            return node.meta["gs_region"]
        node = node.next
    node = position.prev
    while node.op != "root":
        if "gs_region" in node.meta:
            return node.meta["gs_region"]
        node = node.prev
    return None
