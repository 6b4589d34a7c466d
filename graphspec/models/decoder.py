"""Traceable decoder-only LM for the Llama family (Llama 2/3/3.1/3.2, Mistral, Qwen2/2.5, Qwen3).

Written for tracing: static shapes, the KV cache is an explicit tensor owned by the caller and
threaded through forward functionally (graphspec::kv_update returns the new cache), positions are
tensors, and attention/norm/rotary/cache writes are single graphspec:: ops. Module and parameter
names mirror transformers', except that projections of one input are fused into one weight (q/k/v
into qkv_proj, gate/up into gate_up_proj; see FusedLinear), which the loader concatenates from the
checkpoint's separate tensors.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from graphspec import ops
from graphspec.models.spec import ModelSpec

# A folded layer (models/fold_norms.py) takes the folded form (o projection added into the residual, the norm's
# row scale in the SwiGLU) in programs of up to this many rows (batch x tokens): there one launch fewer per layer
# won on an H200 (decode and verify, 1-80 rows, 2026-11-29). A prefill chunk's thousands of rows ran slower folded
# (cuBLAS's beta = 1 GEMM, the row-scale re-reads: docs/BENCHMARKS.md), so larger programs keep the norm kernel,
# with the folded layers' norm weight as ones.
FOLDED_MAX_ROWS = 80
# A folded input norm takes its folded form (the down projection added into the residual, the row scale on q/k/v:
# graphspec::row_scale, which the fuse_row_scale pass moves into the step's attention kernel, where every program
# reads its row's T source rows again) in such programs of up to this many tokens per row that compute no last
# position: decode and draft forwards, a verify of K <= 7 drafts. On an H200 that won 1.3-1.9% on a decode
# (2026-11-29) and, once the attention summed the T rows' squares with one cross-warp sum (kernels/attention.py
# row_inverse_rms), 0.7-0.8% on a K = 4 draft-model step (2026-11-30: 7.917 -> 7.856, 7.752 -> 7.698 ms); before
# that, a 5-token verify at B = 1 had lost 0.4%. Prefill programs' attention (graphspec::prefill_attention) takes no
# row scale. Other programs keep the norm kernel (weight: ones).
FOLDED_INPUT_MAX_TOKENS = 8


class RMSNorm(nn.Module):
    """Holds the weight; the computation is graphspec::rms_norm / add_rms_norm."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps


# Modules whose parameters always come from a checkpoint (models are built on the meta device, then
# filled): their initialization is skipped. Besides being wasted work, torch initializes meta tensors
# through its Python references, and the first such call imports torch._dynamo: seconds of start-up.
class Linear(nn.Linear):
    def reset_parameters(self) -> None:
        pass


class Embedding(nn.Embedding):
    def reset_parameters(self) -> None:
        pass


class Conv1d(nn.Conv1d):
    def reset_parameters(self) -> None:
        pass


class FusedLinear(Linear):
    """Projections of the same input as one GEMM: q/k/v, or gate/up. At decode batch sizes a GEMM is
    bound by streaming its weight, and one wide GEMM streams better (and launches fewer kernels, with
    fewer split-K reductions) than two or three narrow ones. `parts` maps each checkpoint tensor name
    (relative to the parent module) to its rows; the weight is their concatenation in that order."""

    def __init__(self, in_features: int, parts: dict[str, int], bias: bool) -> None:
        super().__init__(in_features, sum(parts.values()), bias=bias)
        self.parts = dict(parts)


