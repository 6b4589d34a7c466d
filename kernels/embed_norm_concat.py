"""graphspec::embed_norm_concat as one Triton kernel: each program gathers its rows' token embeddings, normalizes
them and the rows' hidden states (rms_norm's arithmetic: kernels/rms_norm.py's inverse_rms and scale_rows) and
writes both halves of the [rows, 2H] output. The input of every MTP layer and EAGLE-3 midlayer call: four
launches (embedding, two norms, cat) of a few microseconds each became one.

Token ids are in range by construction in a step (kernels/embedding.py says why); one outside the table is not
read and its half of the row comes out 0 (the norm of a zero row).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from graphspec.kernels.common import cdiv, check_config_table, check_device
from graphspec.kernels.rms_norm import inverse_rms, scale_rows, tile_rows
from torch import Tensor

from graphspec import library
from graphspec.ops import embed_norm_concat_reference

__all__ = ["CONFIGS", "embed_norm_concat", "embed_norm_concat_reference", "embed_norm_concat_triton"]

# tile_elems: elements of one half per program (rows per tile = tile_elems // padded H, at least 1), as rms_norm's.
CONFIGS: dict[int | str, dict[str, int]] = {
    80: {"tile_elems": 4096, "num_warps": 8},
    90: {"tile_elems": 4096, "num_warps": 4},
    "default": {"tile_elems": 4096, "num_warps": 4},
}
CONFIG_FIELDS = check_config_table(CONFIGS)
MAX_DIM = 65536  # widest H held in registers by one tile (two halves of it)


@triton.jit
def embed_norm_concat_kernel(
    tokens_ptr,
    embed_ptr,
    embed_norm_ptr,
    hidden_ptr,
    hidden_norm_ptr,
    out_ptr,
    rows,
    vocab,
    dim,
    eps,
    stride_hr,
    stride_hd,
    BLOCK_R: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    col = tl.arange(0, BLOCK_D)
    col_ok = col < dim
    row_ok = row < rows
    mask = row_ok[:, None] & col_ok[None, :]
    # Every load is issued before either reduction (rms_norm_kernel says why the weights come first).
    embed_weight = tl.load(embed_norm_ptr + col, mask=col_ok, other=0.0).to(tl.float32)
    hidden_weight = tl.load(hidden_norm_ptr + col, mask=col_ok, other=0.0).to(tl.float32)
    token = tl.load(tokens_ptr + row, mask=row_ok, other=0).to(tl.int64)
    in_table = mask & ((token >= 0) & (token < vocab))[:, None]
    embedded = tl.load(embed_ptr + token[:, None] * dim + col[None, :], mask=in_table, other=0.0).to(tl.float32)
    hidden_at = hidden_ptr + row[:, None] * stride_hr + col[None, :] * stride_hd
    hidden = tl.load(hidden_at, mask=mask, other=0.0).to(tl.float32)
    dtype = out_ptr.dtype.element_ty
    first = scale_rows(embedded, inverse_rms(embedded, dim, eps), embed_weight[None, :], dtype)
    second = scale_rows(hidden, inverse_rms(hidden, dim, eps), hidden_weight[None, :], dtype)
    out_at = out_ptr + row[:, None] * (2 * dim) + col[None, :]
    tl.store(out_at, first.to(dtype), mask=mask)
    tl.store(out_at + dim, second.to(dtype), mask=mask)


def embed_norm_concat(
    tokens: Tensor,
    embed_weight: Tensor,
    embed_norm: Tensor,
    hidden: Tensor,
    hidden_norm: Tensor,
    eps: float,
    tile_elems: int = CONFIGS["default"]["tile_elems"],
    num_warps: int = CONFIGS["default"]["num_warps"],
) -> Tensor:
    """[rms_norm(embed_weight[tokens], embed_norm), rms_norm(hidden, hidden_norm)] along the last dim: tokens
    [...] integers, embed_weight [V, H] contiguous, hidden [..., H] (tokens' shape) -> a new [..., 2H]."""
    check_device(tokens, embed_weight, embed_norm, hidden, hidden_norm)
    dim = hidden.shape[-1]
    out = hidden.new_empty((*hidden.shape[:-1], 2 * dim))
    flat_hidden = hidden.reshape(-1, dim)  # a view when the leading dims collapse, else one copy
    rows = flat_hidden.shape[0]
    if rows == 0:
        return out
    block_r, block_d = tile_rows(dim, tile_elems)
    embed_norm_concat_kernel[(cdiv(rows, block_r),)](
        tokens.reshape(-1), embed_weight.contiguous(), embed_norm.contiguous(), flat_hidden,
        hidden_norm.contiguous(), out, rows, embed_weight.shape[0], dim, eps,
        flat_hidden.stride(0), flat_hidden.stride(1),
        BLOCK_R=block_r, BLOCK_D=block_d, num_warps=num_warps,
    )  # fmt: skip
    return out


@library.op("graphspec::embed_norm_concat_triton", mutates_args=())
def embed_norm_concat_triton(
    tokens: Tensor,
    embed_weight: Tensor,
    embed_norm: Tensor,
    hidden: Tensor,
    hidden_norm: Tensor,
    eps: float,
    tile_elems: int,
    num_warps: int,
) -> Tensor:
    """graphspec::embed_norm_concat lowered to embed_norm_concat_kernel; the trailing ints are CONFIG_FIELDS."""
    return embed_norm_concat(tokens, embed_weight, embed_norm, hidden, hidden_norm, eps, tile_elems, num_warps)


@torch.library.register_fake("graphspec::embed_norm_concat_triton")
def _(tokens, embed_weight, embed_norm, hidden, hidden_norm, eps, tile_elems, num_warps):
    return hidden.new_empty((*hidden.shape[:-1], 2 * hidden.shape[-1]))
