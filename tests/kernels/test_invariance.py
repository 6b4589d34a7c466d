"""numerics="invariant": each kernel the invariant step uses gives a row (a token, a query) the same bf16
bits whether it is computed alone, in a batch of 7, or as position j of a (K+1)-row verify block, with the
config rows the lowering picks for it (lowering/registry.py resolve(..., numerics="invariant") on sm 90).
That is what makes a draft equal to the target accept every token: its one-token forwards and the
target's verify forward then compute the same numbers. On the CPU this runs the kernels' own tiling and
split logic under the interpreter; on a GPU, the real tensor-core code."""

from __future__ import annotations

import pytest
import torch

from graphspec.lowering import registry
from tests.kernels.helpers import DEVICE, bits, generator

K = 4  # drafts per step: a verify block has K + 1 positions
ROW, POSITION = 3, 2  # the row of the batch of 7, and its position j in the verify block
DTYPE = torch.bfloat16


def invariant_config(op: str) -> dict[str, int]:
    entry = registry.resolve(op, 90, numerics=registry.INVARIANT)
    assert entry is not None, f"{op} has no invariant kernel"
    return dict(entry.config)


def three_ways(row: torch.Tensor, others: torch.Tensor, run) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """run() on `row` [1, ...] alone, as row ROW of a batch of 7, and as position POSITION of a verify
    block [7 * (K + 1), ...] (rows of `others` elsewhere); the output row each time."""
    batch = torch.cat([others[:ROW], row, others[ROW + 1 : 7]])
    block = others[: 7 * (K + 1)].clone()
    block[ROW * (K + 1) + POSITION] = row[0]
    return run(row)[0], run(batch)[ROW], run(block)[ROW * (K + 1) + POSITION]


def assert_same_bits(*outputs: torch.Tensor) -> None:
    first = bits(outputs[0])
    for other in outputs[1:]:
        assert torch.equal(first, bits(other)), (outputs[0].float() - other.float()).abs().max()


@pytest.mark.parametrize(("n", "k"), [(96, 1024), (300, 64)])  # split K four ways; one split, masked N tail
@pytest.mark.parametrize("bias", [False, True])
def test_mm_row_is_invariant(n: int, k: int, bias: bool) -> None:
    check_mm(n, k, bias, block_k=64)


@pytest.mark.gpu
@pytest.mark.parametrize(("n", "k"), [(4096, 4096), (6144, 4096), (4096, 14336), (3072, 2048), (128256, 4096)])
def test_mm_row_is_invariant_at_8b_and_1b_shapes(n: int, k: int) -> None:
    """The projections of the Llama-3.1-8B / 3.2-1B pair, with the sm 90 config as lowered."""
    check_mm(n, k, bias=n == 3072)


def check_mm(n: int, k: int, bias: bool, **config: int) -> None:
    from graphspec.kernels import mm

    g = generator(n + k)
    weight = (torch.randn(n, k, generator=g) * 0.02).to(DEVICE, DTYPE)
    b = torch.randn(n, generator=g).to(DEVICE, DTYPE) if bias else None
    row, others = (torch.randn(rows, k, generator=g).to(DEVICE, DTYPE) for rows in (1, 7 * (K + 1)))
    config = {**invariant_config("addmm" if bias else "mm"), **config}
    assert_same_bits(*three_ways(row, others, lambda x: mm.mm(x, weight.t(), b, **config)))


@pytest.mark.parametrize("op", ["rms_norm", "add_rms_norm"])
def test_norm_row_is_invariant(op: str) -> None:
    from graphspec.kernels import add_rms_norm, rms_norm

    g = generator(5)
    dim = 320
    weight = torch.randn(dim, generator=g).to(DEVICE, DTYPE)
    row, others = (torch.randn(rows, dim, generator=g).to(DEVICE, DTYPE) for rows in (1, 7 * (K + 1)))
    residual_row, residual_others = (torch.randn(rows, dim, generator=g).to(DEVICE, DTYPE) for rows in (1, 35))
    config = invariant_config(op)
    if op == "rms_norm":
        assert_same_bits(*three_ways(row, others, lambda x: rms_norm.rms_norm(x, weight, 1e-5, **config)))
        return
    # The residual travels with its row: pair them as one [rows, 2, dim] tensor through three_ways.
    paired_row, paired_others = torch.stack([row, residual_row], 1), torch.stack([others, residual_others], 1)
    for output in (0, 1):  # the normalized row and the new residual

        def run(pairs: torch.Tensor, output: int = output) -> torch.Tensor:
            x, residual = pairs[:, 0].contiguous(), pairs[:, 1].contiguous()
            return add_rms_norm.add_rms_norm(x, residual, weight, 1e-5, **config)[output]

        assert_same_bits(*three_ways(paired_row, paired_others, run))


