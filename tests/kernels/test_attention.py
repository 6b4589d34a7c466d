"""attention kernel vs graphspec.ops.attention_reference (CPU: interpreter, small shapes; GPU: real shapes)."""

from __future__ import annotations

import pytest
import torch
from graphspec.kernels import attention as kernel
from graphspec.kernels.common import config_for, sm_count

from tests.kernels.helpers import DEVICE, TOLERANCE, poison_allocator, rel_error


def make_case(
    batch: int,
    q_heads: int,
    kv_heads: int,
    t: int,
    seq: int,
    head_dim: int,
    dtype: torch.dtype,
    seed: int,
    layers: int = 2,
    device: torch.device = DEVICE,
):
    """Random q [B, Hq, T, D] (a transposed view, as the decoder passes it), cache, distinct slots and
    start positions anywhere the T queries fit, one row at each extreme."""
    g = torch.Generator(device).manual_seed(seed)  # on the device: real-shape caches are gigabytes
    slots = batch + 2
    cache = torch.randn(layers, 2, slots, kv_heads, seq, head_dim, generator=g, device=device).to(dtype)
    q = torch.randn(batch, t, q_heads, head_dim, generator=g, device=device).to(dtype).transpose(1, 2)
    slot_ids = torch.randperm(slots, generator=g, device=device)[:batch]
    start_pos = torch.randint(0, seq - t + 1, (batch,), generator=g, device=device)
    start_pos[0] = 0  # only key 0 visible to the first query
    start_pos[-1] = seq - t  # the window ends at the last cache position
    return q, cache, slot_ids, start_pos


def check(q, cache, layer, slot_ids, start_pos, scale, out) -> None:
    exact = kernel.attention_reference(q.float(), cache.float(), layer, slot_ids, start_pos, scale)
    reference = kernel.attention_reference(q, cache, layer, slot_ids, start_pos, scale)
    batch, heads, t, head_dim = q.shape
    assert out.shape == (batch, t, heads, head_dim) and out.dtype == q.dtype and out.is_contiguous()
    assert torch.isfinite(out).all(), "an output element is NaN/inf (unwritten or bad masking)"
    error = rel_error(out, exact)
    assert error < TOLERANCE[q.dtype], error
    # 16-bit: no worse than the reference's own rounding (P is rounded to bf16 for the second dot).
    assert error <= 2 * rel_error(reference, exact) + 1e-6, (error, rel_error(reference, exact))


# Each dtype meets every GQA ratio (Hq / Hkv) and both head dims (a full cross product is 2x slower
# under the interpreter and adds no index path).
CASES = [
    (torch.float32, 1, 64),
    (torch.float32, 2, 128),
    (torch.float32, 4, 64),
    (torch.bfloat16, 1, 128),
    (torch.bfloat16, 2, 64),
    (torch.bfloat16, 4, 128),
    (torch.bfloat16, 4, 256),  # the hybrid families' gated full attention (Qwen3.5, Qwen3-Next)
]


@pytest.mark.parametrize(("dtype", "group", "head_dim"), CASES)
def test_attention_matches_reference(dtype: torch.dtype, group: int, head_dim: int) -> None:
    kv_heads = 2
    q, cache, slot_ids, start_pos = make_case(3, kv_heads * group, kv_heads, 3, 40, head_dim, dtype, seed=group)
    scale = head_dim**-0.5
    poison_allocator()
    out = kernel.attention(q, cache, 1, slot_ids, start_pos, scale)
    check(q, cache, 1, slot_ids, start_pos, scale, out)


@pytest.mark.parametrize("programs_per_sm", [0, 4, 64])
def test_attention_split_counts_agree(programs_per_sm: int) -> None:
    """One split (direct write), a few, and one per key block (row 0 sees 2 keys: its other splits
    are empty) all agree."""
    q, cache, slot_ids, start_pos = make_case(2, 4, 2, 2, 70, 64, torch.float32, seed=7)
    splits = kernel.num_splits(2, 2, 1, 70, 16, programs_per_sm, sm_count(DEVICE))
    assert splits == {0: 1, 64: 5}.get(programs_per_sm, splits) and (splits > 1) == (programs_per_sm > 0)
    out = kernel.attention(q, cache, 0, slot_ids, start_pos, 0.125, block_n=16, programs_per_sm=programs_per_sm)
    check(q, cache, 0, slot_ids, start_pos, 0.125, out)