class Attention(nn.Module):
    def __init__(self, spec: ModelSpec, layer: int) -> None:
        super().__init__()
        self.layer = layer
        self.num_heads, self.num_kv_heads, self.head_dim = spec.num_heads, spec.num_kv_heads, spec.head_dim
        self.scale = spec.head_dim**-0.5
        hidden, q_dim, kv_dim = spec.hidden_size, spec.num_heads * spec.head_dim, spec.num_kv_heads * spec.head_dim
        self.qkv_proj = FusedLinear(hidden, {"q_proj": q_dim, "k_proj": kv_dim, "v_proj": kv_dim}, spec.qkv_bias)
        self.o_proj = Linear(q_dim, hidden, bias=spec.o_bias)
        # Set by models/fold_norms.py: the eps of the input RMSNorm whose weight qkv_proj holds.
        self.folded_norm_eps: float | None = None
        if spec.qk_norm:
            self.q_norm = RMSNorm(spec.head_dim, spec.rms_norm_eps)
            self.k_norm = RMSNorm(spec.head_dim, spec.rms_norm_eps)
        self.qk_norm = spec.qk_norm
        # False: the T queries of a call are one block that sees itself whole (graphspec::block_attention;
        # DFlash drafter layers), instead of causal attention.
        self.causal = True

    def forward(
        self,
        x: Tensor,
        cos: Tensor,
        sin: Tensor,
        start_pos: Tensor,
        slot_ids: Tensor,
        cache: Tensor,
        in_place: bool,
        last_index: Tensor | None = None,
        residual: Tensor | None = None,
        scale_eps: float | None = None,
    ) -> tuple[Tensor, ...]:
        """(out [B, T, hidden], cache); with last_index [B], a third value: the output [B, 1, hidden] of
        each row's query at t = last_index[b] alone, attending to the cache as written (its whole chunk is
        in it, but causality stops it at its own position). With residual [B, T, hidden], the outputs are
        residual + the attention's (the o projection adds into it: one addmm, see add_linear). With scale_eps,
        x is un-normalized (a folded input norm's input) and q/k/v are scaled by its rows' rsqrt(mean(x^2) +
        scale_eps) (graphspec::row_scale)."""
        qkv = self.qkv_proj(x)
        if scale_eps is not None:
            qkv = ops.row_scale(qkv, x, scale_eps)
        return self.attend(qkv, cos, sin, start_pos, slot_ids, cache, in_place, last_index, residual)

    def attend(
        self,
        qkv: Tensor,
        cos: Tensor,
        sin: Tensor,
        start_pos: Tensor,
        slot_ids: Tensor,
        cache: Tensor,
        in_place: bool,
        last_index: Tensor | None = None,
        residual: Tensor | None = None,
    ) -> tuple[Tensor, ...]:
        """forward from the q/k/v projection qkv [B, T, q + k + v widths] on: callers that project more
        rows than they attend with (DFlash's context rows share the block's GEMM) pass their rows' part."""
        batch, t, _ = qkv.shape
        q, k, v = qkv.split(list(self.qkv_proj.parts.values()), dim=-1)  # views, no copies
        q = q.view(batch, t, self.num_heads, self.head_dim)
        k = k.view(batch, t, self.num_kv_heads, self.head_dim)
        v = v.view(batch, t, self.num_kv_heads, self.head_dim)
        if self.qk_norm:  # Qwen3 normalizes each head before rotary.
            q = ops.rms_norm(q, self.q_norm.weight, self.q_norm.eps)
            k = ops.rms_norm(k, self.k_norm.weight, self.k_norm.eps)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # [B, H, T, D]
        q, k = ops.rotary(q, k, cos, sin)
        if in_place:  # eager callers (prefill) write straight into their buffer
            ops.kv_write(cache, self.layer, slot_ids, start_pos, k, v)
        else:  # tracing: functional form, made in-place again by the defunctionalize_kv pass
            cache = ops.kv_update(cache, self.layer, slot_ids, start_pos, k, v)
        attend = ops.attention if self.causal else ops.block_attention
        out = attend(q, cache, self.layer, slot_ids, start_pos, self.scale)  # [B, T, Hq, D]
        if last_index is None:
            # An explicit width, not -1: an empty batch (0 rows) must reshape too.
            return self.project(out.view(batch, t, self.num_heads * self.head_dim), residual), cache
        rows = torch.arange(batch, device=qkv.device)
        # The last row's residual is gathered before the o projection adds into the whole residual (which may
        # then write it in place: passes/addmm_in_place.py).
        last_residual = None if residual is None else residual[rows, last_index][:, None]
        out = self.project(out.view(batch, t, self.num_heads * self.head_dim), residual)
        q_last = q[rows, :, last_index][:, :, None]  # [B, Hq, 1, D], rotated
        last = ops.attention(q_last, cache, self.layer, slot_ids, start_pos + last_index, self.scale)  # [B, 1, Hq, D]
        return out, cache, self.project(last.view(batch, 1, self.num_heads * self.head_dim), last_residual)

    def project(self, out: Tensor, residual: Tensor | None) -> Tensor:
        """The o projection of out [B, T, Hq * D], added into residual when given."""
        return self.o_proj(out) if residual is None else add_linear(residual, out, self.o_proj)


