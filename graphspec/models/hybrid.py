"""Traceable hybrid LM: Gated DeltaNet (linear attention) layers interleaved with gated full-attention
layers (Qwen3-Next dense, Qwen3.5 dense).

Like models/decoder.py: static shapes, state owned by the caller and threaded through forward
functionally, one graphspec:: op per hot or stateful operation. The state is three named tensors (the
target's declared states, see `states`): the KV cache of the full-attention layers, and per Gated
DeltaNet layer a conv state (the last W-1 conv inputs) and a recurrent state (fp32). Names mirror
transformers' modules; projections of one input are fused (FusedLinear) as in the decoder.

forward(snapshots=True) is the verify forward: it does not advance the conv and recurrent states but
returns, for each, the state after every position ([Lg, B, T, ...] under snapshot_name(state)); the
accept region keeps each row's snapshot at its accepted count (the "snapshot" rollback rule). Otherwise
`lengths` [B] says how many positions of each row are real: the states end after position lengths - 1,
so right padding never advances them (prefill); a row starting at position 0 starts from zero state,
whatever its slot held.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from graphspec import ops
from graphspec.models.decoder import MLP, Body, Conv1d, FusedLinear, Linear, RMSNorm, capture_points, rope_tables
from graphspec.models.spec import ModelSpec
from graphspec.state import TARGET_CACHE, State, snapshot_name

KV_CACHE = TARGET_CACHE  # [La, 2, SLOTS, Hkv, S, D]: the full-attention layers' KV
CONV_STATE = "target_conv_state"  # [Lg, SLOTS, C, W-1] model dtype
RECURRENT_STATE = "target_recurrent_state"  # [Lg, SLOTS, Hv, Dk, Dv] fp32
RECURRENT_DTYPE = torch.float32  # as real configs' mamba_ssm_dtype: bf16 recurrent state drifts


class GatedDeltaNet(nn.Module):
    def __init__(self, spec: ModelSpec, index: int) -> None:
        super().__init__()
        linear = spec.linear
        assert linear is not None
        self.index = index  # among the linear layers: the state's layer index
        self.linear = linear
        self.eps = spec.rms_norm_eps
        key_dim, value_dim = linear.num_k_heads * linear.k_head_dim, linear.num_v_heads * linear.v_head_dim
        heads = linear.num_v_heads
        if linear.layout == "qwen3_next":
            parts = {"in_proj_qkvz": 2 * key_dim + 2 * value_dim, "in_proj_ba": 2 * heads}
        else:
            parts = {
                "in_proj_qkv": 2 * key_dim + value_dim,
                "in_proj_z": value_dim,
                "in_proj_b": heads,
                "in_proj_a": heads,
            }
        self.in_proj = FusedLinear(spec.hidden_size, parts, bias=False)
        self.conv1d = Conv1d(linear.conv_dim, linear.conv_dim, linear.conv_kernel, groups=linear.conv_dim, bias=False)
        self.dt_bias = nn.Parameter(torch.ones(heads))
        self.A_log = nn.Parameter(torch.zeros(heads))
        self.norm = RMSNorm(linear.v_head_dim, spec.rms_norm_eps)  # plain weight: the gated norm is not (1 + w)
        self.out_proj = Linear(value_dim, spec.hidden_size, bias=False)

    def projections(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """(conv input [B, T, C] = q, k, v of every head, z [B, T, Hv, Dv], b [B, T, Hv], a [B, T, Hv])."""
        batch, t, _ = x.shape
        lin = self.linear
        projected = self.in_proj(x)
        if lin.layout == "qwen3_5":
            mixed, z, b, a = projected.split(list(self.in_proj.parts.values()), dim=-1)
            return mixed, z.reshape(batch, t, lin.num_v_heads, lin.v_head_dim), b, a
        # Qwen3-Next: per key head [q, k, v of its value heads, z of its value heads], then [b, a] likewise.
        group = lin.num_v_heads // lin.num_k_heads
        qkvz, ba = projected.split(list(self.in_proj.parts.values()), dim=-1)
        qkvz = qkvz.view(batch, t, lin.num_k_heads, 2 * lin.k_head_dim + 2 * group * lin.v_head_dim)
        q, k, v, z = qkvz.split([lin.k_head_dim, lin.k_head_dim, group * lin.v_head_dim, group * lin.v_head_dim], dim=3)
        b, a = ba.view(batch, t, lin.num_k_heads, 2 * group).split([group, group], dim=3)
        mixed = torch.cat([part.reshape(batch, t, -1) for part in (q, k, v)], dim=-1)
        z = z.reshape(batch, t, lin.num_v_heads, lin.v_head_dim)
        return mixed, z, b.reshape(batch, t, lin.num_v_heads), a.reshape(batch, t, lin.num_v_heads)

    def forward(
        self,
        x: Tensor,
        start_pos: Tensor,
        slot_ids: Tensor,
        state: dict[str, Tensor],
        lengths: Tensor | None,
        in_place: bool,
    ) -> tuple[Tensor, dict[str, Tensor]]:
        """state: CONV_STATE and RECURRENT_STATE; with lengths None (verify) it also collects the
        snapshots of both under snapshot_name(name) as lists, one entry per linear layer."""
        batch, t, _ = x.shape
        lin = self.linear
        mixed, z, b, a = self.projections(x)
        weight = self.conv1d.weight.squeeze(1)  # [C, W]
        conv, recurrent = state[CONV_STATE], state[RECURRENT_STATE]
        if lengths is None:
            mixed, conv_after = ops.causal_conv1d_snapshots(mixed, conv, self.index, slot_ids, weight)
        else:
            mixed, conv_after = ops.causal_conv1d(mixed, conv, self.index, slot_ids, weight, start_pos, lengths)
        key_dim = lin.num_k_heads * lin.k_head_dim
        q, k, v = mixed.split([key_dim, key_dim, lin.num_v_heads * lin.v_head_dim], dim=-1)
        q = q.reshape(batch, t, lin.num_k_heads, lin.k_head_dim)
        k = k.reshape(batch, t, lin.num_k_heads, lin.k_head_dim)
        v = v.reshape(batch, t, lin.num_v_heads, lin.v_head_dim)
        g, beta = ops.gdn_gates(a, b, self.A_log, self.dt_bias)  # log decay g in fp32, as in transformers
        if lengths is None:
            out, recurrent_after = ops.gated_delta_rule_snapshots(q, k, v, g, beta, recurrent, self.index, slot_ids)
            state[snapshot_name(CONV_STATE)].append(conv_after)
            state[snapshot_name(RECURRENT_STATE)].append(recurrent_after)
        else:
            out, recurrent_after = ops.gated_delta_rule(
                q, k, v, g, beta, recurrent, self.index, slot_ids, start_pos, lengths
            )
            for name, value in ((CONV_STATE, conv_after), (RECURRENT_STATE, recurrent_after)):
                if in_place:
                    ops.layer_state_write(state[name], self.index, slot_ids, value)
                else:
                    state[name] = ops.layer_state_update(state[name], self.index, slot_ids, value)
        out = ops.gated_rms_norm(out, z, self.norm.weight, self.eps)  # [B, T, Hv, Dv]
        return self.out_proj(out.reshape(batch, t, -1)), state


class GatedAttention(nn.Module):
    """Full attention with an output gate from q_proj (per head [query, gate]), zero-centred q/k norms
    and rotary over the first R dims of each head."""

    def __init__(self, spec: ModelSpec, index: int) -> None:
        super().__init__()
        self.index = index  # among the attention layers: the KV cache's layer index
        self.num_heads, self.num_kv_heads, self.head_dim = spec.num_heads, spec.num_kv_heads, spec.head_dim
        self.scale = spec.head_dim**-0.5
        hidden, q_dim, kv_dim = spec.hidden_size, spec.num_heads * spec.head_dim, spec.num_kv_heads * spec.head_dim
        self.qkv_proj = FusedLinear(hidden, {"q_proj": 2 * q_dim, "k_proj": kv_dim, "v_proj": kv_dim}, spec.qkv_bias)
        self.o_proj = Linear(q_dim, hidden, bias=spec.o_bias)
        self.q_norm = RMSNorm(spec.head_dim, spec.rms_norm_eps)
        self.k_norm = RMSNorm(spec.head_dim, spec.rms_norm_eps)

    def forward(
        self, x: Tensor, cos: Tensor, sin: Tensor, start_pos: Tensor, slot_ids: Tensor, cache: Tensor, in_place: bool
    ) -> tuple[Tensor, Tensor]:
        batch, t, _ = x.shape
        q_gate, k, v = self.qkv_proj(x).split(list(self.qkv_proj.parts.values()), dim=-1)
        q, gate = q_gate.view(batch, t, self.num_heads, 2 * self.head_dim).chunk(2, dim=-1)
        q = ops.offset_rms_norm(q, self.q_norm.weight, self.q_norm.eps).transpose(1, 2)  # [B, Hq, T, D]
        k = ops.offset_rms_norm(k.view(batch, t, self.num_kv_heads, self.head_dim), self.k_norm.weight, self.k_norm.eps)
        k = k.transpose(1, 2)
        v = v.view(batch, t, self.num_kv_heads, self.head_dim).transpose(1, 2)
        rotated = cos.shape[-1]  # R: partial rotary leaves dims R.. as they are
        if rotated == self.head_dim:
            q, k = ops.rotary(q, k, cos, sin)
        else:
            q_rot, k_rot = ops.rotary(q[..., :rotated].contiguous(), k[..., :rotated].contiguous(), cos, sin)
            q = torch.cat((q_rot, q[..., rotated:]), dim=-1)
            k = torch.cat((k_rot, k[..., rotated:]), dim=-1)
        if in_place:
            ops.kv_write(cache, self.index, slot_ids, start_pos, k, v)
        else:
            cache = ops.kv_update(cache, self.index, slot_ids, start_pos, k, v)
        out = ops.attention(q, cache, self.index, slot_ids, start_pos, self.scale)  # [B, T, Hq, D]
        out = out.reshape(batch, t, -1) * torch.sigmoid(gate.reshape(batch, t, -1))
        return self.o_proj(out), cache


class GatedAttentionLayer(nn.Module):
    """A full-attention decoder layer of a hybrid family on its own (the Qwen3.5 / Qwen3-Next MTP block):
    `index` is its layer in its own KV cache."""

    def __init__(self, spec: ModelSpec, index: int) -> None:
        super().__init__()
        self.self_attn = GatedAttention(spec, index)
        self.mlp = MLP(spec)
        self.input_layernorm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)


class HybridLayer(nn.Module):
    def __init__(self, spec: ModelSpec, layer: int) -> None:
        super().__init__()
        if spec.layer_types[layer] == "linear_attention":
            self.linear_attn = GatedDeltaNet(spec, spec.linear_layers.index(layer))
        else:
            self.self_attn = GatedAttention(spec, spec.attention_layers.index(layer))
        self.mlp = MLP(spec)
        self.input_layernorm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)


class HybridLM(nn.Module):
    """forward(tokens [B, T], start_pos [B], slot_ids [B], state, output, ...) -> (out, state): as
    DecoderLM.forward, with `state` the dict of the target's declared states (`states`) instead of one
    KV cache, plus `lengths` (real positions per row; None: all T) and `snapshots` (the verify form,
    see the module docstring)."""

    def __init__(self, spec: ModelSpec, inv_freq: Tensor, rope_scale: float = 1.0) -> None:
        super().__init__()
        assert spec.linear is not None, "HybridLM needs a hybrid spec"
        self.spec = spec
        self.model = Body(spec, HybridLayer)
        self.lm_head = Linear(spec.hidden_size, spec.vocab_size, bias=False)
        if spec.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.register_buffer("inv_freq", inv_freq.to(torch.float32), persistent=False)
        self.rope_scale = rope_scale

    def rope(self, positions: Tensor, inv_freq: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """cos and sin [B, T, R] of positions [B, T] (R: the rotated dims of a head)."""
        return rope_tables(positions, self.inv_freq if inv_freq is None else inv_freq, self.rope_scale)

    def states(self, slots: int, max_seq_len: int, k: int, dtype: torch.dtype) -> tuple[State, ...]:
        """The target's state: the KV cache rolls back by length; the conv and recurrent states keep one
        snapshot per verified position, and the accept region keeps the one at the accepted count."""
        spec, linear = self.spec, self.spec.linear
        kv = (len(spec.attention_layers), 2, slots, spec.num_kv_heads, max_seq_len, spec.head_dim)
        layers = len(spec.linear_layers)
        return (
            State(KV_CACHE, kv, dtype, rollback="length"),
            State(CONV_STATE, (layers, slots, linear.conv_dim, linear.conv_kernel - 1), dtype, rollback="snapshot"),
            State(
                RECURRENT_STATE,
                (layers, slots, linear.num_v_heads, linear.k_head_dim, linear.v_head_dim),
                RECURRENT_DTYPE,
                rollback="snapshot",
            ),
        )

    def new_state(
        self, slots: int, max_seq_len: int, dtype: torch.dtype, device: torch.device | str
    ) -> dict[str, Tensor]:
        """Zeroed states (a slot's linear-attention state starts at zero, as in transformers' cache)."""
        return {state.name: state.allocate(device) for state in self.states(slots, max_seq_len, 0, dtype)}

    def forward(
        self,
        tokens: Tensor,
        start_pos: Tensor,
        slot_ids: Tensor,
        state: dict[str, Tensor],
        output: str = "hidden",
        in_place: bool = False,
        rope: tuple[Tensor, Tensor] | None = None,
        capture: tuple[str, ...] = (),
        lengths: Tensor | None = None,
        snapshots: bool = False,
    ) -> tuple[Tensor, dict[str, Tensor]]:
        layer_inputs = capture_points(capture, self.spec.num_layers)
        captured: dict[str, Tensor] = {}
        if snapshots and in_place:
            raise ValueError("the verify form (snapshots=True) is functional only")
        batch, t = tokens.shape
        if rope is None:
            positions = start_pos[:, None] + torch.arange(t, device=tokens.device)  # [B, T]
            rope = self.rope(positions)
        cos, sin = rope
        if not snapshots and lengths is None:
            lengths = torch.full((batch,), t, dtype=torch.int64, device=tokens.device)
        state = dict(state)
        if snapshots:
            state[snapshot_name(CONV_STATE)], state[snapshot_name(RECURRENT_STATE)] = [], []
        layers = self.model.layers
        residual = self.model.embed_tokens(tokens)  # [B, T, hidden]
        hidden = ops.offset_rms_norm(residual, layers[0].input_layernorm.weight, layers[0].input_layernorm.eps)
        for index, layer in enumerate(layers):
            if index in layer_inputs:  # the residual stream entering layer `index` (transformers' hidden_states[index])
                captured[f"layer_in:{index}"] = residual
            if hasattr(layer, "linear_attn"):
                mixed, state = layer.linear_attn(
                    hidden, start_pos, slot_ids, state, None if snapshots else lengths, in_place
                )
            else:
                mixed, state[KV_CACHE] = layer.self_attn(
                    hidden, cos, sin, start_pos, slot_ids, state[KV_CACHE], in_place
                )
            # Each residual add rides on the next norm's kernel: (norm(residual + x), residual + x).
            norm = layer.post_attention_layernorm
            hidden, residual = ops.add_offset_rms_norm(mixed, residual, norm.weight, norm.eps)
            norm = layers[index + 1].input_layernorm if index + 1 < len(layers) else self.model.norm
            hidden, residual = ops.add_offset_rms_norm(layer.mlp(hidden), residual, norm.weight, norm.eps)
        if snapshots:  # [Lg, B, T, ...]: one stack per state, what the accept region selects from
            for name in (CONV_STATE, RECURRENT_STATE):
                state[snapshot_name(name)] = torch.stack(state[snapshot_name(name)])
        if output == "last_logits":
            return self.logits(hidden[:, -1]), state
        if output == "logits":
            return self.logits(hidden), state
        if output in ("hidden_and_features", "logits_and_features"):  # a forward whose states a drafter reads
            captured["final"] = hidden
            parts = [captured[point] for point in capture]
            features = parts[0] if len(parts) == 1 else torch.cat(parts, dim=-1)  # [B, T, F]
            return (self.logits(hidden) if output == "logits_and_features" else hidden, features), state
        if output != "hidden":
            raise ValueError(f"unknown output {output!r}")
        return hidden, state

    def logits(self, hidden: Tensor) -> Tensor:
        return self.lm_head(hidden)