@pytest.mark.parametrize(
    ("splits", "head_dim", "fixed", "launch"),
    [(16, 128, False, (16, 1)), (2, 64, False, (16, 1)), (20, 64, False, (32, 1)), (33, 128, False, (64, 2)),
     (33, 64, False, (64, 2)), (33, 256, False, (64, 4)), (128, 128, False, (64, 2)), (33, 128, True, (16, 1))],
)  # fmt: skip
def test_reduce_launch_takes_every_split_in_one_chunk_where_they_fit(
    splits: int, head_dim: int, fixed: bool, launch: tuple[int, int]
) -> None:
    """Up to MAX_REDUCE_CHUNK splits are summed in one chunk (one L2 round trip) with a warp per 32 rows and per
    4096 values; fixed-size splits (the invariant row) keep REDUCE_CHUNK, whatever their count."""
    assert kernel.reduce_launch(splits, head_dim, fixed_splits=fixed) == launch


@pytest.mark.parametrize("seq", [320, 608, 1600])  # 20, 38 and 100 splits of 16 keys: chunks of 32, 64, 64 twice
def test_attention_long_split_counts_agree(seq: int) -> None:
    """Many splits (a batch-1 row at a long cache) combine to the reference's result in one chunk or several."""
    q, cache, slot_ids, start_pos = make_case(1, 4, 2, 2, seq, 64, torch.float32, seed=seq, layers=1)
    start_pos[:] = seq - 2 - seq // 7  # the last splits are empty
    splits = kernel.num_splits(1, 2, 1, seq, 16, 128, sm_count(DEVICE))
    assert splits == seq // 16
    out = kernel.attention(q, cache, 0, slot_ids, start_pos, 0.125, block_n=16, programs_per_sm=128)
    check(q, cache, 0, slot_ids, start_pos, 0.125, out)


def test_attention_empty_splits_leave_no_garbage(monkeypatch: pytest.MonkeyPatch) -> None:
    """At a short context most splits start past a row's keys, and their programs return early; what
    they leave must still combine to nothing: with the partial buffers allocated full of NaN, the result
    is the reference's."""
    empty = torch.empty

    def nan_empty(*args, **kwargs) -> torch.Tensor:
        tensor = empty(*args, **kwargs)
        return tensor.fill_(float("nan")) if tensor.is_floating_point() else tensor

    q, cache, slot_ids, start_pos = make_case(2, 4, 2, 2, 96, 64, torch.float32, seed=17)
    start_pos[:] = torch.tensor([3, 30])  # 5 and 32 keys of 96: 1 and 2 of the 6 splits hold keys
    assert kernel.num_splits(2, 2, 1, 96, 16, 64, sm_count(DEVICE)) == 6
    monkeypatch.setattr(torch, "empty", nan_empty)
    out = kernel.attention(q, cache, 0, slot_ids, start_pos, 0.125, block_n=16, programs_per_sm=64)
    monkeypatch.undo()
    check(q, cache, 0, slot_ids, start_pos, 0.125, out)


class LaunchSpy:
    """Stands in for a Triton kernel: records each launch's grid and BLOCK_N, then launches the real one."""

    def __init__(self, real) -> None:
        self.real, self.launches = real, []

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.launches.append((tuple(grid), kwargs["BLOCK_N"]))
            return self.real[grid](*args, **kwargs)

        return launch


class NoLaunch:
    def __getitem__(self, grid):
        raise AssertionError(f"launched with grid {grid}: this case has no reduce")


