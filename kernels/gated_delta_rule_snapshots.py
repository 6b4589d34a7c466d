"""graphspec::gated_delta_rule_snapshots as a Triton kernel (kernels/gated_delta_rule.py's, with
SNAPSHOTS): the verify forward's Gated DeltaNet recurrence over K+1 positions per row, storing the state
after every position (the "snapshot" rollback rule keeps the one at each row's accepted count;
graphspec/state.py).

One program per (row, value head, block of value columns): it holds that block of the head's state
[Dk, BLOCK_V] in fp32 registers, reads it once from slot slot_ids[b] of layer `layer`, and for each
position decays it, applies the delta rule with the L2-normalized key, writes the output and the
snapshot. The slot's state itself is never written (the accept region's select does that). Same
arithmetic as graphspec.ops.gated_delta_rule_scan (transformers' torch_recurrent_gated_delta_rule), in a
different summation order: fp32 results agree to ~1e-6 relative, not bit for bit.
"""

from __future__ import annotations

import torch
from graphspec.kernels.common import check_config_table, check_device
from graphspec.kernels.gated_delta_rule import MAX_HEAD_DIM, launch
from torch import Tensor

from graphspec import library
from graphspec.ops import gated_delta_rule_snapshots_reference

__all__ = ["CONFIGS", "MAX_HEAD_DIM", "gated_delta_rule_snapshots", "gated_delta_rule_snapshots_reference"]

# block_v: value columns per program. The state block [Dk, block_v] lives in registers: 128 x 32 fp32
# over 4 warps is 32 registers a thread. Untuned (no GPU timing yet).
CONFIGS: dict[int | str, dict[str, int]] = {
    80: {"block_v": 32, "num_warps": 4},
    90: {"block_v": 32, "num_warps": 4},
    "default": {"block_v": 32, "num_warps": 4},
}
CONFIG_FIELDS = check_config_table(CONFIGS)


def gated_delta_rule_snapshots(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    beta: Tensor,
    state: Tensor,
    layer: int,
    slot_ids: Tensor,
    block_v: int = CONFIGS["default"]["block_v"],
    num_warps: int = CONFIGS["default"]["num_warps"],
) -> tuple[Tensor, Tensor]:
    """(out [B, T, Hv, Dv] in q's dtype, snapshots [B, T, Hv, Dk, Dv] in the state's dtype); shapes as
    graphspec.ops.gated_delta_rule_snapshots, inputs of any strides."""
    check_device(q, k, v, g, beta, state, slot_ids)
    batch, t, _, key_dim = q.shape
    shape = (batch, t, v.shape[2], key_dim, v.shape[3])
    snapshots = torch.empty(shape, dtype=state.dtype, device=q.device)
    out = launch("gated_delta_rule_snapshots", q, k, v, g, beta, state, layer, slot_ids, None, None, snapshots,
                 block_v, num_warps)  # fmt: skip
    return out, snapshots


@library.op("graphspec::gated_delta_rule_snapshots_triton", mutates_args=())
def gated_delta_rule_snapshots_triton(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    beta: Tensor,
    state: Tensor,
    layer: int,
    slot_ids: Tensor,
    block_v: int,
    num_warps: int,
) -> tuple[Tensor, Tensor]:
    """graphspec::gated_delta_rule_snapshots lowered to gated_delta_rule_snapshots_kernel; the trailing
    ints are CONFIG_FIELDS."""
    return gated_delta_rule_snapshots(q, k, v, g, beta, state, layer, slot_ids, block_v, num_warps)


@torch.library.register_fake("graphspec::gated_delta_rule_snapshots_triton")
def _(q, k, v, g, beta, state, layer, slot_ids, block_v, num_warps):
    return v.new_empty(v.shape), state.new_empty((q.shape[0], q.shape[1], *state.shape[2:]))
