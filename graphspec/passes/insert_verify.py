"""Add the verify/accept and commit nodes after the target's verify logits.

Input:  the traced speculation program; outputs named trace.SPECULATE_OUTPUTS.
Output: outputs named trace.VERIFIED_OUTPUTS: emitted tokens, accepted counts and the next step's
        committed length / last tokens / step counter, computed by graphspec::verify_greedy
        (ctx.mode == "greedy") or graphspec::verify_rejection ("sample"), then graphspec::commit;
        every node it adds is in the "accept" region (meta["gs_region"]).
"""

from __future__ import annotations

import operator

import torch
import torch.fx as fx

from graphspec import trace
from graphspec.config import PassContext, PassResult
from graphspec.passes.cleanup import tag, tidy

NAME = "insert_verify"

# Verify op per sampling mode, with the graph values it reads (outputs of the traced program first,
# then step inputs). A new sampling rule is a new entry here.
VERIFY_RULES = {
    "greedy": (torch.ops.graphspec.verify_greedy.default, ("target_logits", "draft_tokens")),
    "sample": (
        torch.ops.graphspec.verify_rejection.default,
        ("target_logits", "draft_logits", "draft_tokens", "temperature", "top_k", "top_p", "seed", "step_counter"),
    ),
}


def run(gm: fx.GraphModule, ctx: PassContext) -> PassResult:
    outputs = trace.output_nodes(gm)
    if "target_logits" not in outputs:
        return PassResult(gm, changed=False, note="graph already ends in verify/commit")
    values = {**trace.placeholders_by_input(gm), **outputs}
    verify_op, reads = VERIFY_RULES[ctx.mode]
    graph = gm.graph
    with graph.inserting_before(graph.find_nodes(op="output")[0]):
        verify = graph.call_function(verify_op, tuple(values[name] for name in reads))
        tokens = graph.call_function(operator.getitem, (verify, 0))  # [B, K+1]
        accepted = graph.call_function(operator.getitem, (verify, 1))  # [B]
        commit = graph.call_function(
            torch.ops.graphspec.commit.default, (values["committed_len"], values["last_tokens"], tokens, accepted)
        )
        next_len = graph.call_function(operator.getitem, (commit, 0))
        next_last = graph.call_function(operator.getitem, (commit, 1))
        next_counter = graph.call_function(torch.ops.aten.add.Tensor, (values["step_counter"], 1))
    # These nodes are the step's "accept" region: after the target logits, up to the outputs.
    tag([verify, tokens, accepted, commit, next_len, next_last, next_counter], NAME, region="accept")
    trace.set_outputs(
        gm,
        {
            "tokens": tokens,
            "num_accepted": accepted,
            "next_committed_len": next_len,
            "next_last_tokens": next_last,
            "next_step_counter": next_counter,
            "target_cache": outputs["target_cache"],
            "draft_cache": outputs["draft_cache"],
        },
    )
    tidy(gm)  # greedy verify does not read the draft logits: their stack becomes dead
    return PassResult(gm, changed=True, stats={"verify": verify_op.name(), "k": ctx.k})