def test_attention_one_wave_of_tiles_takes_one_unsplit_program_each(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the batch's tiles make one wave of more than WAVE_FILL of the SMs (2 tiles on the interpreter's
    2 SMs), wave_block_n runs one program per tile over all its keys, wave_block_n keys a step: no split, no
    reduce, whatever programs_per_sm would ask; the result is the reference's."""
    q, cache, slot_ids, start_pos = make_case(2, 4, 1, 3, 100, 64, torch.float32, seed=23)  # 2 rows x 1 kv head
    spy = LaunchSpy(kernel.attention_kernel)
    monkeypatch.setattr(kernel, "attention_kernel", spy)
    monkeypatch.setattr(kernel, "attention_reduce_kernel", NoLaunch())
    monkeypatch.setattr(kernel, "sm_count", lambda device: 2)
    out = kernel.attention(q, cache, 0, slot_ids, start_pos, 0.125, block_n=16, programs_per_sm=64, wave_block_n=32)
    assert spy.launches == [((1, 2, 1), 32)]
    check(q, cache, 0, slot_ids, start_pos, 0.125, out)


@pytest.mark.parametrize(
    ("batch", "split_keys"),
    [(1, 0), (3, 0), (2, 32)],  # one tile (half the SMs: not more), three (past one wave), fixed splits
)
def test_attention_wave_block_n_leaves_other_launches_split(
    monkeypatch: pytest.MonkeyPatch, batch: int, split_keys: int
) -> None:
    """Tile counts outside (WAVE_FILL * SMs, SMs], and fixed split sizes (the invariant row), split as
    before, with block_n."""
    q, cache, slot_ids, start_pos = make_case(batch, 4, 1, 2, 96, 64, torch.float32, seed=29 + batch)
    spy = LaunchSpy(kernel.attention_kernel)
    monkeypatch.setattr(kernel, "attention_kernel", spy)
    monkeypatch.setattr(kernel, "sm_count", lambda device: 2)
    config = {"block_n": 16, "programs_per_sm": 64, "split_keys": split_keys, "wave_block_n": 32}
    out = kernel.attention(q, cache, 0, slot_ids, start_pos, 0.125, **config)
    splits = 96 // split_keys if split_keys else kernel.num_splits(batch, 1, 1, 96, 16, 64, 2)
    assert splits > 1 and spy.launches == [((splits, batch, 1), 16)]
    check(q, cache, 0, slot_ids, start_pos, 0.125, out)


@pytest.mark.parametrize("sm", list(kernel.CONFIGS))
def test_attention_every_table_config(sm: int | str) -> None:
    """Each SM's config from the table (block size and split target) gives the reference's result."""
    q, cache, slot_ids, start_pos = make_case(2, 8, 2, 2, 150, 128, torch.bfloat16, seed=13)
    out = kernel.attention(q, cache, 1, slot_ids, start_pos, 0.09, **kernel.CONFIGS[sm])
    check(q, cache, 1, slot_ids, start_pos, 0.09, out)


def test_attention_ignores_cache_past_each_row() -> None:
    """Positions beyond start_pos + T hold garbage (NaN) in a real cache; no query may see them."""
    q, cache, slot_ids, start_pos = make_case(2, 4, 2, 3, 48, 64, torch.float32, seed=3)
    start_pos[:] = torch.tensor([5, 20])
    dirty = cache.clone()
    for row, (slot, start) in enumerate(zip(slot_ids.tolist(), start_pos.tolist(), strict=True)):
        dirty[:, :, slot, :, start + 3 :] = float("nan")
        assert row < 2
    out = kernel.attention(q, dirty, 1, slot_ids, start_pos, 0.125)
    check(q, cache, 1, slot_ids, start_pos, 0.125, out)


def test_attention_many_query_rows_take_several_tiles() -> None:
    """GROUP * T > 128 query rows per kv head: the rows are spread over two tiles (grid axis 2)."""
    q, cache, slot_ids, start_pos = make_case(1, 16, 1, 9, 24, 64, torch.float32, seed=5)
    out = kernel.attention(q, cache, 0, slot_ids, start_pos, 0.125)
    check(q, cache, 0, slot_ids, start_pos, 0.125, out)


def test_attention_op_matches_launcher() -> None:
    """The registered graphspec::attention_triton op passes its config through to the launcher."""
    q, cache, slot_ids, start_pos = make_case(2, 4, 2, 2, 32, 64, torch.float32, seed=11)
    config = kernel.CONFIGS["default"]
    out = torch.ops.graphspec.attention_triton(q, cache, 1, slot_ids, start_pos, 0.125, *config.values())
    torch.testing.assert_close(out, kernel.attention(q, cache, 1, slot_ids, start_pos, 0.125, **config))


