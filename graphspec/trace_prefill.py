"""Trace the prefill chunk program: one chunk of C prompt positions per row through the target and the
drafter's prefill hook, into ONE torch.fx graph per (batch bucket, chunk size) (chunk_sizes: a few per
bucket, so short prompts and tails do not pay for a whole chunk).

The program runs the target over the chunk (its KV written into the cache at each row's positions),
hands the chunk's final hidden states to the drafter's prefill_chunk (a draft model's forward over the
same tokens, n-gram history writes, MTP pairs), and returns the logits and final hidden state at one
position per row (`last_index`: where the row's prompt ends when it ends in this chunk). Sampling the
first token and the drafter's prefill_finish run outside it, once per prompt (runtime/prefill.py).

Graph inputs: every target parameter/buffer, every drafter parameter/buffer (the step's weights, in the
step's order, so one list binds both programs), PREFILL_INPUTS, then the states (the step's, by name).
Placeholders carry meta["gs_input"] and states meta["gs_state"]; the output node meta["gs_outputs"]:
PREFILL_OUTPUTS, then the states. State writes are functional until pipeline.PREFILL_PIPELINE runs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.fx as fx
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

from graphspec import fake_meta
from graphspec.drafters.base import Drafter, PrefillChunk
from graphspec.input_names import weight_input_names
from graphspec.models.decoder import DecoderLM
from graphspec.models.hybrid import HybridLM
from graphspec.models.target import target_forward, target_state_names
from graphspec.trace import TARGET_CACHE, model_inputs, name_graph, step_states

# Per-row inputs of one chunk; B rows (a bucket), C positions.
PREFILL_INPUTS = (
    "tokens",  # [B, C] int64: prompt tokens at positions start_pos .. start_pos + C - 1, 0 past the prompt
    "next_tokens",  # [B, C] int64: the token one position later (what MTP heads pair with each hidden state)
    "start_pos",  # [B] int64: the chunk's first position (a multiple of C)
    "slot_ids",  # [B] int64: cache slot; padding rows use the spare slot
    "last_index",  # [B] int64: the row's last prompt position in the chunk (C - 1 if the prompt goes on):
    # its logits and hidden state are returned, and positions after it do not advance "snapshot" states
)
PREFILL_OUTPUTS = (
    "last_logits",  # [B, V] the target's logits at last_index
    "last_hidden",  # [B, H] the target's final (normed) hidden state at last_index
)
# Only when the drafter declares target_features: [B, F] those features at last_index.
FEATURE_OUTPUT = "last_features"


@dataclass(frozen=True)
class PrefillSignature:
    """Names of the prefill program's inputs and outputs; the runtime binds tensors by these names."""

    target_params: tuple[str, ...]
    draft_params: tuple[str, ...]
    states: tuple[str, ...]

    @property
    def input_names(self) -> tuple[str, ...]:
        return weight_input_names(self.target_params, self.draft_params) + PREFILL_INPUTS + self.states


