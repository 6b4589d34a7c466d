"""graphspec::argmax as Triton kernels: the greedy token of each row, the first index of its maximum.

Semantics are graphspec.ops.argmax (torch.argmax over the last dim), except that NaN logits are not
special-cased (torch treats NaN as the maximum), as in verify_greedy. The draft proposes its tokens
with this op: at batch 1 torch's reduction of the one 128k-entry bf16 row took 35 us on an H200 (step
profile), while the vocab partials of verify_greedy_kernel spread the row over the GPU (about 3.5 us
with the merge) and a small merge kernel picks the token.
Two launches: verify_greedy_kernel (rows x splits partials), then argmax_merge_kernel, which also maps the
index through `ids` when given (a reduced vocabulary's token ids), so a mapped draft costs no gather launch.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from graphspec.kernels import verify_greedy
from graphspec.kernels.common import cdiv, check_config_table, check_device, next_power_of_2
from graphspec.kernels.verify_greedy import merge_partials, vocab_partials
from torch import Tensor

from graphspec import library
from graphspec.ops import argmax as argmax_reference

__all__ = ["CONFIGS", "argmax", "argmax_reference", "argmax_triton"]

# verify_greedy's tuned scan config (its kernel does the scan: block_v, num_warps, max_splits), plus
# rows_per_program: rows each merge program finishes.
CONFIGS: dict[int | str, dict[str, int]] = {
    sm: {**config, "rows_per_program": 16} for sm, config in verify_greedy.CONFIGS.items()
}
CONFIG_FIELDS = check_config_table(CONFIGS)


@triton.jit
def argmax_merge_kernel(
    part_max_ptr,
    part_index_ptr,
    ids_ptr,  # [V] int64 token ids of the columns (HAS_IDS), else unused
    out_ptr,
    rows,
    num_splits,
    HAS_IDS: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_S: tl.constexpr,
):
    row = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)  # rows past `rows` are padding, masked
    split = tl.arange(0, BLOCK_S)  # splits past num_splits are padding, masked
    row_ok = row < rows
    part = row[:, None] * num_splits + split[None, :]  # [BLOCK_R, BLOCK_S] partial index
    token = merge_partials(part_max_ptr, part_index_ptr, part, row_ok[:, None] & (split < num_splits)[None, :])
    token = token.to(tl.int64)
    if HAS_IDS:
        token = tl.load(ids_ptr + token, mask=row_ok, other=0)
    tl.store(out_ptr + row, token, mask=row_ok)


def argmax(
    logits: Tensor,
    ids: Tensor | None = None,
    block_v: int = CONFIGS["default"]["block_v"],
    num_warps: int = CONFIGS["default"]["num_warps"],
    max_splits: int = CONFIGS["default"]["max_splits"],
    rows_per_program: int = CONFIGS["default"]["rows_per_program"],
) -> Tensor:
    """First index of the maximum of logits [..., V] (any strides) over V, or ids [V] (int64) at that
    index: a new int64 [...]."""
    check_device(*(tensor for tensor in (logits, ids) if tensor is not None))
    *lead, vocab = logits.shape
    if ids is not None and (ids.dtype != torch.int64 or tuple(ids.shape) != (vocab,)):
        raise ValueError(f"argmax kernel: ids must be int64 [{vocab}], got {ids.dtype} {list(ids.shape)}")
    out = torch.empty(lead, dtype=torch.int64, device=logits.device)
    if out.numel() == 0:
        return out
    if vocab == 0:
        raise ValueError("argmax kernel: an empty last dim has no maximum")
    rows = logits.reshape(-1, 1, vocab)  # a view when the leading dims collapse, else a copy
    part_max, part_index, splits = vocab_partials(rows, block_v, num_warps, max_splits)
    block_r = next_power_of_2(rows_per_program)
    argmax_merge_kernel[(cdiv(rows.shape[0], block_r),)](
        part_max, part_index, out if ids is None else ids.contiguous(), out, rows.shape[0], splits,
        HAS_IDS=ids is not None, BLOCK_R=block_r, BLOCK_S=next_power_of_2(splits), num_warps=1,
    )  # fmt: skip
    return out


@library.op("graphspec::argmax_triton", mutates_args=())
def argmax_triton(
    logits: Tensor, ids: Tensor | None, block_v: int, num_warps: int, max_splits: int, rows_per_program: int
) -> Tensor:
    """graphspec::argmax lowered to verify_greedy_kernel + argmax_merge_kernel; trailing ints: CONFIG_FIELDS."""
    return argmax(logits, ids, block_v, num_warps, max_splits, rows_per_program)


@torch.library.register_fake("graphspec::argmax_triton")
def _(logits, ids, block_v, num_warps, max_splits, rows_per_program):
    return logits.new_empty(logits.shape[:-1], dtype=torch.int64)
