"""The CPU table's norm, SwiGLU, argmax and rope table ops (kernels/rms_norm_cpu.py, add_rms_norm_cpu.py,
embed_norm_concat_cpu.py, silu_mul_cpu.py, scaled_silu_mul_cpu.py, argmax_cpu.py, rope_tables_cpu.py): the
reference's arithmetic, so the same bits as the reference op."""

from __future__ import annotations

import pytest
import torch
from graphspec.kernels import (
    add_rms_norm_cpu,
    argmax_cpu,
    embed_norm_concat_cpu,
    rms_norm_cpu,
    rope_tables_cpu,
    scaled_silu_mul_cpu,
    silu_mul_cpu,
)

from graphspec import ops
from tests.kernels.helpers import bits, generator


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cpu_reference_ops_equal_the_reference_ops(dtype: torch.dtype) -> None:
    g = generator(0)
    x, residual = (torch.randn(2, 3, 64, generator=g).to(dtype) for _ in range(2))
    weight = (1 + 0.1 * torch.randn(64, generator=g)).to(dtype)
    gate_up = torch.randn(2, 3, 96, generator=g).to(dtype)[..., 8:]  # a column slice, strided rows
    tokens, table = torch.randint(0, 10, (2, 3), generator=g), torch.randn(10, 64, generator=g).to(dtype)
    pair = (tokens, table, weight, x, residual[0, 0], 1e-5)  # the hidden norm's weight: any [64] row
    ids = torch.randperm(1000, generator=g)[:64]  # a token map's ids for x's 64 columns
    freq = torch.rand(16, generator=g)  # a rope's inverse frequencies (positions: the tokens)
    pairs = [
        (rms_norm_cpu.rms_norm_cpu(x, weight, 1e-5), ops.rms_norm(x, weight, 1e-5)),
        *zip(
            add_rms_norm_cpu.add_rms_norm_cpu(x, residual, weight, 1e-5),
            ops.add_rms_norm(x, residual, weight, 1e-5),
            strict=True,
        ),
        (embed_norm_concat_cpu.embed_norm_concat_cpu(*pair), ops.embed_norm_concat(*pair)),
        (silu_mul_cpu.silu_mul_cpu(gate_up), ops.silu_mul(gate_up)),
        (scaled_silu_mul_cpu.scaled_silu_mul_cpu(gate_up, x, 1e-5), ops.scaled_silu_mul(gate_up, x, 1e-5)),
        (argmax_cpu.argmax_cpu(x), ops.argmax(x)),
        (argmax_cpu.argmax_cpu(x, ids), ops.argmax(x, ids)),
        *zip(rope_tables_cpu.rope_tables_cpu(tokens, freq, 1.0), ops.rope_tables(tokens, freq, 1.0), strict=True),
        *zip(rope_tables_cpu.rope_tables_cpu(tokens, freq, 0.5), ops.rope_tables(tokens, freq, 0.5), strict=True),
    ]
    for got, expected in pairs:
        assert got.shape == expected.shape and got.dtype == expected.dtype and got.is_contiguous()
        if got.is_floating_point():
            got, expected = bits(got), bits(expected)
        assert torch.equal(got, expected)