def chunk_size(bucket: int, max_seq_len: int, prefill_tokens: int) -> int:
    """Positions per row in one chunk of the `bucket` program: the largest divisor of max_seq_len that
    keeps bucket * C within the token budget (at least 1). A divisor, so every chunk of a prompt that
    fits the cache ends inside it: chunks start at multiples of C below the prompt length."""
    budget = max(1, min(max_seq_len, prefill_tokens // bucket))
    return next(c for c in range(budget, 0, -1) if max_seq_len % c == 0)


# Smaller chunk programs per bucket, so a short prompt (or a long one's tail) does not pay for a whole
# chunk: up to SIZES programs, each SIZE_STEP times smaller than the last, none under MIN_CHUNK positions.
SIZES = 3
SIZE_STEP = 8
MIN_CHUNK = 16
# On the CPU a chunk's padded positions cost their arithmetic (nothing is launch-bound), so the sizes step
# by 4: four 17-token prompts prefill 4 x 32 positions instead of 4 x 64 (docs/BENCHMARKS.md, CPU results).
CPU_SIZE_STEP = 4


def chunk_sizes(bucket: int, max_seq_len: int, prefill_tokens: int, device: str) -> tuple[int, ...]:
    """The bucket's chunk programs, largest first: chunk_size() and its 1/8 and 1/64 (on the CPU its 1/4
    and 1/16) where those are whole and at least MIN_CHUNK positions. Each divides the next larger, so
    all divide max_seq_len."""
    step = CPU_SIZE_STEP if str(device).startswith("cpu") else SIZE_STEP
    sizes = [chunk_size(bucket, max_seq_len, prefill_tokens)]
    while len(sizes) < SIZES and sizes[-1] % step == 0 and sizes[-1] // step >= MIN_CHUNK:
        sizes.append(sizes[-1] // step)
    return tuple(sizes)


def chunk_plan(positions: int, sizes: tuple[int, ...]) -> list[int]:
    """Chunk sizes, in order, that cover `positions` prompt positions from position 0: whole largest
    chunks, then the tail in chunks of the largest size that fits in it (the smallest when none does).
    Every chunk starts at a multiple of its own size (sizes divide each other), so it ends in the cache."""
    largest = max(sizes)
    plan = [largest] * (positions // largest)
    tail = positions - largest * len(plan)
    if tail:
        fitting = [size for size in sizes if size <= tail]
        size = max(fitting) if fitting else min(sizes)
        plan += [size] * -(-tail // size)
    return plan


def new_prefill_inputs(batch: int, chunk: int, device: str | torch.device) -> dict[str, torch.Tensor]:
    """PREFILL_INPUTS for `batch` rows of `chunk` positions, all zero (slot = row)."""
    long = dict(dtype=torch.int64, device=device)
    return {
        "tokens": torch.zeros((batch, chunk), **long),
        "next_tokens": torch.zeros((batch, chunk), **long),
        "start_pos": torch.zeros(batch, **long),
        "slot_ids": torch.arange(batch, **long),
        "last_index": torch.zeros(batch, **long),
    }


def prefill_chunk(
    target: DecoderLM | HybridLM,
    drafter: Drafter,
    target_params: dict[str, torch.Tensor],
    draft_params: dict[str, torch.Tensor],
    inputs: dict[str, torch.Tensor],
    state: dict[str, torch.Tensor],
) -> dict[str, torch.Tensor]:
    """One chunk: PREFILL_OUTPUTS, then every state (functional values)."""
    tokens, start_pos, slot_ids = inputs["tokens"], inputs["start_pos"], inputs["slot_ids"]
    capture = drafter.target_features
    output = "hidden_and_features" if capture else "hidden"
    target_names = target_state_names(target)
    # Positions past last_index are right padding: the KV written there is dead, and a "snapshot"
    # state (linear attention) must not advance over them, so it ends after position last_index.
    # last_hidden comes from the target's last layer run for each row's last position alone: the full
    # pass over every position (`hidden`) is dead code, dropped at trace, unless the drafter reads it.
    (hidden, last_hidden), target_state = target_forward(
        target,
        target_params,
        tokens,
        start_pos,
        slot_ids,
        {name: state[name] for name in target_names},
        output,
        capture,
        lengths=inputs["last_index"] + 1,
        last_index=inputs["last_index"],
    )  # [B, C, H] (and features [B, C, F]); [B, H]
    hidden, features = hidden if capture else (hidden, None)
    rows = torch.arange(tokens.shape[0], device=tokens.device)
    extra = {}
    if features is not None:
        extra["last_features"] = last_features(features, last_hidden, capture, rows, inputs["last_index"])  # [B, F]
    # Tied embeddings appear once among the parameters, under the embedding's name.
    head = target_params.get("lm_head.weight", target_params.get("model.embed_tokens.weight"))
    last_logits = F.linear(last_hidden, head)  # [B, V]
    drafter_state = {name: value for name, value in state.items() if name not in target_names}
    chunk = PrefillChunk(tokens, inputs["next_tokens"], start_pos, slot_ids, inputs["last_index"], hidden, features)
    drafter_state = drafter.prefill_chunk(draft_params, chunk, drafter_state)
    outputs = {"last_logits": last_logits, "last_hidden": last_hidden, **extra}
    return {**outputs, **target_state, **drafter_state}


def last_features(
    features: torch.Tensor,
    last_hidden: torch.Tensor,
    capture: tuple[str, ...],
    rows: torch.Tensor,
    last_index: torch.Tensor,
) -> torch.Tensor:
    """[B, F] the declared features at each row's last_index. A "final" point (each point is one hidden
    width) is last_hidden itself: gathered from the full pass it would make the first token wait for the
    target's last layer over every position."""
    at_last = features[rows, last_index]  # [B, F]
    if "final" not in capture:
        return at_last
    width = last_hidden.shape[-1]
    assert at_last.shape[-1] == len(capture) * width, (tuple(at_last.shape), capture)
    parts = [
        last_hidden if point == "final" else at_last[:, index * width : (index + 1) * width]
        for index, point in enumerate(capture)
    ]
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim=-1)


def trace_prefill(
    target: DecoderLM | HybridLM, drafter: Drafter, k: int, inputs: dict[str, torch.Tensor]
) -> tuple[fx.GraphModule, PrefillSignature]:
    """Trace the chunk program for the shapes of `inputs` (PREFILL_INPUTS and the states by name) into
    one GraphModule, with fake tensors (nothing is computed). Dead code (the draft model's unused
    outputs) is dropped while the graph is still functional."""
    target_params, draft_params = model_inputs(target), drafter.params()
    cache = inputs[TARGET_CACHE]
    slots, max_seq_len = cache.shape[2], cache.shape[4]
    states = step_states(target, drafter, slots, max_seq_len, k, cache.dtype)
    signature = PrefillSignature(tuple(target_params), tuple(draft_params), tuple(s.name for s in states))
    output_names: list[str] = []

    def program(*flat: torch.Tensor) -> tuple[torch.Tensor, ...]:
        n_target, n_draft, n_rows = len(target_params), len(draft_params), len(PREFILL_INPUTS)
        t_params = dict(zip(target_params, flat[:n_target], strict=True))
        d_params = dict(zip(draft_params, flat[n_target : n_target + n_draft], strict=True))
        rest = flat[n_target + n_draft :]
        rows = dict(zip(PREFILL_INPUTS, rest[:n_rows], strict=True))
        state = dict(zip(signature.states, rest[n_rows:], strict=True))
        outputs = prefill_chunk(target, drafter, t_params, d_params, rows, state)
        output_names[:] = outputs
        return tuple(outputs.values())

    names = PREFILL_INPUTS + signature.states
    flat_inputs = [*target_params.values(), *draft_params.values(), *(inputs[n] for n in names)]
    gm = make_fx(program, tracing_mode="fake")(*flat_inputs)
    gm.graph.eliminate_dead_code()  # functional graph: only unused values go (state updates are outputs)
    fake_meta.record(gm)
    name_graph(gm, signature.input_names)
    declared = {state.name: state for state in states}
    for node in gm.graph.find_nodes(op="placeholder"):
        if (state := declared.get(node.meta["gs_input"])) is not None:
            node.meta["gs_state"] = state.rollback
    output = gm.graph.find_nodes(op="output")[0]
    output.meta["gs_outputs"] = tuple(output_names)
    gm.recompile()
    return gm, signature


def example_prefill_inputs(
    target: DecoderLM | HybridLM,
    drafter: Drafter,
    k: int,
    batch: int,
    chunk: int,
    slots: int,
    max_seq_len: int,
    dtype: torch.dtype,
    device: str | torch.device,
) -> dict[str, torch.Tensor]:
    """Prefill inputs of the right shapes/dtypes (states uninitialized: only their shapes matter)."""
    inputs = new_prefill_inputs(batch, chunk, device)
    for state in step_states(target, drafter, slots, max_seq_len, k, dtype):
        inputs[state.name] = state.allocate(device, zeroed=False)
    return inputs
