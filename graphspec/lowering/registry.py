"""Kernel table: (op, SM arch) -> Triton kernel entry, with fallbacks: the exact SM, then "default", then
None (the graph keeps the torch reference op). On the CPU (no SM) a second, smaller table, CPU_KERNELS,
holds the ops whose reference does work the CPU need not do (attention over the whole cache).

Each kernel file (kernels/<op>.py, installed as graphspec.kernels.<op>) registers the custom op
graphspec::<op>_triton (the reference op's arguments plus its config as trailing ints) and holds its
per-SM configs as data in CONFIGS. This module adds what the table needs on top of that: which ops have
kernels, the oldest SM they run on, and a `fits(node)` predicate per op that reads the node's fake
tensors (node.meta["val"] of its tensor arguments) to check the shapes and dtypes the kernel supports.
A node without fake values does not fit: the reference is always correct, a kernel only where checked.
A CPU kernel file (kernels/<op>_cpu.py) registers graphspec::<op>_cpu with exactly the reference op's
arguments and holds CONFIGS = {"cpu": {}}; it imports torch only.
Kernel modules are imported on first use, so importing the pipeline never creates Triton functions
(tests choose TRITON_INTERPRET before that).

A config row may also be keyed (sm, shape class): a kernel module that defines shape_class(*args) (the
node's arguments, fake tensors for tensors) names the class of a node's shapes, e.g. "many_rows" for a
prefill chunk's thousands of rows where the SM's row was tuned at a decode step's few; resolve takes the
(sm, class) row when the table has one, else the SM's row. Every row is data in the kernel's CONFIGS.

numerics="invariant" (resolve's argument) asks for kernels whose result for one row (a token, a query)
does not depend on what else shares the launch: a row computed alone, in a batch, or as one position
of a verify block gives the same bits. Kernels in ROW_INVARIANT are so with every config row; attention
has a CONFIGS["invariant"] row for it; aten.mm/addmm get kernels/mm.py's matmul. An op with neither keeps
its reference, which lower_kernels then refuses.

By default cuBLAS keeps aten.mm/addmm (CUBLAS_BY_DEFAULT) except at the shape classes their CONFIGS name,
kernels/gemv.py's: "one_row" (a product of one row and a transposed weight; "one_row_long_k" where K >= 4N, its
own tiles) and "two_rows" (two rows, a narrow weight), which its dot-free GEMVs read faster than cuBLAS, and
"few_rows"/"few_rows_wide" (the other products of 2 to gemv.DOT_MAX_ROWS rows: a K = 4 verify at batch 1, a batch-2
decode), its tensor-core kernel.
aten.addmm_ (the folded norms' in-place residual adds) has only those kernels: it fits those classes.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import torch
import torch.fx as fx

from graphspec import ops
from graphspec.input_names import is_weight_input
from graphspec.op_nodes import VIEW_OPS, positional_args
from graphspec.ops import MAX_SAMPLING_VOCAB

MIN_SM = 80  # bf16 tensor-core dots and cp.async pipelining need Ampere or newer
FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
INT32_LIMIT = 2**31


def _vals(node: fx.Node, count: int) -> list[Any] | None:
    """Fake tensors of the node's first `count` arguments, None if any is missing."""
    return _vals_at(node, range(count))


def _vals_at(node: fx.Node, positions: Iterable[int]) -> list[Any] | None:
    """Fake tensors of the node's arguments at `positions`, None if any is missing."""
    values = []
    for position in positions:
        arg = node.args[position] if position < len(node.args) else None
        value = arg.meta.get("val") if isinstance(arg, fx.Node) else None
        if not isinstance(value, torch.Tensor):
            return None
        values.append(value)
    return values


def _is_index(value: torch.Tensor, length: int) -> bool:
    """A contiguous [length] tensor of integers (bool would mean a mask to index_put, not indices): the kernels
    read entry b at offset b (a strided view, a column of a [B, K] tensor say, would be read wrong)."""
    dtype = value.dtype
    return (
        value.dim() == 1
        and value.shape[0] == length
        and (length <= 1 or value.stride(0) == 1)
        and not dtype.is_floating_point
        and dtype != torch.bool
    )


def fits_attention(node: fx.Node) -> bool:
    values = _vals(node, 2)
    return values is not None and _attention_fits(*values)


def _attention_fits(q: torch.Tensor, cache: torch.Tensor) -> bool:
    head_dim = q.shape[-1] if q.dim() == 4 else None
    return (
        q.dim() == 4
        and cache.dim() == 6
        and q.dtype == cache.dtype
        and q.dtype in FLOAT_DTYPES
        and head_dim in _module("attention").HEAD_DIMS
        and cache.shape[5] == head_dim
        and q.shape[1] % cache.shape[3] == 0
        # int32 offsets inside one (layer, kind, slot, head) plane; everything above it is int64
        and cache.shape[4] * cache.stride(4) + head_dim * cache.stride(5) < INT32_LIMIT
    )


