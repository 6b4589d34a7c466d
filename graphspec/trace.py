"""Trace target + draft into ONE torch.fx graph per speculation step (chain drafting, K proposals).

The traced program ends at the target's verify logits: it drafts K tokens, runs one target forward
over [bonus, d1..dK] and returns the logits. Verify/accept and commit are not written here; the
insert_verify pass adds them, so the sampling rule is a compiler decision and shows in the dumps.

Graph inputs (placeholders, in this order): every target parameter/buffer, every draft
parameter/buffer, then STEP_INPUTS. Parameters are inputs, not constants, so one graph serves any
weights of the same shapes and the artifact can store graphs and weights separately.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.fx as fx
import torch.fx.traceback as fx_traceback
from torch.fx.experimental.proxy_tensor import make_fx

from graphspec import ops
from graphspec.models.decoder import DecoderLM

# Per-row step inputs, all [B] unless noted. Validity is carried here, never in Python control flow.
STEP_INPUTS = (
    "last_tokens",  # [B, 2] int64: the last two committed tokens
    "committed_len",  # int64: committed tokens so far (prompt + emitted); >= 2
    "slot_ids",  # int64: the cache slot of each row
    "row_valid",  # bool: False for padding rows and rows that already stopped
    "temperature",  # float32: 0 = greedy
    "top_k",  # int64: 0 = off
    "top_p",  # float32: 1 = off
    "seed",  # int64: per-row seed of the counter-based random stream
    "step_counter",  # int64: steps this row has taken; keys the random stream
    "target_cache",  # [L, 2, SLOTS, Hkv, S, D]
    "draft_cache",
)
# What the traced program returns; insert_verify replaces it with VERIFIED_OUTPUTS.
SPECULATE_OUTPUTS = ("target_logits", "draft_logits", "draft_tokens", "target_cache", "draft_cache")
# The compiled step's outputs. next_<name> feeds back into input <name> for the following step.
VERIFIED_OUTPUTS = (
    "tokens",  # [B, K+1]: the first num_accepted + 1 are emitted
    "num_accepted",  # [B]
    "next_committed_len",
    "next_last_tokens",
    "next_step_counter",
    "target_cache",
    "draft_cache",
)
FEEDBACK = {
    "next_committed_len": "committed_len",
    "next_last_tokens": "last_tokens",
    "next_step_counter": "step_counter",
}
# The step's regions in the order they run; every op node carries one as meta["gs_region"], so a
# benchmark can time each from inside the step (runtime/region_timing.py). draft: the draft forwards
# and proposals; verify: the target forward over [bonus, d1..dK] with its lm_head; accept: verify/
# accept, commit and the next step's feedback (insert_verify adds them; passes tag what they insert,
# see passes/cleanup.py region_for).
REGIONS = ("draft", "verify", "accept")
# Meta keys torch adds to traced nodes under preserve_node_meta; dropped so annotation changes nothing
# but meta["gs_region"] (dumps print meta["custom"] as a comment on every node).
_ANNOTATION_META = ("custom", "seq_nr", "original_aten")


@dataclass(frozen=True)
class StepSignature:
    """Names of the graph's inputs in placeholder order; the runtime binds tensors by these names."""

    target_params: tuple[str, ...]
    draft_params: tuple[str, ...]

    @property
    def input_names(self) -> tuple[str, ...]:
        return (
            tuple(f"target.{n}" for n in self.target_params)
            + tuple(f"draft.{n}" for n in self.draft_params)
            + STEP_INPUTS
        )


def model_inputs(model: DecoderLM) -> dict[str, torch.Tensor]:
    """Parameters and buffers the graph takes as inputs (tied weights appear once)."""
    named = dict(model.named_parameters())
    named.update(model.named_buffers())
    return named