def test_embed_norm_concat_row_is_invariant() -> None:
    """An MTP / EAGLE-3 input row: its token and hidden state travel together through three_ways."""
    from graphspec.kernels import embed_norm_concat

    g = generator(7)
    dim, vocab = 320, 50
    table = torch.randn(vocab, dim, generator=g).to(DEVICE, DTYPE)
    embed_norm, hidden_norm = (torch.randn(dim, generator=g).to(DEVICE, DTYPE) for _ in range(2))
    # [rows, dim + 1]: the hidden row, then its token id (exact in bf16 below 256) in the last column
    row, others = (
        torch.cat([torch.randn(rows, dim, generator=g), torch.randint(0, vocab, (rows, 1), generator=g)], 1)
        for rows in (1, 35)
    )
    config = invariant_config("embed_norm_concat")

    def run(pairs: torch.Tensor) -> torch.Tensor:
        pairs = pairs.to(DEVICE, DTYPE)
        tokens, hidden = pairs[:, -1].long(), pairs[:, :-1].contiguous()
        return embed_norm_concat.embed_norm_concat(tokens, table, embed_norm, hidden, hidden_norm, 1e-5, **config)

    assert_same_bits(*three_ways(row, others, run))


def test_silu_mul_row_is_invariant() -> None:
    from graphspec.kernels import silu_mul

    g = generator(6)
    row, others = (torch.randn(rows, 2 * 272, generator=g).to(DEVICE, DTYPE) for rows in (1, 35))
    config = invariant_config("silu_mul")
    assert_same_bits(*three_ways(row, others, lambda x: silu_mul.silu_mul(x, **config)))


def test_scaled_silu_mul_row_is_invariant() -> None:
    """The folded-norm SwiGLU (models/fold_norms.py): its row scale sums the row in a fixed order."""
    from graphspec.kernels import scaled_silu_mul

    g = generator(16)
    row, others = (torch.randn(rows, 2 * 272 + 2 * 1000, generator=g).to(DEVICE, DTYPE) for rows in (1, 35))
    config = invariant_config("scaled_silu_mul")

    def run(pairs: torch.Tensor) -> torch.Tensor:  # gate_up and the rows it projects, side by side
        return scaled_silu_mul.scaled_silu_mul(pairs[:, : 2 * 272], pairs[:, 2 * 272 :].contiguous(), 1e-5, **config)

    assert_same_bits(*three_ways(row, others, run))


def test_rope_tables_row_is_invariant() -> None:
    """A position's cos and sin rows (fp32: the rotary kernels round them to the model dtype)."""
    from graphspec.kernels import rope_tables

    g = generator(8)
    row, others = (torch.randint(0, 131072, (rows,), generator=g).to(DEVICE) for rows in (1, 35))
    freq = (1.0 / 500000.0 ** (torch.arange(0, 128, 2, dtype=torch.float32) / 128)).to(DEVICE)
    config = invariant_config("rope_tables")

    def run(pos: torch.Tensor) -> torch.Tensor:
        return torch.cat(rope_tables.rope_tables(pos, freq, 1.0, **config), -1)

    assert_same_bits(*three_ways(row, others, run))


# Attention: one query of one row at cache position p, with the same keys at positions <= p each time.
@pytest.mark.parametrize("position", [40, 511, 512, 1100])  # first split; its last key; the next; the third
def test_attention_query_is_invariant(position: int) -> None:
    """The query alone (T = 1: a draft forward), in a batch of 7 rows of other lengths, and as query j of a
    (K+1)-query verify block starting at p - j (keys past p hold other values each time: masked)."""
    check_attention(position, q_heads=4, kv_heads=2, head_dim=64, capacity=1536)  # three 512-key splits


@pytest.mark.gpu
@pytest.mark.parametrize("position", [40, 1023, 1024, 3000])
def test_attention_query_is_invariant_at_8b_heads(position: int) -> None:
    check_attention(position, q_heads=32, kv_heads=8, head_dim=128, capacity=4096)