def fits_rms_norm(node: fx.Node) -> bool:
    values = _vals(node, 2)
    if values is None:
        return False
    x, weight = values
    return (
        x.dim() >= 1
        and x.dtype in FLOAT_DTYPES
        and weight.dtype == x.dtype
        and weight.dim() == 1
        and weight.shape[0] == x.shape[-1]
        and x.shape[-1] <= _module("rms_norm").MAX_DIM
    )


def fits_add_rms_norm(node: fx.Node) -> bool:
    values = _vals(node, 3)
    if values is None:
        return False
    x, residual, weight = values
    return (
        residual.shape == x.shape
        and residual.dtype == x.dtype
        and x.dtype in FLOAT_DTYPES
        and weight.dtype == x.dtype
        and weight.dim() == 1
        and weight.shape[0] == x.shape[-1]
        and x.shape[-1] <= _module("rms_norm").MAX_DIM
    )


def fits_embed_norm_concat(node: fx.Node) -> bool:
    values = _vals(node, 5)
    if values is None:
        return False
    tokens, embed_weight, embed_norm, hidden, hidden_norm = values
    dtype, dim = hidden.dtype, hidden.shape[-1] if hidden.dim() else 0
    return (
        hidden.dim() >= 1
        and tuple(tokens.shape) == tuple(hidden.shape[:-1])
        and tokens.dtype in (torch.int64, torch.int32)
        and dtype in FLOAT_DTYPES
        and embed_weight.dim() == 2
        and embed_weight.is_contiguous()
        and embed_weight.shape[1] == dim
        and all(t.dtype == dtype for t in (embed_weight, embed_norm, hidden_norm))
        and all(t.dim() == 1 and t.shape[0] == dim for t in (embed_norm, hidden_norm))
        and 0 < dim <= _module("embed_norm_concat").MAX_DIM
    )


def fits_gated_rms_norm(node: fx.Node) -> bool:
    values = _vals(node, 3)
    if values is None:
        return False
    x, gate, weight = values
    return (
        x.dim() >= 1
        and x.dtype in FLOAT_DTYPES
        and gate.shape == x.shape
        and gate.dtype == x.dtype
        and weight.dtype == x.dtype  # the reference scales in x's dtype; another would promote
        and weight.dim() == 1
        and weight.shape[0] == x.shape[-1]
        and x.shape[-1] <= _module("rms_norm").MAX_DIM
    )


def fits_gdn_gates(node: fx.Node) -> bool:
    values = _vals(node, 4)
    if values is None:
        return False
    a, b, a_log, dt_bias = values
    return (
        a.dim() >= 1
        and b.shape == a.shape
        and a.dtype in FLOAT_DTYPES
        and b.dtype in FLOAT_DTYPES
        and a_log.dtype in FLOAT_DTYPES
        and dt_bias.dtype in FLOAT_DTYPES
        and tuple(a_log.shape) == tuple(dt_bias.shape) == (a.shape[-1],)
    )


def fits_rotary(node: fx.Node) -> bool:
    values = _vals(node, 4)
    return values is not None and _rotary_fits(*values)


