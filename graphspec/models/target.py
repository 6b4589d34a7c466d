"""A target model as the step sees it: its declared states (graphspec.state.State, each with its rollback
rule) and one forward over them by name. The models package is the one place that tells the families
apart; trace, trace_prefill and the runtime call these two functions for any target."""

from __future__ import annotations

import torch
from torch import Tensor

from graphspec.models.decoder import DecoderLM, kv_cache_shape
from graphspec.models.hybrid import HybridLM
from graphspec.state import TARGET_CACHE, State


def target_states(
    target: DecoderLM | HybridLM, slots: int, max_seq_len: int, k: int, dtype: torch.dtype
) -> tuple[State, ...]:
    """Every state the target keeps across steps, its KV cache (TARGET_CACHE) first."""
    if isinstance(target, HybridLM):
        states = target.states(slots, max_seq_len, k, dtype)
    else:
        spec = target.spec
        shape = kv_cache_shape(spec, spec.num_layers, slots, max_seq_len)
        states = (State(TARGET_CACHE, shape, dtype, rollback="length"),)
    assert states[0].name == TARGET_CACHE, states
    return states


def target_state_names(target: DecoderLM | HybridLM) -> tuple[str, ...]:
    """The names of target_states, in order."""
    return tuple(state.name for state in target_states(target, 1, 1, 0, torch.float32))


def target_forward(
    target: DecoderLM | HybridLM,
    params: dict[str, Tensor] | None,
    tokens: Tensor,
    start_pos: Tensor,
    slot_ids: Tensor,
    states: dict[str, Tensor],
    output: str,
    capture: tuple[str, ...] = (),
    lengths: Tensor | None = None,
    snapshots: bool = False,
    in_place: bool = False,
    last_index: Tensor | None = None,
) -> tuple[object, dict[str, Tensor]]:
    """The target's forward over `states` (target_states' names -> tensors): returns its output and the
    states after it. params: bound with torch.func.functional_call when tracing (None: the module's own).
    lengths [B]: real positions per row (None: all), so right padding never advances a "snapshot" state.
    snapshots=True (the verify forward): "snapshot" states are not advanced; the returned dict also holds
    each one's per-position snapshots under state.snapshot_name(name) ([L, B, T, ...]).
    last_index [B] (output "hidden" or "hidden_and_features"): the output is (out, last_hidden [B, H]),
    the final hidden state at t = last_index[b]; an attention decoder computes it past the last layer's
    K/V for that position alone (DecoderLM.forward), so a first token that needs nothing else skips the
    last layer's work for every other position."""
    if isinstance(target, HybridLM):
        args = (tokens, start_pos, slot_ids, states, output)
        kwargs = {"capture": capture, "lengths": lengths, "snapshots": snapshots, "in_place": in_place}
        if params is None:
            out, states = target(*args, **kwargs)
        else:
            out, states = torch.func.functional_call(target, params, args, kwargs)
        if last_index is None:
            return out, states
        hidden = out[0] if capture else out
        rows = torch.arange(tokens.shape[0], device=tokens.device)
        return (out, hidden[rows, last_index]), states
    # An attention-only decoder: its one state is the KV cache (positions past a row's length are dead).
    args = (tokens, start_pos, slot_ids, states[TARGET_CACHE], output)
    kwargs = {"capture": capture, **({} if last_index is None else {"last_index": last_index})}
    if params is None:
        out, cache = target(*args, **kwargs, in_place=in_place)
    else:
        out, cache = torch.func.functional_call(target, params, args, kwargs)
    return out, {TARGET_CACHE: cache}