class MLP(nn.Module):
    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        size = spec.intermediate_size
        self.gate_up_proj = FusedLinear(spec.hidden_size, {"gate_proj": size, "up_proj": size}, spec.mlp_bias)
        self.down_proj = Linear(size, spec.hidden_size, bias=spec.mlp_bias)
        # Set by models/fold_norms.py: the eps of the RMSNorm whose weight gate_up_proj holds.
        self.folded_norm_eps: float | None = None

    def forward(self, x: Tensor, scale_eps: float | None = None, residual: Tensor | None = None) -> Tensor:
        """down(silu(gate) * up) of x's projections; with scale_eps, x is un-normalized (a folded norm's input) and
        gate and up are first scaled by its rows' rsqrt(mean(x^2) + scale_eps) (graphspec::scaled_silu_mul). With
        residual, the output is residual + that (the down projection adds into it, see add_linear)."""
        if scale_eps is not None and x.shape[:-1].numel() == 1 and self.gate_up_proj.bias is None:
            # One row (a batch-1 decode or draft forward): the projection and its scaled SwiGLU as one op, one kernel
            # that takes the row scale from the x it streams (kernels/scaled_silu_mul_linear.py).
            width = x.shape[-1]
            act = ops.scaled_silu_mul_linear(x.reshape(1, width), self.gate_up_proj.weight.t(), scale_eps)
            act = act.view(*x.shape[:-1], act.shape[-1])
        else:
            gate_up = self.gate_up_proj(x)
            act = ops.silu_mul(gate_up) if scale_eps is None else ops.scaled_silu_mul(gate_up, x, scale_eps)
        return self.down_proj(act) if residual is None else add_linear(residual, act, self.down_proj)


class DecoderLayer(nn.Module):
    def __init__(self, spec: ModelSpec, layer: int) -> None:
        super().__init__()
        self.self_attn = Attention(spec, layer)
        self.mlp = MLP(spec)
        self.input_layernorm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)


class Body(nn.Module):
    """Embedding, layers, final norm (the checkpoint's `model.*`); `layer` builds layer i (hybrid
    families pass their own)."""

    def __init__(self, spec: ModelSpec, layer: Callable[[ModelSpec, int], nn.Module] = DecoderLayer) -> None:
        super().__init__()
        self.embed_tokens = Embedding(spec.vocab_size, spec.hidden_size)
        self.layers = nn.ModuleList(layer(spec, i) for i in range(spec.num_layers))
        self.norm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)