def speculate(
    target: DecoderLM,
    draft: DecoderLM,
    k: int,
    greedy_draft: bool,
    target_params: dict[str, torch.Tensor],
    draft_params: dict[str, torch.Tensor],
    last_tokens: torch.Tensor,
    committed_len: torch.Tensor,
    slot_ids: torch.Tensor,
    row_valid: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    seed: torch.Tensor,
    step_counter: torch.Tensor,
    target_cache: torch.Tensor,
    draft_cache: torch.Tensor,
) -> tuple[torch.Tensor, ...]:
    """The speculation step up to the target logits (see DESIGN.md, "The speculation step").
    Everything it traces lands in the "draft" or "verify" region (see REGIONS)."""

    def call_draft(tokens: torch.Tensor, start: torch.Tensor, cache: torch.Tensor, first: int):
        rows = slice(first, first + tokens.shape[1])  # position L-2+first onwards
        rope = (draft_cos[:, rows], draft_sin[:, rows])
        return torch.func.functional_call(
            draft, draft_params, (tokens, start, slot_ids, cache, "last_logits"), {"rope": rope}
        )

    def propose(logits: torch.Tensor, index: int) -> torch.Tensor:
        if greedy_draft:
            return ops.argmax(logits)
        return ops.sample(logits, temperature, top_k, top_p, seed, step_counter, ops.DRAFT_LANE + index)

    with region("draft"):
        # 0. The draft's rotary tables for every position it sees this step (L-2 .. L-2+K), computed
        #    once; each forward takes its rows (the values it would compute for itself).
        draft_positions = (committed_len - 2)[:, None] + torch.arange(k + 1, device=committed_len.device)
        draft_cos, draft_sin = draft.rope(draft_positions, draft_params["inv_freq"])  # [B, K+1, D]
        # 1. Catch-up + first proposal: the last two committed tokens at positions L-2, L-1 cover the
        #    case where the previous step accepted every draft (the draft never saw d_K); otherwise the
        #    first of the two rewrites an identical KV entry.
        logits, draft_cache = call_draft(last_tokens, committed_len - 2, draft_cache, 0)  # [B, V]
        proposals, proposal_logits = [propose(logits, 0)], [logits]
        # 2. Proposals 2..K, unrolled: d_i sits at position L - 1 + i.
        for index in range(1, k):
            logits, draft_cache = call_draft(proposals[-1][:, None], committed_len - 1 + index, draft_cache, index + 1)
            proposals.append(propose(logits, index))
            proposal_logits.append(logits)
        draft_tokens = torch.stack(proposals, dim=1)  # [B, K]
        # Stacked here, not at the return, so the draft region stays one run in graph order.
        draft_logits = torch.stack(proposal_logits, dim=1)  # [B, K, V]
    with region("verify"):
        # 3. One target forward over [bonus, d1..dK] at positions L-1 .. L-1+K.
        verify_tokens = torch.cat((last_tokens[:, 1:], draft_tokens), dim=1)  # [B, K+1]
        target_logits, target_cache = torch.func.functional_call(
            target, target_params, (verify_tokens, committed_len - 1, slot_ids, target_cache, "logits")
        )  # [B, K+1, V]
    return target_logits, draft_logits, draft_tokens, target_cache, draft_cache


def example_step_inputs(
    target: DecoderLM, draft: DecoderLM, batch: int, slots: int, max_seq_len: int, dtype: torch.dtype, device
) -> dict[str, torch.Tensor]:
    """Step inputs of the right shapes/dtypes (values are only used by eager checks)."""
    long = dict(dtype=torch.int64, device=device)
    return {
        "last_tokens": torch.zeros((batch, 2), **long),
        "committed_len": torch.full((batch,), 2, **long),
        "slot_ids": torch.arange(batch, **long),
        "row_valid": torch.ones(batch, dtype=torch.bool, device=device),
        "temperature": torch.zeros(batch, dtype=torch.float32, device=device),
        "top_k": torch.zeros(batch, **long),
        "top_p": torch.ones(batch, dtype=torch.float32, device=device),
        "seed": torch.zeros(batch, **long),
        "step_counter": torch.zeros(batch, **long),
        "target_cache": target.new_cache(slots, max_seq_len, dtype, device, zeroed=False),
        "draft_cache": draft.new_cache(slots, max_seq_len, dtype, device, zeroed=False),
    }


