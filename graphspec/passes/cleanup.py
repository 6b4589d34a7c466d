"""Shared tail of every pass: dead-code elimination where legal, lint, recompile, refresh meta["val"].

Never eliminate dead code after defunctionalize_kv: in-place KV writes return nothing and would look
dead to a naive DCE (FX keeps mutable-schema ops, but the rule keeps us independent of that detail).
"""

from __future__ import annotations

import torch.fx as fx
from torch._guards import detect_fake_mode
from torch.fx.passes.fake_tensor_prop import FakeTensorProp


def tidy(gm: fx.GraphModule, dead_code: bool = True) -> fx.GraphModule:
    if dead_code:
        gm.graph.eliminate_dead_code()
    gm.graph.lint()
    gm.recompile()
    propagate_meta(gm)
    return gm


def propagate_meta(gm: fx.GraphModule) -> None:
    """Re-run fake-tensor propagation so nodes a pass created carry meta["val"] like traced ones."""
    placeholders = gm.graph.find_nodes(op="placeholder")
    values = [node.meta.get("val") for node in placeholders]
    fake_mode = detect_fake_mode(values)
    if fake_mode is None or any(value is None for value in values):
        return  # hand-built graphs without fake values: nothing to propagate from
    FakeTensorProp(gm, mode=fake_mode).propagate_dont_convert_inputs(*values)


def tag(nodes: list[fx.Node], pass_name: str) -> None:
    for node in nodes:
        node.meta["gs_pass"] = pass_name
