"""graphspec::scaled_silu_mul as a Triton kernel: silu_mul's kernel with HAS_SCALE (kernels/silu_mul.py).

The SwiGLU of a gate/up projection whose RMSNorm weight was folded into the projection's weight
(graphspec/models/fold_norms.py): each program reads its rows of the un-normalized input whole, takes their
row scale rsqrt(mean(x^2) + eps), and scales gate and up by it in fp32 before the silu; one rounding at the
end, as the reference (graphspec.ops.scaled_silu_mul_reference). The scale's sum runs in a fixed order for a
given hidden size, so a row's result does not depend on the launch (row-invariant). The config rows are
silu_mul's, but the wide "many_rows" tiles start at MANY_ROWS rows instead of a prefill chunk's 512: every
program reads its rows of x whole (H elements from L2), which narrow tiles repeat many times over at a verify's
rows (docs/results/2026-11-29-fold-norms/tiles_probe.log, H200, 8B MLP, us per launch: 80 rows 5.35 with 512
outputs per program, 4.20 with 2048, against 5.16 for the silu_mul + add_rms_norm it replaces; 1-20 rows best
at 512: 1.91 at one row against 2.89).
"""

from __future__ import annotations

import torch
from graphspec.kernels import silu_mul as silu_mul_kernel
from graphspec.kernels.common import check_config_table
from torch import Tensor

from graphspec import library
from graphspec.ops import scaled_silu_mul_reference

__all__ = ["CONFIGS", "scaled_silu_mul", "scaled_silu_mul_reference", "scaled_silu_mul_triton", "shape_class"]

CONFIGS: dict[int | str | tuple[int | str, str], dict[str, int]] = {
    key: dict(config) for key, config in silu_mul_kernel.CONFIGS.items()
}
CONFIG_FIELDS = check_config_table(CONFIGS)
MANY_ROWS = 48  # from here on the (sm, "many_rows") row (see the module doc)


def shape_class(gate_up: Tensor, *_: object) -> str | None:
    """The config row's shape class (lowering/registry.py): wide tiles from MANY_ROWS rows on."""
    return "many_rows" if silu_mul_kernel.row_count(gate_up) >= MANY_ROWS else None


def scaled_silu_mul(
    gate_up: Tensor,
    x: Tensor,
    eps: float,
    tile_elems: int = CONFIGS["default"]["tile_elems"],
    num_warps: int = CONFIGS["default"]["num_warps"],
) -> Tensor:
    """silu(r * gate) * (r * up) of gate_up [..., 2I], r = rsqrt(mean(x^2) + eps) of x [..., H]'s rows."""
    return silu_mul_kernel.silu_mul(gate_up, tile_elems, num_warps, scale_of=x, eps=eps)


@library.op("graphspec::scaled_silu_mul_triton", mutates_args=())
def scaled_silu_mul_triton(gate_up: Tensor, x: Tensor, eps: float, tile_elems: int, num_warps: int) -> Tensor:
    """graphspec::scaled_silu_mul lowered to silu_mul_kernel; the trailing ints are CONFIG_FIELDS."""
    return scaled_silu_mul(gate_up, x, eps, tile_elems, num_warps)


@torch.library.register_fake("graphspec::scaled_silu_mul_triton")
def _(gate_up, x, eps, tile_elems, num_warps):
    return gate_up.new_empty((*gate_up.shape[:-1], gate_up.shape[-1] // 2))
