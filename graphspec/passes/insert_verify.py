"""Add the verify/accept and commit nodes after the target's verify logits.

Input:  the traced speculation program; outputs named trace.SPECULATE_OUTPUTS, then the states.
Output: outputs named trace.ROW_OUTPUTS, then the states: emitted tokens, accepted counts and the next
        step's committed length / last tokens / step counter, computed by graphspec::verify_greedy
        (ctx.mode == "greedy") or graphspec::verify_rejection ("sample"), capped at the drafter's
        draft_length when it gives one, then graphspec::commit; states that declare a commit write
        (meta["gs_commit"]) get it here, and every "snapshot" state (meta["gs_state"]) takes each row's
        snapshot at its accepted count (graphspec::select_update over the traced program's
        snapshot_name(state) output, which is then dropped); every node it adds is in the "accept" region.
"""

from __future__ import annotations

import operator

import torch
import torch.fx as fx

from graphspec import trace
from graphspec.config import PassContext, PassResult
from graphspec.passes.cleanup import tag, tidy
from graphspec.state import snapshot_name

NAME = "insert_verify"

SAMPLING = ("temperature", "top_k", "top_p", "seed", "step_counter")
# Verify op per sampling mode, with the graph values it reads (outputs of the traced program first,
# then step inputs). A new sampling rule is a new entry here.
VERIFY_RULES = {
    "greedy": (torch.ops.graphspec.verify_greedy.default, ("target_logits", "draft_tokens")),
    "sample": (
        torch.ops.graphspec.verify_rejection.default,
        ("target_logits", "draft_logits", "draft_tokens", *SAMPLING),
    ),
}


def run(gm: fx.GraphModule, ctx: PassContext) -> PassResult:
    outputs = trace.output_nodes(gm)
    if "target_logits" not in outputs:
        return PassResult(gm, changed=False, note="graph already ends in verify/commit")
    values = {**trace.placeholders_by_input(gm), **outputs}
    verify_op, reads = VERIFY_RULES[ctx.mode]
    graph = gm.graph
    created: list[fx.Node] = []

    def call(target: object, *args: object) -> fx.Node:
        created.append(graph.call_function(target, args))
        return created[-1]

    with graph.inserting_before(graph.find_nodes(op="output")[0]):
        verify = call(verify_op, *(values[name] for name in reads))
        tokens, accepted = call(operator.getitem, verify, 0), call(operator.getitem, verify, 1)  # [B, K+1], [B]
        if "draft_length" in outputs:  # filler past a row's real drafts is never accepted
            if ctx.mode == "greedy":  # tokens are the target's argmax at every position already
                accepted = call(torch.ops.aten.minimum.default, accepted, values["draft_length"])
            else:
                limited = call(
                    torch.ops.graphspec.limit_accepted.default,
                    tokens,
                    accepted,
                    values["draft_length"],
                    values["target_logits"],
                    *(values[name] for name in SAMPLING),
                )
                tokens, accepted = call(operator.getitem, limited, 0), call(operator.getitem, limited, 1)
        commit = call(
            torch.ops.graphspec.commit.default, values["committed_len"], values["last_tokens"], tokens, accepted
        )
        next_len, next_last = call(operator.getitem, commit, 0), call(operator.getitem, commit, 1)
        next_counter = call(torch.ops.aten.add.Tensor, values["step_counter"], 1)
        # What a state's commit write (drafters.base.CommitWrite) can name, and where it can land.
        committed = {
            "tokens": tokens,
            "target_features": outputs.get("target_features"),
            "committed_len": call(torch.ops.aten.unsqueeze.default, values["committed_len"], 1),
        }
        starts = {
            "committed_len": values["committed_len"],
            "start": call(torch.ops.aten.zeros_like.default, values["committed_len"]),
        }
        states = {}
        for name, node in trace.state_inputs(gm).items():
            states[name] = outputs[name]
            if "gs_commit" in node.meta:  # e.g. the n-gram history gets the step's tokens at L .. L+K
                value, at = node.meta["gs_commit"]
                states[name] = call(
                    torch.ops.graphspec.slot_update.default,
                    outputs[name],
                    values["slot_ids"],
                    starts[at],
                    committed[value],
                )
            if node.meta["gs_state"] == "snapshot":  # the state after bonus + the accepted drafts: index n
                states[name] = call(
                    torch.ops.graphspec.select_update.default,
                    outputs[name],
                    values["slot_ids"],
                    outputs[snapshot_name(name)],
                    accepted,
                )
    # These nodes are the step's "accept" region: after the target logits, up to the outputs.
    tag(created, NAME, region="accept")
    row_outputs = (tokens, accepted, next_len, next_last, next_counter)
    trace.set_outputs(gm, {**dict(zip(trace.ROW_OUTPUTS, row_outputs, strict=True)), **states})
    tidy(gm)  # greedy verify does not read the draft logits: their stack becomes dead
    return PassResult(gm, changed=True, stats={"verify": verify_op.name(), "k": ctx.k})