# ---------------------------------------------------------------------------------------------------
# GPU: 8B-class heads (32 q heads, 8 kv heads, D 128), caches up to 32k tokens, batch 1-64, K 1-8.
# ---------------------------------------------------------------------------------------------------


def device_config() -> dict[str, int]:
    major, minor = torch.cuda.get_device_capability()
    return config_for(kernel.CONFIGS, major * 10 + minor)


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("batch", "seq", "k"),
    # B = 16: one wave of 8B tiles on an H200 (wave_block_n)
    [(1, 32768, 1), (1, 32768, 8), (4, 32768, 4), (16, 8192, 1), (16, 1024, 4), (64, 4096, 4), (64, 2048, 8)],
)
def test_attention_real_shapes_gpu(batch: int, seq: int, k: int) -> None:
    q, cache, slot_ids, start_pos = make_case(batch, 32, 8, k + 1, seq, 128, torch.bfloat16, seed=batch + k, layers=1)
    poison_allocator()
    out = kernel.attention(q, cache, 0, slot_ids, start_pos, 128**-0.5, **device_config())
    check(q, cache, 0, slot_ids, start_pos, 128**-0.5, out)


@pytest.mark.gpu
@pytest.mark.parametrize(("batch", "k"), [(1, 3), (8, 3)])
def test_attention_head_dim_256_gpu(batch: int, k: int) -> None:
    """Qwen3.5's gated full attention (16 query, 2 KV heads of 256), as its MTP verify runs it."""
    q, cache, slot_ids, start_pos = make_case(batch, 16, 2, k + 1, 4096, 256, torch.bfloat16, seed=batch, layers=1)
    poison_allocator()
    out = kernel.attention(q, cache, 0, slot_ids, start_pos, 256**-0.5, **device_config())
    check(q, cache, 0, slot_ids, start_pos, 256**-0.5, out)


@pytest.mark.gpu
def test_attention_cache_offsets_past_int32_gpu() -> None:
    """A 5.4 GB cache (2.7e9 elements): the slot read sits past element 2**31, so any int32 offset
    arithmetic would wrap and read the wrong memory."""
    layers, slots, kv_heads, seq, head_dim = 5, 8, 8, 32768, 128
    cache = torch.empty(layers, 2, slots, kv_heads, seq, head_dim, dtype=torch.bfloat16, device="cuda")
    cache.normal_(generator=torch.Generator("cuda").manual_seed(0))
    layer, slot_ids = 4, torch.tensor([7, 6], device="cuda")
    assert cache[layer, 0, 6].storage_offset() > 2**31
    q = torch.randn(2, 32, 5, head_dim, device="cuda", dtype=torch.bfloat16)
    start_pos = torch.tensor([seq - 5, 1000], device="cuda")
    out = kernel.attention(q, cache, layer, slot_ids, start_pos, head_dim**-0.5, **device_config())
    # The reference on a view of just that layer: same values, small temporaries.
    check(q, cache[layer : layer + 1], 0, slot_ids, start_pos, head_dim**-0.5, out)


@pytest.mark.gpu
def test_attention_replays_in_cuda_graph_gpu() -> None:
    """Capturable: no host sync or allocation outside the graph pool; a replay with new start
    positions and slots (same tensors, new contents) matches a fresh eager call."""
    q, cache, slot_ids, start_pos = make_case(2, 32, 8, 5, 4096, 128, torch.bfloat16, seed=1, layers=1)
    config = device_config()
    kernel.attention(q, cache, 0, slot_ids, start_pos, 0.088, **config)  # compile outside capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = torch.ops.graphspec.attention_triton(q, cache, 0, slot_ids, start_pos, 0.088, *config.values())
    start_pos.copy_(torch.tensor([17, 3000]))
    slot_ids.copy_(slot_ids.flip(0))
    graph.replay()
    torch.testing.assert_close(out, kernel.attention(q, cache, 0, slot_ids, start_pos, 0.088, **config))