def _rotary_fits(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> bool:
    if q.dim() != 4 or k.dim() != 4 or cos.dim() != 3 or sin.dim() != 3:
        return False
    batch, _, t, head_dim = q.shape
    return (
        q.dtype in FLOAT_DTYPES
        and k.dtype == q.dtype
        and head_dim % 2 == 0
        and tuple(k.shape) == (batch, k.shape[1], t, head_dim)
        and tuple(cos.shape) == (batch, t, head_dim)
        and tuple(sin.shape) == (batch, t, head_dim)
    )


def fits_silu_mul(node: fx.Node) -> bool:
    values = _vals(node, 1)
    if values is None:
        return False
    (gate_up,) = values
    return (
        gate_up.dim() >= 1
        and gate_up.dtype in FLOAT_DTYPES
        and gate_up.shape[-1] % 2 == 0
        # int32 column offsets within a row (rows are int64)
        and gate_up.shape[-1] * max(1, abs(gate_up.stride(-1))) < INT32_LIMIT
    )


def fits_scaled_silu_mul(node: fx.Node) -> bool:
    values = _vals(node, 2)
    if values is None or not fits_silu_mul(node):
        return False
    gate_up, x = values
    rows = gate_up.numel() // max(1, gate_up.shape[-1])
    return (
        x.dim() >= 1
        and x.dtype in FLOAT_DTYPES
        and tuple(x.shape[:-1]) == tuple(gate_up.shape[:-1])
        and (x.numel() == 0 or x.stride(-1) == 1)  # the kernel reads a row's elements at unit stride
        and x.shape[-1] * rows < INT32_LIMIT
    )


def fits_scaled_silu_mul_linear(node: fx.Node) -> bool:
    values = _vals(node, 2)
    return values is not None and _module("scaled_silu_mul_linear").fits(*values)


def fits_kv_write(node: fx.Node) -> bool:
    # kv_write(cache, layer, slot_ids, start_pos, k, v): layer is a plain int, not a node.
    values = _vals_at(node, (0, 2, 3, 4, 5))
    if values is None or len(node.args) < 6 or type(node.args[1]) is not int:
        return False
    cache, slot_ids, start_pos, k, v = values
    return _kv_write_fits(cache, node.args[1], slot_ids, start_pos, k, v)


def _kv_write_fits(
    cache: torch.Tensor, layer: int, slot_ids: torch.Tensor, start_pos: torch.Tensor, k: torch.Tensor, v: torch.Tensor
) -> bool:
    if cache.dim() != 6 or k.dim() != 4:
        return False
    batch, kv_heads, t, head_dim = k.shape
    return (
        cache.dtype in FLOAT_DTYPES
        and k.dtype in FLOAT_DTYPES
        and v.dtype in FLOAT_DTYPES
        and tuple(v.shape) == tuple(k.shape)
        and cache.shape[3] == kv_heads
        and cache.shape[5] == head_dim
        and -cache.shape[0] <= layer < cache.shape[0]
        and _is_index(slot_ids, batch)
        and _is_index(start_pos, batch)
        and head_dim <= _module("kv_write").MAX_DIM
        # int32 (b, h, t) row index; every memory offset above the head dim is int64
        and batch * kv_heads * t < INT32_LIMIT
    )


def fits_rotary_kv_write(node: fx.Node) -> bool:
    # rotary_kv_write(q, k, v, cos, sin, cache, layer, slot_ids, start_pos): the rotary and the kv_write
    # it fuses must both fit. k stands in for the rotated k: same shape, and the same dtype as q
    # (rotary's half checks that), which is what rotary would have passed kv_write.
    values = _vals_at(node, (0, 1, 2, 3, 4, 5, 7, 8))
    if values is None or len(node.args) < 9 or type(node.args[6]) is not int:
        return False
    q, k, v, cos, sin, cache, slot_ids, start_pos = values
    return (
        _rotary_fits(q, k, cos, sin)
        and _kv_write_fits(cache, node.args[6], slot_ids, start_pos, k, v)
        and _norms_fit(node, 9, q)
    )


def _norms_fit(node: fx.Node, first: int, q: torch.Tensor) -> bool:
    """The optional per-head norm weights at args first, first + 1 (fuse_qk_norm): both or neither, each
    [D] contiguous in q's dtype."""
    norms = [arg for arg in positional_args(node)[first : first + 2] if arg is not None]
    weights = _vals_at(node, range(first, first + len(norms))) if norms else []
    return (
        len(norms) in (0, 2)
        and weights is not None
        and all(w.shape == (q.shape[-1],) and w.stride(0) == 1 and w.dtype == q.dtype for w in weights)
    )


def _row_scale_fits(node: fx.Node, position: int, q: torch.Tensor) -> bool:
    """The optional source rows of a folded input norm at arg `position` (fuse_row_scale): none, or a floating
    [B, T, hidden] of unit-stride rows for q [B, Hq, T, D]."""
    if positional_args(node)[position] is None:
        return True
    values = _vals_at(node, (position,))
    if values is None:
        return False
    (src,) = values
    return (
        src.dim() == 3
        and tuple(src.shape[:2]) == (q.shape[0], q.shape[2])
        and src.stride(2) == 1
        and src.dtype.is_floating_point
    )


def fits_rotary_kv_attention(node: fx.Node) -> bool:
    # rotary_kv_attention(q, k, v, cos, sin, cache, layer, slot_ids, start_pos, scale): attention on the
    # rotated q (same shape) must fit, and the step's k/v enter the cache as is, so they share its dtype.
    values = _vals_at(node, (0, 1, 2, 3, 4, 5, 7, 8))
    if values is None or len(node.args) < 10 or type(node.args[6]) is not int:
        return False
    q, k, v, cos, sin, cache, slot_ids, start_pos = values
    # Optional per-head norm weights at args 10, 11 (_norms_fit); arg 13, causal, a plain bool; arg 14, the
    # optional source rows of a folded input norm (_row_scale_fits).
    if not isinstance(positional_args(node)[13], bool):
        return False
    return (
        _attention_fits(q, cache)
        and k.dtype == v.dtype == cache.dtype
        and _rotary_fits(q, k, cos, sin)
        and _kv_write_fits(cache, node.args[6], slot_ids, start_pos, k, v)
        and _norms_fit(node, 10, q)
        and _row_scale_fits(node, 14, q)
    )


def fits_prefill_attention(node: fx.Node) -> bool:
    # prefill_attention(q, k, v, cache, layer, slot_ids, start_pos, scale): attention of q over the cache
    # must fit, and the chunk's k/v enter the cache as is, so they share its dtype.
    values = _vals_at(node, (0, 1, 2, 3, 5, 6))
    if values is None or len(node.args) < 8 or type(node.args[4]) is not int:
        return False
    q, k, v, cache, slot_ids, start_pos = values
    return (
        _attention_fits(q, cache)
        and q.shape[-1] in _module("prefill_attention").HEAD_DIMS  # narrower than the decode kernel's
        and k.dtype == v.dtype == cache.dtype
        and _kv_write_fits(cache, node.args[4], slot_ids, start_pos, k, v)
        and k.shape[2] == q.shape[2]
    )


def fits_mm(node: fx.Node) -> bool:
    values = _vals(node, 2)
    return values is not None and _mm_fits(*values)


def _mm_fits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (
        a.dim() == 2
        and b.dim() == 2
        and a.shape[1] == b.shape[0]
        and a.dtype == b.dtype
        and a.dtype in FLOAT_DTYPES
        # int32 K offsets and column indices; row offsets are int64
        and max(a.shape[1] * max(1, abs(a.stride(1))), b.shape[0] * max(1, abs(b.stride(0)))) < INT32_LIMIT
        and b.shape[1] < INT32_LIMIT
    )


def _unscaled_addmm_values(node: fx.Node) -> list[Any] | None:
    """Fake values of an aten.addmm / addmm_ node's (input, a, b) when beta = alpha = 1, the only form the kernels
    take; None for scaled forms (never traced from nn.Linear: they keep cuBLAS) or missing values."""
    if any(node.kwargs.get(name, 1) != 1 for name in ("beta", "alpha")) or len(node.args) > 3:
        return None
    return _vals(node, 3)


def fits_addmm(node: fx.Node) -> bool:
    # addmm(bias, a, b): the kernel adds a [N] bias.
    values = _unscaled_addmm_values(node)
    if values is None:
        return False
    bias, a, b = values
    n = b.shape[1]
    # the kernels read a [1, N] bias (the folded norms' residual at one row) as [N]
    one_row_bias = a.shape[0] == 1 and tuple(bias.shape) == (1, n) and (n == 1 or bias.stride(1) == 1)
    return _mm_fits(a, b) and (tuple(bias.shape) == (n,) or one_row_bias) and bias.dtype == a.dtype


def fits_addmm_in_place(node: fx.Node) -> bool:
    # addmm_(x, a, b) of a gemv shape class: kernels/gemv.py writes the product into x.
    values = _unscaled_addmm_values(node)
    if values is None:
        return False
    x, a, b = values
    return tuple(x.shape) == (a.shape[0], b.shape[-1]) and _module("gemv").shape_class(a, b, x) is not None


def fits_verify_greedy(node: fx.Node) -> bool:
    values = _vals(node, 2)
    if values is None:
        return False
    logits, drafts = values
    return (
        logits.dim() == 3
        and logits.dtype in FLOAT_DTYPES
        and drafts.dim() == 2
        and not drafts.dtype.is_floating_point
        and tuple(drafts.shape) == (logits.shape[0], logits.shape[1] - 1)
        and logits.shape[2] < INT32_LIMIT
    )


def fits_argmax(node: fx.Node) -> bool:
    values = _vals(node, 1)
    if values is None:
        return False
    (logits,) = values
    # Optional ids at arg 1 (a reduced vocabulary's token ids): int64, one per column.
    if positional_args(node)[1] is None:
        ids_fit = True
    else:
        ids = _vals_at(node, (1,))
        ids_fit = ids is not None and ids[0].dtype == torch.int64 and tuple(ids[0].shape) == (logits.shape[-1],)
    return logits.dim() >= 1 and logits.dtype in FLOAT_DTYPES and 0 < logits.shape[-1] < INT32_LIMIT and ids_fit


def fits_rope_tables(node: fx.Node) -> bool:
    values = _vals(node, 2)
    if values is None:
        return False
    positions, inv_freq = values
    return (
        not positions.dtype.is_floating_point
        and positions.dtype != torch.bool
        and inv_freq.dtype == torch.float32
        and inv_freq.dim() == 1
        and 0 < inv_freq.shape[0] <= _module("rope_tables").MAX_HALF
    )


def fits_embedding(node: fx.Node) -> bool:
    values = _vals(node, 2)
    if values is None:
        return False
    weight, indices = values
    return weight.dim() == 2 and weight.dtype in FLOAT_DTYPES and weight.is_contiguous() and _gathers(weight, indices)


def fits_index_select(node: fx.Node) -> bool:
    values = _vals_at(node, (0, 2))
    if values is None or node.args[1] not in (0, -values[0].dim()):
        return False
    source, index = values
    dtypes = (*FLOAT_DTYPES, torch.int64, torch.int32)
    return source.dim() >= 1 and source.dtype in dtypes and source.is_contiguous() and _gathers(source, index)


def _gathers(table: torch.Tensor, indices: torch.Tensor) -> bool:
    """Row gathers the kernel takes: integer indices (one row each) from a table with something in it."""
    return (
        indices.dtype in (torch.int64, torch.int32)
        and table.numel() > 0
        and indices.numel() * table[0].numel() < INT32_LIMIT
    )


def fits_verify_rejection(node: fx.Node) -> bool:
    values = _vals(node, 8)
    if values is None:
        return False
    target, draft, drafts = values[:3]
    return (
        target.dim() == 3
        and draft.dim() == 3
        and target.dtype in FLOAT_DTYPES
        and draft.dtype == target.dtype
        and drafts.dim() == 2
        and not drafts.dtype.is_floating_point
        and tuple(draft.shape) == (target.shape[0], target.shape[1] - 1, target.shape[2])
        and tuple(drafts.shape) == tuple(draft.shape[:2])
        and target.shape[2] < MAX_SAMPLING_VOCAB
        and all(value.dim() == 1 and value.shape[0] == target.shape[0] for value in values[3:])
    )


def fits_sample(node: fx.Node) -> bool:
    values = _vals(node, 6)
    if values is None:
        return False
    logits = values[0]
    return (
        logits.dim() == 2
        and logits.dtype in FLOAT_DTYPES
        and 0 < logits.shape[1] < MAX_SAMPLING_VOCAB
        and all(value.dim() == 1 and value.shape[0] == logits.shape[0] for value in values[1:])
        and not any(value.dtype.is_floating_point for value in values[4:])  # seed, counter
    )


def fits_gated_delta_rule(node: fx.Node) -> bool:
    # gated_delta_rule(q, k, v, g, beta, state, layer, slot_ids, start_pos, lengths): the snapshot form's
    # arguments plus per-row start positions and lengths.
    values = _vals_at(node, (0, 8, 9))
    if values is None or len(node.args) < 10 or not fits_gated_delta_rule_snapshots(node):
        return False
    q, start_pos, lengths = values
    return _is_index(start_pos, q.shape[0]) and _is_index(lengths, q.shape[0])


def fits_gated_delta_rule_snapshots(node: fx.Node) -> bool:
    # gated_delta_rule_snapshots(q, k, v, g, beta, state, layer, slot_ids): layer is a plain int.
    values = _vals_at(node, (0, 1, 2, 3, 4, 5, 7))
    if values is None or len(node.args) < 8 or type(node.args[6]) is not int:
        return False
    q, k, v, g, beta, state, slot_ids = values
    if q.dim() != 4 or v.dim() != 4 or state.dim() != 5:
        return False
    batch, t, key_heads, key_dim = q.shape
    value_heads, value_dim = v.shape[2], v.shape[3]
    return (
        q.dtype in FLOAT_DTYPES
        and k.dtype == v.dtype == beta.dtype == q.dtype
        and g.dtype == torch.float32
        and state.dtype == torch.float32
        and tuple(k.shape) == tuple(q.shape)
        and tuple(v.shape[:2]) == (batch, t)
        and tuple(g.shape) == tuple(beta.shape) == (batch, t, value_heads)
        and value_heads % key_heads == 0
        and tuple(state.shape[2:]) == (value_heads, key_dim, value_dim)
        and key_dim <= _module("gated_delta_rule_snapshots").MAX_HEAD_DIM
        and -state.shape[0] <= node.args[6] < state.shape[0]
        and _is_index(slot_ids, batch)
    )


def fits_causal_conv1d_snapshots(node: fx.Node) -> bool:
    # causal_conv1d_snapshots(x, conv_state, layer, slot_ids, weight): layer is a plain int.
    values = _vals_at(node, (0, 1, 3, 4))
    if values is None or len(node.args) < 5 or type(node.args[2]) is not int:
        return False
    x, conv_state, slot_ids, weight = values
    return (
        x.dim() == 3
        and conv_state.dim() == 4
        and x.dtype in FLOAT_DTYPES
        and conv_state.dtype in FLOAT_DTYPES
        and weight.dtype in FLOAT_DTYPES
        and conv_state.shape[2] == x.shape[2]
        and tuple(weight.shape) == (x.shape[2], conv_state.shape[3] + 1)
        and -conv_state.shape[0] <= node.args[2] < conv_state.shape[0]
        and _is_index(slot_ids, x.shape[0])
        # int32 channel offsets within a (row, position) of x and of the outputs; rows are int64
        and x.shape[2] * conv_state.shape[3] < INT32_LIMIT
    )


# Reference op name (graphspec.ops.OPS, or ATEN_OPS) -> fits predicate. The kernel module is
# graphspec.kernels.<op> and its op torch.ops.graphspec.<op>_triton. A new kernel is a new entry here and a new file.
KERNELS: dict[str, Callable[[fx.Node], bool]] = {
    "attention": fits_attention,
    "block_attention": fits_attention,  # the same kernel without the causal mask
    "rms_norm": fits_rms_norm,
    "add_rms_norm": fits_add_rms_norm,
    "embed_norm_concat": fits_embed_norm_concat,
    "rotary": fits_rotary,
    "rope_tables": fits_rope_tables,
    "silu_mul": fits_silu_mul,
    "scaled_silu_mul": fits_scaled_silu_mul,
    "scaled_silu_mul_linear": fits_scaled_silu_mul_linear,
    "kv_write": fits_kv_write,
    "rotary_kv_write": fits_rotary_kv_write,
    "rotary_kv_attention": fits_rotary_kv_attention,
    "prefill_attention": fits_prefill_attention,
    "argmax": fits_argmax,
    "verify_greedy": fits_verify_greedy,
    "verify_rejection": fits_verify_rejection,
    "sample": fits_sample,
    "offset_rms_norm": fits_rms_norm,  # the same operands as rms_norm
    "add_offset_rms_norm": fits_add_rms_norm,
    "gated_rms_norm": fits_gated_rms_norm,
    "gdn_gates": fits_gdn_gates,
    "gated_delta_rule": fits_gated_delta_rule,
    "gated_delta_rule_snapshots": fits_gated_delta_rule_snapshots,
    "causal_conv1d_snapshots": fits_causal_conv1d_snapshots,
    "mm": fits_mm,
    "addmm": fits_addmm,
    "addmm_in_place": fits_addmm_in_place,
    "embedding": fits_embedding,
    "index_select": fits_index_select,
}

# The aten ops of the traced graphs that have kernels, by the names KERNELS uses.
ATEN_OPS: dict[str, torch._ops.OpOverload] = {
    "mm": torch.ops.aten.mm.default,
    "addmm": torch.ops.aten.addmm.default,
    "addmm_in_place": torch.ops.aten.addmm_.default,
    "embedding": torch.ops.aten.embedding.default,  # torch's small-index gather is slow at <= 16 rows
    "index_select": torch.ops.aten.index_select.default,
}
# Every reference op a kernel may replace: graphspec's own and those aten ops.
REFERENCE_OPS: dict[str, torch._ops.OpOverload] = {**ops.OPS, **ATEN_OPS}

INVARIANT = "invariant"  # the numerics value, and the CONFIGS key of a kernel's row-invariant config
# By default lowered only at the shape classes their CONFIGS name (gemv.py's "one_row*", "two_rows", "few_rows*"):
# elsewhere cuBLAS is as fast or faster at the step's shapes (bench_linear, the GEMV probes). Under
# numerics="invariant" they take the SM's row at every M.
CUBLAS_BY_DEFAULT = frozenset({"mm", "addmm"})
# Row-invariant with every config row: the norms (the hybrids' too, and embed_norm_concat's) tile whole rows, sized
# by the last dim only; rotary, rope_tables, silu_mul, gdn_gates and the KV writes are elementwise (scaled_silu_mul
# sums its row scale in an order fixed by the hidden size), embedding and index_select copies; argmax and
# verify_greedy are exact (a max and a first index do not round); mm and addmm fix their tiles and K split by (N, K)
# only. The attention kernels' default rows size their splits by the batch and the cache length, so they have an
# "invariant" row instead (prefill programs are not fused under invariant numerics: their attention is the decode
# kernel's). The others (sampling statistics split the vocabulary by the batch; linear attention) have neither yet.
ROW_INVARIANT = frozenset(
    {
        "rms_norm",
        "add_rms_norm",
        "embed_norm_concat",
        "offset_rms_norm",
        "add_offset_rms_norm",
        "gated_rms_norm",
        "rotary",
        "rope_tables",
        "silu_mul",
        "scaled_silu_mul",
    }
    | {"gdn_gates", "kv_write", "rotary_kv_write", "argmax", "verify_greedy", "embedding", "index_select"}
    | CUBLAS_BY_DEFAULT
)


def fits_attention_cpu(node: fx.Node) -> bool:
    values = _vals(node, 2)
    return values is not None and _attention_cpu_fits(*values)


def _attention_cpu_fits(q: torch.Tensor, cache: torch.Tensor) -> bool:
    return (
        q.dim() == 4
        and cache.dim() == 6
        and q.device.type == "cpu"
        and cache.device.type == "cpu"
        and q.dtype in FLOAT_DTYPES
        and cache.dtype in FLOAT_DTYPES
        and cache.shape[5] == q.shape[3]
        and q.shape[1] % cache.shape[3] == 0
    )


def fits_rotary_kv_attention_cpu(node: fx.Node) -> bool:
    # The rotary and the cache write are the reference's own code; only the attention part is new, and
    # causal only (a DFlash block, causal=False, keeps the reference).
    values = _vals_at(node, (0, 5))
    if values is None or len(node.args) < 10:
        return False
    return positional_args(node)[13] is True and _attention_cpu_fits(*values)


def fits_prefill_attention_cpu(node: fx.Node) -> bool:
    values = _vals_at(node, (0, 3))  # q, cache
    return values is not None and _attention_cpu_fits(*values)


def fits_on_cpu(node: fx.Node) -> bool:
    """CPU kernels that run the reference's own arithmetic take whatever it takes, on the CPU."""
    values = _vals(node, 1)
    return values is not None and values[0].device.type == "cpu"


# The CPU table: reference op name -> fits predicate; the kernel module is graphspec.kernels.<op>_cpu and
# its op torch.ops.graphspec.<op>_cpu. The runtime applies it to the steps and prefill programs it runs on
# the CPU (lower_kernels.lower_for_cpu); compiled graphs keep the references there. Attention (the step's
# and prefill's) reads only what each row can see (the reference reads the whole cache). The small ops
# are the reference's arithmetic as composites of torch ops, which the Inductor CPU step (compile_cpu)
# fuses with their neighbours (a reference op is one opaque call to it). sample and verify_rejection skip
# the reference's full-vocabulary sort where each row's top candidates settle its cuts
# (kernels/sampling_cpu.py). mm runs a projection through a oneDNN copy of its weight packed once
# (kernels/mm_cpu.py; MKL's sgemm repacks the weight on every call). Other ops called once per step stay
# references.
CPU = "cpu"
CPU_KERNELS: dict[str, Callable[[fx.Node], bool]] = {
    "attention": fits_attention_cpu,
    "rotary_kv_attention": fits_rotary_kv_attention_cpu,
    "prefill_attention": fits_prefill_attention_cpu,
    "rms_norm": fits_on_cpu,
    "add_rms_norm": fits_on_cpu,
    "embed_norm_concat": fits_on_cpu,
    "rope_tables": fits_on_cpu,
    "silu_mul": fits_on_cpu,
    "scaled_silu_mul": fits_on_cpu,
    "argmax": fits_on_cpu,
    "sample": fits_on_cpu,  # the sort-free path where the candidates settle the batch, else the reference
    "verify_rejection": fits_on_cpu,
    "mm": fits_on_cpu,
}


@dataclass(frozen=True)
class KernelEntry:
    """One row of the table: the kernel op for `op` on `sm` (an SM, "default", "cpu", or one of those with
    a shape class) with its config."""

    op: str
    sm: int | str | tuple[int | str, str]
    kernel: torch._ops.OpOverload
    config: dict[str, int] = field(hash=False)
    fits: Callable[[fx.Node], bool] = field(hash=False, repr=False)

    @property
    def name(self) -> str:
        return self.kernel._schema.name  # graphspec::<op>_triton, or graphspec::<op>_cpu

    @property
    def row(self) -> int | str:
        """The config row's key as dumps and kernels.json show it: 90, "default", or "90:many_rows"."""
        return ":".join(map(str, self.sm)) if isinstance(self.sm, tuple) else self.sm

    @property
    def config_args(self) -> tuple[int, ...]:
        """The config as the kernel op's trailing arguments (CONFIGS key order)."""
        return tuple(self.config.values())


def _module(op: str) -> ModuleType:
    # Imported on first use: creating the @triton.jit functions reads TRITON_INTERPRET.
    return importlib.import_module(f"graphspec.kernels.{op}")


def kernel_module(kernel_op: str) -> ModuleType:
    """The graphspec.kernels module that defines (registers, once imported) kernel op `kernel_op`, by the
    naming rule: <op>_triton in kernels/<op>.py, <op>_cpu in kernels/<op>_cpu.py. ImportError if none."""
    return _module(kernel_op.removesuffix("_triton"))


def _entry(op: str, key: int | str | tuple[int | str, str]) -> KernelEntry:
    module = kernel_module(f"{op}_triton")
    kernel = getattr(torch.ops.graphspec, f"{op}_triton").default
    return KernelEntry(op, key, kernel, dict(module.CONFIGS[key]), KERNELS[op])


def _cpu_entry(op: str) -> KernelEntry:
    module = kernel_module(f"{op}_cpu")
    kernel = getattr(torch.ops.graphspec, f"{op}_cpu").default
    return KernelEntry(op, CPU, kernel, dict(module.CONFIGS[CPU]), CPU_KERNELS[op])


def entries() -> Iterator[KernelEntry]:
    """Every (op, SM key) row of the Triton table, "default" rows included."""
    for op in KERNELS:
        for key in _module(op).CONFIGS:
            yield _entry(op, key)


def cpu_entries() -> Iterator[KernelEntry]:
    """Every row of the CPU table."""
    for op in CPU_KERNELS:
        yield _cpu_entry(op)


def resolve(
    op: str, sm: int | str | None, node: fx.Node | None = None, numerics: str = "default"
) -> KernelEntry | None:
    """The kernel for `op` on `sm`: the exact SM's config (its row for the node's shape class, if any),
    else the "default" config; None (keep the reference) when the op has no kernel, there is no GPU
    (sm None), the SM is older than MIN_SM, or `node` is given and its shapes/dtypes do not fit the
    kernel. sm "cpu" looks in the CPU table. numerics="invariant": the op's "invariant" config row, else
    its SM's row if ROW_INVARIANT, else None; by default CUBLAS_BY_DEFAULT ops are lowered only where the
    node's shape class has a row of its own."""
    if sm == CPU:
        entry = _cpu_entry(op) if op in CPU_KERNELS else None
        return None if entry is None or (node is not None and not entry.fits(node)) else entry
    if op not in KERNELS or sm is None or sm < MIN_SM:
        return None
    configs = _module(op).CONFIGS
    key = sm if sm in configs else "default"
    if numerics == INVARIANT:
        if INVARIANT in configs:
            key = INVARIANT
        elif op not in ROW_INVARIANT:
            return None
    elif node is not None:
        key = _shape_key(op, key, node)
        if op in CUBLAS_BY_DEFAULT and not isinstance(key, tuple):
            return None
    elif op in CUBLAS_BY_DEFAULT:
        return None
    if node is not None and _runs_gemv(op, key) and not reads_model_weight(node.args[GEMV_WEIGHT_ARGUMENT[op]]):
        return None
    entry = _entry(op, key)
    if node is not None and not entry.fits(node):
        return None
    return entry


# The GEMV kernels (kernels/gemv.py's one-row kernel, kernels/scaled_silu_mul_linear.py) ask for their first weight
# tile before they wait for the kernels before them (programmatic dependent launch, kernels/common.pdl_launch): a
# weight no kernel of a program writes. So they take a product only where that operand (its position here) is a
# model weight; cuBLAS keeps any other.
GEMV_WEIGHT_ARGUMENT = {"mm": 1, "addmm": 2, "addmm_in_place": 2, "scaled_silu_mul_linear": 1}


def _runs_gemv(op: str, key: int | str | tuple[int | str, str]) -> bool:
    """Whether the row `key` of `op` runs a GEMV kernel: the shape-class rows of mm/addmm, every row of the ops
    that have nothing else."""
    if op in CUBLAS_BY_DEFAULT:
        return isinstance(key, tuple)
    return op in GEMV_WEIGHT_ARGUMENT


def reads_model_weight(arg: object) -> bool:
    """Whether a node argument is (a view of) a model weight: a parameter or buffer input of the program
    (meta["gs_input"] target.* / draft.*: graphspec.input_names) or a constant (get_attr), never a value a kernel
    computes."""
    while isinstance(arg, fx.Node) and arg.op == "call_function" and arg.target in VIEW_OPS:  # weight.t(), a reshape
        arg = arg.args[0]
    if not isinstance(arg, fx.Node):
        return False
    return arg.op == "get_attr" or (arg.op == "placeholder" and is_weight_input(str(arg.meta.get("gs_input", ""))))


def _shape_key(op: str, key: int | str, node: fx.Node) -> int | str | tuple[int | str, str]:
    """(key, shape class) when the op's kernel names a class for this node's shapes and CONFIGS has a row
    for it, else key."""
    module = _module(op)
    shape_class = getattr(module, "shape_class", None)
    if shape_class is None:
        return key
    args = []
    for arg in node.args:
        value = arg.meta.get("val") if isinstance(arg, fx.Node) else arg
        if isinstance(arg, fx.Node) and not isinstance(value, torch.Tensor):
            return key  # no fake values: the row for the SM
        args.append(value)
    return shape_row(op, key, shape_class(*args))


def shape_row(op: str, key: int | str, name: str | None) -> int | str | tuple[int | str, str]:
    """The CONFIGS key for shape class `name` of `op` under row `key`: (key, name) where the table has
    that row, else key."""
    return (key, name) if name is not None and (key, name) in _module(op).CONFIGS else key
