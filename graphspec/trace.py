"""Trace target + drafter into ONE torch.fx graph per speculation step (chain drafting, K proposals).

The traced program ends at the target's verify logits: the drafter proposes K tokens, one target
forward runs over [bonus, d1..dK] and the program returns the logits. Verify/accept and commit are
not written here; the insert_verify pass adds them, so the sampling rule is a compiler decision and
shows in the dumps.

Graph inputs (placeholders, in this order): every target parameter/buffer, every drafter
parameter/buffer, ROW_INPUTS, then the state tensors (the target's KV cache, then the drafter's
declared states). Parameters are inputs, not constants, so one graph serves any weights of the same
shapes and the artifact can store graphs and weights separately. StepSignature is the one place that
names them; state placeholders carry meta["gs_state"] (their rollback rule), so passes and checks
read the step's state from the graph itself.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.fx as fx
import torch.fx.traceback as fx_traceback
from torch.fx.experimental.proxy_tensor import make_fx

from graphspec import fake_meta, ops
from graphspec.drafters.base import Drafter, StepView
from graphspec.input_names import weight_input_names
from graphspec.models.decoder import DecoderLM
from graphspec.models.hybrid import HybridLM
from graphspec.models.target import target_forward, target_state_names, target_states
from graphspec.state import TARGET_CACHE, State, snapshot_name

# Per-row step inputs, all [B] unless noted. Validity is carried here, never in Python control flow.
ROW_INPUTS = (
    "last_tokens",  # [B, 2] int64: the last two committed tokens
    "committed_len",  # int64: committed tokens so far (prompt + emitted); >= 2
    "slot_ids",  # int64: the cache slot of each row
    "row_valid",  # bool: False for padding rows and rows that already stopped
    "temperature",  # float32: 0 = greedy
    "top_k",  # int64: 0 = off
    "top_p",  # float32: 1 = off
    "seed",  # int64: per-row seed of the counter-based random stream
    "step_counter",  # int64: steps this row has taken; keys the random stream
)
# TARGET_CACHE (graphspec.state): the target's KV cache, first of the step's states; a hybrid target's
# linear-attention states follow it (models/target.py target_states).
# What the traced program returns besides the states (draft_length only when the drafter gives one,
# target_features only when it reads the verify's states, then snapshot_name(state) for every "snapshot"
# state of the target); insert_verify replaces these with ROW_OUTPUTS.
SPECULATE_OUTPUTS = ("target_logits", "draft_logits", "draft_tokens", "draft_length", "target_features")
# The compiled step's per-row outputs; the states follow them. next_<name> feeds back into input <name>.
ROW_OUTPUTS = (
    "tokens",  # [B, K+1]: the first num_accepted + 1 are emitted
    "num_accepted",  # [B]
    "next_committed_len",
    "next_last_tokens",
    "next_step_counter",
)
FEEDBACK = {
    "next_committed_len": "committed_len",
    "next_last_tokens": "last_tokens",
    "next_step_counter": "step_counter",
}
# The step's regions in the order they run; every op node carries one as meta["gs_region"], so a
# benchmark can time each from inside the step (runtime/region_timing.py). draft: the drafter's
# proposals; verify: the target forward over [bonus, d1..dK] with its lm_head; accept: verify/
# accept, commit and the next step's feedback (insert_verify adds them; passes tag what they insert,
# see passes/cleanup.py region_for).
REGIONS = ("draft", "verify", "accept")
# Meta keys torch adds to traced nodes under preserve_node_meta; dropped so annotation changes nothing
# but meta["gs_region"] (dumps print meta["custom"] as a comment on every node).
_ANNOTATION_META = ("custom", "seq_nr", "original_aten")


@dataclass(frozen=True)
class StepSignature:
    """Names of the graph's inputs and outputs; the runtime binds tensors by these names."""

    target_params: tuple[str, ...]
    draft_params: tuple[str, ...]
    states: tuple[str, ...]  # the target's declared states (KV cache first), then the drafter's

    @property
    def step_inputs(self) -> tuple[str, ...]:
        return ROW_INPUTS + self.states

    @property
    def input_names(self) -> tuple[str, ...]:
        return weight_input_names(self.target_params, self.draft_params) + self.step_inputs


