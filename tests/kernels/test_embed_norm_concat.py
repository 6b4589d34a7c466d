"""embed_norm_concat kernel vs graphspec.ops.embed_norm_concat_reference (the embedding, rms_norm of each half
and the cat it replaces), and bit for bit what the separate embedding and rms_norm kernels give (a step
lowered either way computes the same)."""

from __future__ import annotations

import pytest
import torch
from graphspec.kernels import embed_norm_concat as kernel
from graphspec.kernels import rms_norm
from torch.library import opcheck

from tests.kernels.helpers import DEVICE, TOLERANCE, assert_rounding_equal, generator, poison_allocator, rel_error

VOCAB = 50


def make_inputs(shape: tuple[int, ...], dim: int, dtype: torch.dtype, seed: int) -> tuple[torch.Tensor, ...]:
    """(tokens [shape], embed_weight [VOCAB, dim], embed_norm [dim], hidden [*shape, dim], hidden_norm [dim])."""
    g = generator(seed)
    tokens = torch.randint(0, VOCAB, shape, generator=g).to(DEVICE)
    embed_weight = torch.randn(VOCAB, dim, generator=g).to(DEVICE, dtype)
    hidden = (torch.randn(*shape, dim, generator=g) * 3).to(DEVICE, dtype)
    embed_norm, hidden_norm = ((1 + 0.1 * torch.randn(dim, generator=g)).to(DEVICE, dtype) for _ in range(2))
    return tokens, embed_weight, embed_norm, hidden, hidden_norm


SHAPES = [((2, 5), 64), ((16, 1), 128), ((3,), 96), ((1, 4), 256)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize(("shape", "dim"), SHAPES)
def test_embed_norm_concat_matches_reference(dtype: torch.dtype, shape: tuple[int, ...], dim: int) -> None:
    inputs = make_inputs(shape, dim, dtype, seed=dim + len(shape))
    poison_allocator()
    out = kernel.embed_norm_concat(*inputs, 1e-6)
    reference = kernel.embed_norm_concat_reference(*inputs, 1e-6)
    assert out.shape == (*shape, 2 * dim) and out.dtype == dtype and out.is_contiguous()
    # Not bit for bit in 16 bits: the mean of squares is summed in another order than torch's (one fp32 ulp
    # can move a 16-bit rounding), as rms_norm_kernel's is; the next test pins the bits to that kernel's.
    assert rel_error(out, reference) < TOLERANCE[dtype]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize(("shape", "dim"), SHAPES)
def test_each_half_is_the_rms_norm_kernels_bits(dtype: torch.dtype, shape: tuple[int, ...], dim: int) -> None:
    """Fusing changes no bit: each half equals rms_norm_kernel on the gathered embedding / on the hidden rows
    (so a step computes the same whether its drafter's input is fused or not)."""
    tokens, embed_weight, embed_norm, hidden, hidden_norm = make_inputs(shape, dim, dtype, seed=dim + len(shape))
    out = kernel.embed_norm_concat(tokens, embed_weight, embed_norm, hidden, hidden_norm, 1e-5)
    assert torch.equal(out[..., :dim], rms_norm.rms_norm(embed_weight[tokens], embed_norm, 1e-5))
    assert torch.equal(out[..., dim:], rms_norm.rms_norm(hidden, hidden_norm, 1e-5))


def test_several_rows_per_tile_strided_hidden_and_int32_tokens() -> None:
    """A tile of 4 rows with a partial last tile (7 rows), hidden rows that are a strided view, int32 ids."""
    tokens, embed_weight, embed_norm, hidden, hidden_norm = make_inputs((7,), 64, torch.bfloat16, seed=4)
    wide = torch.randn(7, 3 * 64, generator=generator(5)).to(DEVICE, torch.bfloat16)
    hidden = wide[:, 64:128]  # rows 192 elements apart
    out = torch.ops.graphspec.embed_norm_concat_triton(
        tokens.int(), embed_weight, embed_norm, hidden, hidden_norm, 1e-5, 256, 1
    )
    expected = (rms_norm.rms_norm(embed_weight[tokens], embed_norm, 1e-5), rms_norm.rms_norm(hidden, hidden_norm, 1e-5))
    assert torch.equal(out, torch.cat(expected, dim=-1))


def test_token_outside_the_table_reads_nothing() -> None:
    """An out-of-range id gives a zero first half (the norm of a zero row), never a read past the table."""
    tokens, embed_weight, embed_norm, hidden, hidden_norm = make_inputs((3,), 64, torch.float32, seed=6)
    tokens = torch.tensor([1, VOCAB, -1], device=DEVICE)
    out = kernel.embed_norm_concat(tokens, embed_weight, embed_norm, hidden, hidden_norm, 1e-5)
    assert torch.equal(out[1:, :64], torch.zeros(2, 64, device=DEVICE))
    assert torch.equal(out[:, 64:], rms_norm.rms_norm(hidden, hidden_norm, 1e-5))


def test_no_rows() -> None:
    tokens, embed_weight, embed_norm, hidden, hidden_norm = make_inputs((0,), 64, torch.float32, seed=7)
    assert kernel.embed_norm_concat(tokens, embed_weight, embed_norm, hidden, hidden_norm, 1e-5).shape == (0, 128)


def test_op_registration() -> None:
    inputs = make_inputs((2, 3), 64, torch.bfloat16, seed=8)
    config = tuple(kernel.CONFIGS["default"].values())
    opcheck(torch.ops.graphspec.embed_norm_concat_triton.default, (*inputs, 1e-5, *config))


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [1, 16, 80])
def test_embed_norm_concat_real_shapes_gpu(rows: int) -> None:
    """An 8B-class hidden size (4096): a draft's rows (B) and a catch-up's (B x 5), each config row."""
    inputs = make_inputs((rows,), 4096, torch.bfloat16, seed=rows)
    for config in (kernel.CONFIGS[90], kernel.CONFIGS[80]):
        out = kernel.embed_norm_concat(*inputs, 1e-5, **config)
        assert_rounding_equal(out, kernel.embed_norm_concat_reference(*inputs, 1e-5))