class DecoderLM(nn.Module):
    """forward(tokens [B, T], start_pos [B], slot_ids [B], cache, output) -> (out, cache).

    Token t of row b sits at position start_pos[b] + t; its K/V land in cache slot slot_ids[b].
    output="hidden" returns final hidden states [B, T, hidden] (gather them and call `logits` when
    only some positions matter, as prefill does); "logits" returns [B, T, V]; "last_logits" [B, V];
    "hidden_and_features" and "logits_and_features" return a pair, the second the `capture` features.
    capture: a static tuple of capture points (what a drafter reads from the target, see
    capture_points); their values, concatenated in that order, are the features [B, T, F].
    Asking forward for logits keeps lm_head inside torch.func.functional_call when tracing.
    in_place=True writes the cache argument in place (eager use) instead of returning a new one.
    """

    def __init__(self, spec: ModelSpec, inv_freq: Tensor, rope_scale: float = 1.0) -> None:
        super().__init__()
        self.spec = spec
        self.model = Body(spec)
        self.lm_head = Linear(spec.hidden_size, spec.vocab_size, bias=False)
        if spec.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.register_buffer("inv_freq", inv_freq.to(torch.float32), persistent=False)
        self.rope_scale = rope_scale

    def rope(self, positions: Tensor, inv_freq: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """cos and sin [B, T, D] of positions [B, T], with the same arithmetic as transformers' rotary
        embedding (fp32 angles, cos/sin scaled, cast to the model dtype by the rotary op). inv_freq:
        this model's buffer as bound by the caller (torch.func.functional_call), else its own."""
        return rope_tables(positions, self.inv_freq if inv_freq is None else inv_freq, self.rope_scale)

    def forward(
        self,
        tokens: Tensor,
        start_pos: Tensor,
        slot_ids: Tensor,
        cache: Tensor,
        output: str = "hidden",
        in_place: bool = False,
        rope: tuple[Tensor, Tensor] | None = None,
        capture: tuple[str, ...] = (),
        last_index: Tensor | None = None,
    ) -> tuple[Any, Tensor]:
        """rope: cos and sin [B, T, D] of this call's positions when the caller already has them (the
        step computes the draft's once for all its forwards: about seven small launches per forward).
        last_index [B] (prefill): the output is (out, last_hidden), last_hidden [B, hidden] being the final
        hidden state at t = last_index[b], computed past the last layer's K/V for that position alone.
        A caller that needs only it (the first token) leaves the last layer's full pass as dead code
        (about 1/L of a long prompt's work); one that reads `out` too still gets every position."""
        layer_inputs = capture_points(capture, self.spec.num_layers)
        captured: dict[str, Tensor] = {}
        if rope is None:
            positions = start_pos[:, None] + torch.arange(tokens.shape[1], device=tokens.device)  # [B, T]
            rope = self.rope(positions)
        cos, sin = rope
        residual = self.model.embed_tokens(tokens)  # [B, T, hidden]
        layers = self.model.layers
        few_rows = tokens.numel() <= FOLDED_MAX_ROWS
        # Where folded input norms take their folded form (FOLDED_INPUT_MAX_TOKENS).
        fold_input = few_rows and last_index is None and tokens.shape[1] <= FOLDED_INPUT_MAX_TOKENS
        if self.input_scale_eps(layers[0], fold_input) is not None:
            hidden = residual  # the first layer's q/k/v scale their own rows
        else:
            hidden = ops.rms_norm(residual, *self.input_norm(layers[0]))
        last_hidden = None
        for index, layer in enumerate(layers):
            if index in layer_inputs:  # the residual stream entering layer `index` (transformers' hidden_states[index])
                captured[f"layer_in:{index}"] = residual
            attend_last = last_index if index == len(layers) - 1 else None
            input_eps = self.input_scale_eps(layer, fold_input)  # not None: hidden is the residual itself
            norm_weight, norm_eps = self.post_attention_norm(layer)
            if layer.mlp.folded_norm_eps is None or not few_rows:
                attn_out, cache, *attn_last = layer.self_attn(
                    hidden, cos, sin, start_pos, slot_ids, cache, in_place, attend_last, None, input_eps
                )
                if attn_last:  # the last position alone (prefill's first token): its residual gathered
                    rows = torch.arange(tokens.shape[0], device=tokens.device)
                    last, last_residual = ops.add_rms_norm(
                        attn_last[0], residual[rows, last_index][:, None], norm_weight, norm_eps
                    )
                hidden, residual = ops.add_rms_norm(attn_out, residual, norm_weight, norm_eps)
                scale_eps = None
            else:  # folded, few rows: the o projection adds into the residual, the MLP scales its own rows
                residual, cache, *attn_last = layer.self_attn(
                    hidden, cos, sin, start_pos, slot_ids, cache, in_place, attend_last, residual, input_eps
                )
                if attn_last:
                    last = last_residual = attn_last[0]
                hidden, scale_eps = residual, norm_eps
            if attn_last:
                last_hidden = ops.add_rms_norm(layer.mlp(last, scale_eps), last_residual, *self.final_norm())[0][:, 0]
            following = layers[index + 1] if index + 1 < len(layers) else None
            if following is not None and self.input_scale_eps(following, fold_input) is not None:
                hidden = residual = layer.mlp(hidden, scale_eps, residual)  # the down projection adds into it
            else:  # the next layer's input norm (or the final norm) fuses with this layer's residual add
                weight, eps = self.input_norm(following) if following is not None else self.final_norm()
                hidden, residual = ops.add_rms_norm(layer.mlp(hidden, scale_eps), residual, weight, eps)
        out = self._output(output, hidden, captured, capture)
        return (out if last_index is None else (out, last_hidden)), cache

    def input_scale_eps(self, layer: nn.Module, fold_input: bool) -> float | None:
        """The eps of `layer`'s input norm where it is folded and takes its folded form in this program (fold_input:
        FOLDED_INPUT_MAX_TOKENS): its q/k/v then scale the residual's rows themselves; else None."""
        return layer.self_attn.folded_norm_eps if fold_input else None

    def input_norm(self, layer: nn.Module) -> tuple[Tensor, float]:
        """The weight and eps of `layer`'s input norm: its own, or ones where fold_norms moved the weight into
        q/k/v (models/fold_norms.py; the norm then only normalizes, where it runs)."""
        if layer.self_attn.folded_norm_eps is not None:
            return self.folded_norm_weight, layer.self_attn.folded_norm_eps
        return layer.input_layernorm.weight, layer.input_layernorm.eps

    def final_norm(self) -> tuple[Tensor, float]:
        return self.model.norm.weight, self.model.norm.eps

    def post_attention_norm(self, layer: nn.Module) -> tuple[Tensor, float]:
        """The weight and eps of `layer`'s post-attention norm: its own, or ones where fold_norms moved the
        weight into gate/up (models/fold_norms.py; the norm then only normalizes, where it runs)."""
        if layer.mlp.folded_norm_eps is not None:
            return self.folded_norm_weight, layer.mlp.folded_norm_eps
        return layer.post_attention_layernorm.weight, layer.post_attention_layernorm.eps

    def _output(self, output: str, hidden: Tensor, captured: dict[str, Tensor], capture: tuple[str, ...]) -> Any:
        if output == "last_logits":
            return self.logits(hidden[:, -1])
        if output == "logits":
            return self.logits(hidden)
        if output in ("hidden_and_features", "logits_and_features"):  # a forward whose states a drafter reads
            captured["final"] = hidden
            parts = [captured[point] for point in capture]
            features = parts[0] if len(parts) == 1 else torch.cat(parts, dim=-1)  # [B, T, F]
            return self.logits(hidden) if output == "logits_and_features" else hidden, features
        return hidden

    def logits(self, hidden: Tensor) -> Tensor:
        return self.lm_head(hidden)

    def new_cache(
        self, slots: int, max_seq_len: int, dtype: torch.dtype, device: torch.device | str, zeroed: bool = True
    ) -> Tensor:
        """KV cache [L, 2, SLOTS, Hkv, S, D]; zeroed unless only its shape matters (tracing)."""
        make = torch.zeros if zeroed else torch.empty
        return make(kv_cache_shape(self.spec, self.spec.num_layers, slots, max_seq_len), dtype=dtype, device=device)


def add_linear(residual: Tensor, x: Tensor, linear: nn.Linear) -> Tensor:
    """residual + linear(x) (no bias) as one aten.addmm: cuBLAS adds the product into the residual (beta = 1)
    where graphspec::add_rms_norm would be a launch of its own, and the addmm_in_place pass lets it write the
    residual in place where nothing reads the old one (an out-of-place addmm copies its input first)."""
    width = residual.shape[-1]
    out = torch.addmm(residual.reshape(-1, width), x.reshape(-1, x.shape[-1]), linear.weight.t())
    return out.view(residual.shape)


def rope_tables(positions: Tensor, inv_freq: Tensor, scale: float) -> tuple[Tensor, Tensor]:
    """cos and sin [B, T, D] of positions [B, T] (see DecoderLM.rope), one op (graphspec.ops.rope_tables)."""
    return ops.rope_tables(positions, inv_freq, scale)


# What a drafter can read from a target forward: "final", the final (normed) hidden states (MTP heads),
# or "layer_in:<i>", the residual stream entering layer i, i.e. transformers' hidden_states[i]
# (hidden_states[0] is the embedding output; EAGLE-3 reads three of these).


def capture_points(capture: tuple[str, ...], num_layers: int) -> set[int]:
    """The layer indices `capture` reads the input of; raises ValueError on a point the model lacks."""
    layers = set()
    for point in capture:
        if point == "final":
            continue
        kind, _, index = point.partition(":")
        if kind != "layer_in" or not index.isdigit() or not 0 <= int(index) < num_layers:
            raise ValueError(f"bad capture point {point!r}: 'final' or 'layer_in:<i>' with 0 <= i < {num_layers}")
        layers.add(int(index))
    return layers


def kv_cache_shape(spec: ModelSpec, layers: int, slots: int, max_seq_len: int) -> tuple[int, ...]:
    """[L, 2, SLOTS, Hkv, S, D]: the KV cache layout every graphspec attention op reads (ops.py)."""
    return (layers, 2, slots, spec.num_kv_heads, max_seq_len, spec.head_dim)


def checkpoint_layout(model: nn.Module) -> dict[str, tuple[str, int, int]]:
    """Checkpoint tensor name -> (parameter name, first row, rows) for every tensor stored in a fused
    parameter; tensors not listed here are stored under the parameter's own name."""
    layout = {}
    for prefix, module in model.named_modules():
        if isinstance(module, FusedLinear):
            parent = prefix.rpartition(".")[0]
            for kind in ("weight", "bias") if module.bias is not None else ("weight",):
                row = 0
                for part, rows in module.parts.items():
                    layout[f"{parent}.{part}.{kind}"] = (f"{prefix}.{kind}", row, rows)
                    row += rows
    return layout


def checkpoint_state(model: nn.Module) -> dict[str, Tensor]:
    """The model's weights under the checkpoint's own (unfused) names, tied weights once: fused
    parameters appear as row slices (views), so this also serves to save or compare a checkpoint."""
    layout = checkpoint_layout(model)
    fused = {parameter for parameter, _, _ in layout.values()}
    parameters = dict(model.named_parameters())
    state = {name: p for name, p in parameters.items() if name not in fused}
    for name, (parameter, row, rows) in layout.items():
        state[name] = parameters[parameter][row : row + rows]
    return state


def checkpoint_shapes(model: nn.Module) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every tensor a checkpoint for `model` holds (meta models work too)."""
    return {name: tuple(tensor.shape) for name, tensor in checkpoint_state(model).items()}