def model_inputs(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Parameters and buffers the graph takes as inputs (tied weights appear once)."""
    named = dict(model.named_parameters())
    named.update(model.named_buffers())
    return named


def step_states(
    target: DecoderLM | HybridLM, drafter: Drafter, slots: int, max_seq_len: int, k: int, dtype: torch.dtype
) -> tuple[State, ...]:
    """Every state tensor of the step, the target's first: what the runtime allocates and the graph
    takes and returns."""
    drafted = drafter.states(slots, max_seq_len, k, dtype)
    advancing = [state.name for state in drafted if state.rollback == "snapshot"]
    if advancing:  # drafts are rejected after the fact: a drafter's own state must roll back for free
        raise ValueError(f"drafter {drafter.kind} declares snapshot-rule states {advancing}: drafters must not")
    states = (*target_states(target, slots, max_seq_len, k, dtype), *drafted)
    names = [state.name for state in states]
    assert len(set(names)) == len(names) and not set(names) & set(ROW_INPUTS), names
    return states


def speculate(
    target: DecoderLM | HybridLM,
    drafter: Drafter,
    k: int,
    greedy_draft: bool,
    target_params: dict[str, torch.Tensor],
    draft_params: dict[str, torch.Tensor],
    inputs: dict[str, torch.Tensor],
    state: dict[str, torch.Tensor],
) -> dict[str, torch.Tensor]:
    """The speculation step up to the target logits (see DESIGN.md, "The speculation step"): named
    outputs SPECULATE_OUTPUTS (draft_length only if the drafter gives one), then every state.
    Everything it traces lands in the "draft" or "verify" region (see REGIONS)."""
    temperature, top_k, top_p = inputs["temperature"], inputs["top_k"], inputs["top_p"]
    seed, step_counter = inputs["seed"], inputs["step_counter"]

    def pick(logits: torch.Tensor, index: int) -> torch.Tensor:
        if greedy_draft:
            return ops.argmax(logits)
        return ops.sample(logits, temperature, top_k, top_p, seed, step_counter, ops.DRAFT_LANE + index)

    target_names = target_state_names(target)
    drafter_state = {name: value for name, value in state.items() if name not in target_names}
    with region("draft"):
        proposal = drafter.propose(draft_params, StepView(inputs, k, pick, greedy=greedy_draft), drafter_state)
        draft_tokens = proposal.tokens  # [B, K]
        draft_logits = proposal.logits
        if draft_logits is None:  # deterministic drafts: q is one-hot (only rejection sampling reads it)
            shape = (*draft_tokens.shape, target.spec.vocab_size)
            draft_logits = torch.full(shape, float("-inf"), device=draft_tokens.device).scatter(
                -1, draft_tokens[..., None], 0.0
            )  # [B, K, V]
    with region("verify"):
        # One target forward over [bonus, d1..dK] at positions L-1 .. L-1+K.
        verify_tokens = torch.cat((inputs["last_tokens"][:, 1:], draft_tokens), dim=1)  # [B, K+1]
        committed_len, slot_ids = inputs["committed_len"], inputs["slot_ids"]
        capture = drafter.target_features
        output = "logits_and_features" if capture else "logits"
        # "snapshot" states come back unchanged, with the state after each of the K+1 positions beside them.
        verified, target_state = target_forward(
            target,
            target_params,
            verify_tokens,
            committed_len - 1,
            slot_ids,
            {name: state[name] for name in target_names},
            output,
            capture,
            snapshots=True,
        )
        target_logits, target_features = verified if capture else (verified, None)  # [B, K+1, V]
    outputs = {"target_logits": target_logits, "draft_logits": draft_logits, "draft_tokens": draft_tokens}
    if proposal.length is not None:
        outputs["draft_length"] = proposal.length
    if target_features is not None:
        outputs["target_features"] = target_features  # [B, K+1, F]
    snapshots = {name: value for name, value in target_state.items() if name not in target_names}
    assert set(snapshots) <= {snapshot_name(name) for name in target_names}, snapshots
    return {**outputs, **snapshots, **{name: target_state[name] for name in target_names}, **proposal.state}


def new_row_inputs(batch: int, device: str | torch.device) -> dict[str, torch.Tensor]:
    """ROW_INPUTS for `batch` rows: every row valid, greedy, at committed length 2 in slot = row."""
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
    }


def example_step_inputs(
    target: DecoderLM | HybridLM,
    drafter: Drafter,
    k: int,
    batch: int,
    slots: int,
    max_seq_len: int,
    dtype: torch.dtype,
    device: str | torch.device,
) -> dict[str, torch.Tensor]:
    """Step inputs of the right shapes/dtypes (values are only used by eager checks)."""
    inputs = new_row_inputs(batch, device)
    for state in step_states(target, drafter, slots, max_seq_len, k, dtype):
        inputs[state.name] = state.allocate(device, zeroed=False)
    return inputs


def trace_step(
    target: DecoderLM | HybridLM, drafter: Drafter, k: int, mode: str, step_inputs: dict[str, torch.Tensor]
) -> tuple[fx.GraphModule, StepSignature]:
    """Trace the step for the shapes of `step_inputs` (static B, K, cache) into one GraphModule.

    Tracing uses fake tensors, so nothing is computed and weights may be on any device. Placeholders
    are renamed after what they hold and tagged: meta["gs_input"] = input name, and state inputs
    meta["gs_state"] = their rollback rule (and meta["gs_commit"] = their CommitWrite's (value, at)).
    """
    target_params, draft_params = model_inputs(target), drafter.params()
    slots, max_seq_len = step_inputs[TARGET_CACHE].shape[2], step_inputs[TARGET_CACHE].shape[4]
    states = step_states(target, drafter, slots, max_seq_len, k, step_inputs[TARGET_CACHE].dtype)
    signature = StepSignature(tuple(target_params), tuple(draft_params), tuple(s.name for s in states))
    greedy_draft = mode == "greedy"
    output_names: list[str] = []

    def program(*flat: torch.Tensor) -> tuple[torch.Tensor, ...]:
        n_target, n_draft, n_rows = len(target_params), len(draft_params), len(ROW_INPUTS)
        t_params = dict(zip(target_params, flat[:n_target], strict=True))
        d_params = dict(zip(draft_params, flat[n_target : n_target + n_draft], strict=True))
        rest = flat[n_target + n_draft :]
        inputs = dict(zip(ROW_INPUTS, rest[:n_rows], strict=True))
        state = dict(zip(signature.states, rest[n_rows:], strict=True))
        outputs = speculate(target, drafter, k, greedy_draft, t_params, d_params, inputs, state)
        output_names[:] = outputs
        return tuple(outputs.values())

    flat_inputs = [*target_params.values(), *draft_params.values(), *(step_inputs[n] for n in signature.step_inputs)]
    with fx_traceback.preserve_node_meta():  # makes make_fx copy region() annotations onto nodes
        gm = make_fx(program, tracing_mode="fake")(*flat_inputs)
    fake_meta.record(gm)
    take_regions(gm)
    name_graph(gm, signature.input_names)
    declared = {state.name: state for state in states}
    for node in gm.graph.find_nodes(op="placeholder"):
        if (state := declared.get(node.meta["gs_input"])) is not None:
            node.meta["gs_state"] = state.rollback
            if state.commit is not None:  # what insert_verify writes into it after accept, and where
                node.meta["gs_commit"] = (state.commit.value, state.commit.at)
    output = gm.graph.find_nodes(op="output")[0]
    output.meta["gs_outputs"] = tuple(output_names)
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


def state_inputs(gm: fx.GraphModule) -> dict[str, fx.Node]:
    """name -> placeholder of every state the step keeps (tagged meta["gs_state"] by trace_step)."""
    return {
        node.meta["gs_input"]: node
        for node in gm.graph.find_nodes(op="placeholder")
        if "gs_state" in node.meta and "gs_input" in node.meta
    }


def verified_outputs(gm: fx.GraphModule) -> tuple[str, ...]:
    """The outputs a compiled step of this graph returns: ROW_OUTPUTS, then its states."""
    return ROW_OUTPUTS + tuple(state_inputs(gm))