def check_attention(position: int, q_heads: int, kv_heads: int, head_dim: int, capacity: int) -> None:
    from graphspec.kernels import attention

    g = generator(position)
    config = invariant_config("attention")
    slots = 8
    cache = torch.randn(1, 2, slots, kv_heads, capacity, head_dim, generator=g).to(DEVICE, DTYPE)
    query = torch.randn(1, q_heads, 1, head_dim, generator=g).to(DEVICE, DTYPE)
    slot = 5

    def run(q: torch.Tensor, starts: list[int], slot_ids: list[int], noise_seed: int) -> torch.Tensor:
        """Attention over a copy of the cache whose positions past `position` in our slot are re-drawn."""
        c = cache.clone()
        c[:, :, slot, :, position + 1 :] = torch.randn(
            c[:, :, slot, :, position + 1 :].shape, generator=generator(noise_seed)
        ).to(DEVICE, DTYPE)
        start_pos = torch.tensor(starts, device=DEVICE)
        scale = head_dim**-0.5
        return attention.attention(q, c, 0, torch.tensor(slot_ids, device=DEVICE), start_pos, scale, **config)

    alone = run(query, [position], [slot], 1)[0, 0]
    others = torch.randn(7, q_heads, 1, head_dim, generator=g).to(DEVICE, DTYPE)
    others[ROW] = query[0]
    starts = [17, 600, capacity - 8, position, 3, 1000, 512]
    batch = run(others, starts, [0, 1, 2, slot, 4, 6, 7], 2)[ROW, 0]
    block = torch.randn(7, q_heads, K + 1, head_dim, generator=g).to(DEVICE, DTYPE)
    block[ROW, :, POSITION] = query[0, :, 0]
    block_starts = [s - POSITION if s >= POSITION else s for s in starts]
    verify = run(block, block_starts, [0, 1, 2, slot, 4, 6, 7], 3)[ROW, POSITION]
    assert_same_bits(alone, batch, verify)


def test_attention_default_rows_are_not_what_invariant_numerics_uses() -> None:
    """The default rows split by the batch and the cache length (fast, not invariant); the invariant row
    fixes the tile and the split size."""
    from graphspec.kernels import attention

    config = invariant_config("attention")
    assert config == attention.CONFIGS[registry.INVARIANT]
    assert config["block_m"] and config["split_keys"] % config["block_n"] == 0
    assert all(attention.CONFIGS[key]["split_keys"] == 0 for key in (80, 90, "default"))
    assert config["wave_block_n"] == 0  # one unsplit program per tile where the batch fills one wave: shape-dependent


@pytest.mark.parametrize(("q_heads", "kv_heads", "head_dim"), [(4, 2, 64)])
def test_prompt_position_is_the_same_from_prefill_and_from_a_decode_forward(
    q_heads: int, kv_heads: int, head_dim: int
) -> None:
    check_prefill_against_decode(q_heads, kv_heads, head_dim)


@pytest.mark.gpu
def test_prompt_position_is_the_same_from_prefill_and_from_a_decode_forward_at_8b_heads() -> None:
    check_prefill_against_decode(32, 8, 128)


def check_prefill_against_decode(q_heads: int, kv_heads: int, head_dim: int) -> None:
    """The invariant prefill path (rotary, kv_write, then the attention kernel's invariant row: what an
    invariant prefill program runs, fuse_prefill_attention leaving the pair apart) and the step's fused
    path (rotary_kv_attention's invariant row) give the last prompt position the same output and cache
    bits, whether the step's forward holds 1 token (a draft), 2 (a draft's catch-up) or K+1 (a verify).
    A draft model's first catch-up recomputes that position, which the target has from prefill: equal
    bits are what let a draft equal to the target accept all."""
    from graphspec.kernels import attention, kv_write, rotary, rotary_kv_attention

    g = generator(11)
    t, prompt_len = K + 1, 40  # the prompt's last t positions are compared; rows of 1 and 3 tokens too
    q, k, v = (
        torch.randn(1, h, prompt_len, head_dim, generator=g).to(DEVICE, DTYPE) for h in (q_heads, kv_heads, kv_heads)
    )
    angles = torch.randn(1, prompt_len, head_dim // 2, generator=g).repeat(1, 1, 2)
    cos, sin = angles.cos().to(DEVICE, DTYPE), angles.sin().to(DEVICE, DTYPE)
    capacity = 1024
    cache = torch.zeros(1, 2, 2, kv_heads, capacity, head_dim, dtype=DTYPE, device=DEVICE)
    slot, start = torch.tensor([0], device=DEVICE), torch.tensor([0], device=DEVICE)
    prefill_cache = cache.clone()
    q_rot, k_rot = rotary.rotary(q, k, cos, sin, **invariant_config("rotary"))
    kv_write.kv_write(prefill_cache, 0, slot, start, k_rot, v, **invariant_config("kv_write"))
    prefilled = attention.attention(q_rot, prefill_cache, 0, slot, start, 0.1, **invariant_config("attention"))
    for tokens in (1, 2, t):
        first = prompt_len - tokens
        decode_cache = prefill_cache.clone()
        decode_cache[..., first:, :] = 0  # the forward writes these positions itself
        window = (slice(None), slice(None), slice(first, prompt_len))
        out = rotary_kv_attention.rotary_kv_attention(
            q[window], k[window], v[window], cos[:, first:], sin[:, first:], decode_cache, 0, slot,
            torch.tensor([first], device=DEVICE), 0.1, **invariant_config("rotary_kv_attention"),
        )  # fmt: skip
        assert_same_bits(out[0, -1], prefilled[0, -1])
        assert torch.equal(bits(decode_cache), bits(prefill_cache)), tokens