def trace_step(
    target: DecoderLM, draft: DecoderLM, k: int, mode: str, step_inputs: dict[str, torch.Tensor]
) -> tuple[fx.GraphModule, StepSignature]:
    """Trace the step for the shapes of `step_inputs` (static B, K, cache) into one GraphModule.

    Tracing uses fake tensors, so nothing is computed and weights may be on any device. Placeholders
    are renamed after what they hold and tagged: meta["gs_input"] = input name.
    """
    target_params, draft_params = model_inputs(target), model_inputs(draft)
    signature = StepSignature(tuple(target_params), tuple(draft_params))
    greedy_draft = mode == "greedy"

    def program(*flat: torch.Tensor) -> tuple[torch.Tensor, ...]:
        n_target, n_draft = len(target_params), len(draft_params)
        t_params = dict(zip(target_params, flat[:n_target], strict=True))
        d_params = dict(zip(draft_params, flat[n_target : n_target + n_draft], strict=True))
        return speculate(target, draft, k, greedy_draft, t_params, d_params, *flat[n_target + n_draft :])

    flat_inputs = [*target_params.values(), *draft_params.values(), *(step_inputs[n] for n in STEP_INPUTS)]
    with fx_traceback.preserve_node_meta():  # makes make_fx copy region() annotations onto nodes
        gm = make_fx(program, tracing_mode="fake")(*flat_inputs)
    take_regions(gm)
    name_graph(gm, signature.input_names)
    output = gm.graph.find_nodes(op="output")[0]
    output.meta["gs_outputs"] = SPECULATE_OUTPUTS
    gm.recompile()
    return gm, signature


@contextmanager
def region(name: str) -> Iterator[None]:
    """Nodes traced inside carry meta["gs_region"] = name (once take_regions has run). Uses torch's
    fx_traceback.annotate (torch>=2.10; marked not backward compatible, so
    tests/runtime/test_region_timing.py checks every traced op gets its region), which make_fx
    records under preserve_node_meta; outside a trace it does nothing."""
    assert name in REGIONS, name
    with fx_traceback.annotate({"gs_region": name}):
        yield


def take_regions(gm: fx.GraphModule) -> None:
    """Move region() annotations to meta["gs_region"] and drop the other keys annotation added."""
    for node in gm.graph.nodes:
        custom = node.meta.get("custom") or {}
        if "gs_region" in custom:
            node.meta["gs_region"] = custom["gs_region"]
        for key in _ANNOTATION_META:
            node.meta.pop(key, None)


def name_graph(gm: fx.GraphModule, input_names: tuple[str, ...]) -> None:
    """Give placeholders readable names (target_model_layers_0_..., committed_len, ...)."""
    placeholders = gm.graph.find_nodes(op="placeholder")
    assert len(placeholders) == len(input_names), (len(placeholders), len(input_names))
    for node, name in zip(placeholders, input_names, strict=True):
        node.meta["gs_input"] = name
        node.name = node.target = name.replace(".", "_")


def placeholders_by_input(gm: fx.GraphModule) -> dict[str, fx.Node]:
    return {node.meta["gs_input"]: node for node in gm.graph.find_nodes(op="placeholder") if "gs_input" in node.meta}


def output_nodes(gm: fx.GraphModule) -> dict[str, fx.Node]:
    """name -> the node returned under that name (the output node carries meta["gs_outputs"])."""
    output = gm.graph.find_nodes(op="output")[0]
    return dict(zip(output.meta["gs_outputs"], output.args[0], strict=True))


def set_outputs(gm: fx.GraphModule, outputs: dict[str, fx.Node]) -> None:
    output = gm.graph.find_nodes(op="output")[0]
    output.args = (tuple(outputs.values()),)
    output.meta["gs_outputs"] = tuple(outputs)
