"""kernels/gemv.py (the one-row GEMV, the few-row CUDA-core and tensor-core kernels) against the fp64 product, and
the three kernel ops that run them (mm_triton, addmm_triton and addmm_in_place_triton with their shape classes'
config rows) against aten's ops."""

from __future__ import annotations

import pytest
import torch
from graphspec.kernels import addmm, addmm_in_place, gemv, mm
from torch.library import opcheck

from tests.kernels.helpers import DEVICE, TOLERANCE, generator, poison_allocator, rel_error


def operands(n: int, k: int, dtype: torch.dtype, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x [1, K], an nn.Linear weight [N, K] and a residual [1, N] on DEVICE."""
    g = generator(seed)
    x, weight, residual = (torch.randn(*shape, generator=g).to(DEVICE, dtype) for shape in ((1, k), (n, k), (1, n)))
    return x, weight, residual


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize(
    ("n", "k", "block_k"),
    [(64, 512, 128), (40, 300, 128), (37, 256, 64), (8, 1024, 512)],
    ids=["even", "k-tail", "n-tail", "one-program"],
)
@pytest.mark.parametrize("addend", [None, "bias", "residual"])
def test_gemv_matches_fp64_product(dtype: torch.dtype, n: int, k: int, block_k: int, addend: str | None) -> None:
    """Unmasked (N and K multiples of the tile) and masked tails of K and of N, with no addend, an [N] bias
    and a [1, N] residual."""
    poison_allocator()
    x, weight, residual = operands(n, k, dtype, seed=n * k)
    add = {None: None, "bias": residual[0], "residual": residual}[addend]
    out = gemv.gemv(x, weight.t(), add, block_n=8, block_k=block_k)
    exact = x.double() @ weight.double().T + (0 if add is None else residual.double())
    assert out.shape == (1, n) and out.dtype == dtype and out.is_contiguous()
    assert rel_error(out, exact) < TOLERANCE[dtype]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [2, 3, 5, 8])
@pytest.mark.parametrize(("n", "k", "block_k"), [(64, 512, 128), (37, 300, 64)], ids=["even", "tails"])
@pytest.mark.parametrize("addend", [None, "bias", "residual", "in place"])
def test_few_rows_match_fp64_product(dtype: torch.dtype, rows: int, n: int, k: int, block_k: int, addend) -> None:
    """2 to MAX_ROWS rows (padded to a power of two inside the kernel), unmasked and with tails of N and K, with no
    addend, an [N] bias, an [M, N] residual, and written into that residual."""
    poison_allocator()
    g = generator(rows * n + k)
    x = torch.randn(rows, k, generator=g).to(DEVICE, dtype)
    weight = torch.randn(n, k, generator=g).to(DEVICE, dtype)
    residual = torch.randn(rows, n, generator=g).to(DEVICE, dtype)
    add = {None: None, "bias": residual[0], "residual": residual, "in place": residual}[addend]
    exact = x.double() @ weight.double().T + (0 if add is None else add.double())
    out = gemv.gemv(x, weight.t(), add, residual if addend == "in place" else None, block_n=8, block_k=block_k)
    assert out.shape == (rows, n) and (out is residual) == (addend == "in place")
    assert rel_error(out, exact) < TOLERANCE[dtype]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [2, 3, 5, 8])
@pytest.mark.parametrize(("n", "k", "block_k"), [(64, 512, 128), (37, 300, 64)], ids=["even", "tails"])
@pytest.mark.parametrize("addend", [None, "bias", "residual", "in place"])
def test_few_rows_dot_matches_fp64_product(dtype: torch.dtype, rows: int, n: int, k: int, block_k: int, addend) -> None:
    """The tensor-core kernel (block_m MAX_ROWS, x's rows padded to DOT_ROWS inside): 2 to MAX_ROWS rows, unmasked
    and with tails of N and K, with no addend, an [N] bias, an [M, N] residual, and written into that residual."""
    poison_allocator()
    g = generator(rows * n + k + 1)
    x = torch.randn(rows, k, generator=g).to(DEVICE, dtype)
    weight = torch.randn(n, k, generator=g).to(DEVICE, dtype)
    residual = torch.randn(rows, n, generator=g).to(DEVICE, dtype)
    add = {None: None, "bias": residual[0], "residual": residual, "in place": residual}[addend]
    exact = x.double() @ weight.double().T + (0 if add is None else add.double())
    into = residual if addend == "in place" else None
    out = gemv.gemv(x, weight.t(), add, into, block_m=gemv.MAX_ROWS, block_n=16, block_k=block_k)
    assert out.shape == (rows, n) and (out is residual) == (addend == "in place")
    assert rel_error(out, exact) < TOLERANCE[dtype]


def test_few_rows_dot_reads_strided_rows() -> None:
    """x may be a column slice of a wider tensor (a verify's q/k/v projection output read at a row stride), as the
    CUDA-core kernels take it."""
    g = generator(3)
    wide = torch.randn(5, 200, generator=g).to(DEVICE, torch.float32)
    weight = torch.randn(48, 128, generator=g).to(DEVICE, torch.float32)
    out = gemv.gemv(wide[:, 40:168], weight.t(), block_m=gemv.MAX_ROWS, block_n=16, block_k=64)
    torch.testing.assert_close(out, wide[:, 40:168] @ weight.T, rtol=1e-5, atol=1e-5)


def test_gemv_sums_in_fp32_and_rounds_once() -> None:
    """bf16 products 1 and 2^-9 sum to 1 + 2^-9, which bf16 cannot hold (it rounds to 1). Summed in fp32 with
    a -1 product, or with a residual -1 added before the one rounding, the result is 2^-9 exactly; a kernel
    that rounded the sum to bf16 before the residual (or summed in bf16) would give 0."""
    k = 1024
    x = torch.zeros(1, k, device=DEVICE, dtype=torch.bfloat16)
    x[0, :3] = torch.tensor([1.0, 2.0**-9, -1.0])
    weight = torch.zeros(8, k, device=DEVICE, dtype=torch.bfloat16)
    weight[:, :3] = 1.0
    assert (gemv.gemv(x, weight.t()).float() == 2.0**-9).all()
    weight[:, 2] = 0.0  # the product sum is now 1 + 2^-9
    assert (gemv.gemv(x, weight.t()).float() == 1.0).all()  # rounded once, at the end
    residual = torch.full((1, 8), -1.0, device=DEVICE, dtype=torch.bfloat16)
    assert (gemv.gemv(x, weight.t(), residual).float() == 2.0**-9).all()


def test_gemv_writes_into_its_addend() -> None:
    x, weight, residual = operands(48, 256, torch.bfloat16, seed=3)
    expected = gemv.gemv(x, weight.t(), residual)
    out = gemv.gemv(x, weight.t(), residual, residual)
    assert out is residual
    torch.testing.assert_close(residual, expected, rtol=0, atol=0)


@pytest.mark.parametrize(
    "case",
    [
        "nine rows",
        "weight not transposed",
        "dtypes differ",
        "addend too short",
        "addend strided",
        "addend 2 rows",
        "addend a scalar",
    ],
)
def test_gemv_refuses_what_it_does_not_take(case: str) -> None:
    x, weight, residual = operands(16, 64, torch.float32, seed=4)
    args = {
        "nine rows": (x.expand(9, -1).contiguous(), weight.t(), None),
        "weight not transposed": (x, weight.t().contiguous(), None),
        "dtypes differ": (x.to(torch.bfloat16), weight.t(), None),
        "addend too short": (x, weight.t(), residual[:, :8]),
        "addend strided": (x, weight.t(), torch.randn(16, 2, device=DEVICE)[:, 0]),
        "addend 2 rows": (x, weight[:, :8].t(), residual.view(2, 8)),
        "addend a scalar": (x, weight[:1].t(), residual[0, 0]),
    }[case]
    assert not gemv.fits(*args)
    with pytest.raises(ValueError, match="gemv kernel"):
        gemv.gemv(*args)


def test_shape_class_names_where_the_gemvs_beat_cublas() -> None:
    """One row: "one_row" at any width, "one_row_long_k" from K = 4N; two rows: "two_rows" up to N = 2K (q/k/v, o,
    down) and TWO_ROWS_MAX_N, else "few_rows" ("few_rows_wide" from N = 4K: gate/up, lm_head), as at 3 to
    DOT_MAX_ROWS rows; None for more rows and where gemv does not fit (a weight that is not a transposed nn.Linear
    weight)."""
    x = torch.randn(gemv.MAX_ROWS + 1, 64)
    for n, one, two in (
        (8, "one_row_long_k", "two_rows"),
        (16, "one_row_long_k", "two_rows"),
        (17, "one_row", "two_rows"),
        (128, "one_row", "two_rows"),
        (129, "one_row", "few_rows"),
        (255, "one_row", "few_rows"),
        (256, "one_row", "few_rows_wide"),
    ):
        weight = torch.randn(n, 64)
        assert gemv.shape_class(x[:1], weight.t()) == one
        assert gemv.shape_class(x[:1], weight.t(), torch.randn(1, n)) == one
        assert gemv.shape_class(x[:2], weight.t()) == two
        assert gemv.shape_class(x[:2], weight.t(), torch.randn(2, n)) == two
        for rows in (3, gemv.DOT_MAX_ROWS):
            assert gemv.shape_class(x[:rows], weight.t()) == ("few_rows_wide" if n >= 256 else "few_rows")
        for rows in (gemv.DOT_MAX_ROWS + 1, gemv.MAX_ROWS + 1):
            assert gemv.shape_class(x[:rows], weight.t()) is None
    assert gemv.shape_class(x[:1], torch.randn(64, 32)) is None
    # two rows: narrow and at most TWO_ROWS_MAX_N wide (the 1B's q/k/v, o, down; not the 8B's)
    for n, k, two in ((3072, 2048, "two_rows"), (2048, 8192, "two_rows"), (3073, 4096, "few_rows")):
        assert gemv.shape_class(torch.randn(2, k), torch.empty(n, k).t()) == two, (n, k)
    for n, k, few in ((6144, 4096, "few_rows"), (4096, 14336, "few_rows"), (28672, 4096, "few_rows_wide")):
        assert gemv.shape_class(torch.randn(2, k), torch.empty(n, k).t()) == few, (n, k)


@pytest.mark.parametrize(("n", "k", "shape_class"), [(60, 200, "one_row"), (24, 200, "one_row_long_k")])
def test_one_row_config_rows_run_the_gemv_through_the_kernel_ops(n: int, k: int, shape_class: str) -> None:
    """mm_triton and addmm_triton with their one-row rows (block_m 1; "one_row", and "one_row_long_k"'s other
    tiles) compute aten.mm / aten.addmm's result for one row (an [N] bias and a [1, N] residual);
    addmm_in_place_triton with the row it resolves to writes aten.addmm_'s into its input and returns it."""
    x, weight, residual = operands(n, k, torch.float32, seed=5)
    close = {"rtol": 1e-5, "atol": 1e-5}
    assert mm.shape_class(x, weight.t()) == shape_class and mm.shape_class(torch.cat([x, x]), weight.t()) == "two_rows"
    one_row = tuple(mm.CONFIGS[(90, shape_class)].values())
    torch.testing.assert_close(torch.ops.graphspec.mm_triton(x, weight.t(), *one_row), x @ weight.T, **close)
    for bias in (residual[0], residual):
        assert addmm.shape_class(bias, x, weight.t()) == shape_class
        out = torch.ops.graphspec.addmm_triton(bias, x, weight.t(), 1, 1, *one_row)
        torch.testing.assert_close(out, torch.addmm(bias, x, weight.t()), **close)
    expected = torch.addmm(residual, x, weight.t())
    in_place_class = addmm_in_place.shape_class(residual, x, weight.t())
    config = tuple(addmm_in_place.CONFIGS[90 if in_place_class is None else (90, in_place_class)].values())
    out = torch.ops.graphspec.addmm_in_place_triton(residual, x, weight.t(), 1, 1, *config)
    assert out.data_ptr() == residual.data_ptr()
    torch.testing.assert_close(residual, expected, **close)
    with pytest.raises(ValueError, match="beta and alpha must be 1"):
        torch.ops.graphspec.addmm_in_place_triton(residual, x, weight.t(), 0.5, 1, *config)
    with pytest.raises(ValueError, match="only the GEMVs"):
        torch.ops.graphspec.addmm_in_place_triton(residual, x, weight.t(), 1, 1, *mm.CONFIGS[90].values())


@pytest.mark.parametrize(("n", "k", "shape_class"), [(160, 64, "few_rows"), (300, 64, "few_rows_wide")])
def test_few_rows_config_rows_run_the_dot_kernel_through_the_kernel_ops(n: int, k: int, shape_class: str) -> None:
    """mm_triton, addmm_triton (an [N] bias) and addmm_in_place_triton with the "few_rows*" rows (block_m MAX_ROWS:
    the tensor-core kernel) compute aten's results for two rows; addmm_in_place_triton writes into its input."""
    g = generator(8)
    x, weight, residual = (torch.randn(*shape, generator=g).to(DEVICE) for shape in ((2, k), (n, k), (2, n)))
    close = {"rtol": 1e-5, "atol": 1e-5}
    for module in (mm, addmm_in_place):
        assert module.shape_class(*((residual,) if module is addmm_in_place else ()), x, weight.t()) == shape_class
    config = tuple(mm.CONFIGS[(90, shape_class)].values())
    torch.testing.assert_close(torch.ops.graphspec.mm_triton(x, weight.t(), *config), x @ weight.T, **close)
    out = torch.ops.graphspec.addmm_triton(residual[0], x, weight.t(), 1, 1, *config)
    torch.testing.assert_close(out, torch.addmm(residual[0], x, weight.t()), **close)
    expected = torch.addmm(residual, x, weight.t())
    in_place = tuple(addmm_in_place.CONFIGS[(90, shape_class)].values())
    assert torch.ops.graphspec.addmm_in_place_triton(residual, x, weight.t(), 1, 1, *in_place) is residual
    torch.testing.assert_close(residual, expected, **close)


def test_addmm_in_place_triton_opcheck() -> None:
    """The op's schema says it writes `self` (and returns it), and its fake matches."""
    x, weight, residual = operands(16, 128, torch.bfloat16, seed=6)
    opcheck(
        torch.ops.graphspec.addmm_in_place_triton,
        (residual, x, weight.t(), 1.0, 1.0, *addmm_in_place.CONFIGS[90].values()),
        test_utils=("test_schema", "test_faketensor"),
    )


# ---------------------------------------------------------------------------------------------------
# GPU: the benchmark pairs' projections (8B, 1B) at one row, against cuBLAS's error.
# ---------------------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [1, 2, 5, 8])
@pytest.mark.parametrize(
    ("n", "k"), [(6144, 4096), (4096, 14336), (28672, 4096), (3072, 2048), (2048, 8192), (16384, 2048), (128256, 2048)]
)
def test_gemv_real_shapes_gpu(rows: int, n: int, k: int) -> None:
    """bf16 at the real projections with the sm_90 row of their shape class, in place into a residual: as close to
    the fp64 product as cuBLAS's addmm (within 1.5x its error)."""
    poison_allocator()
    g = generator(7)
    x, weight, residual = (
        torch.randn(*shape, generator=g).to(DEVICE, torch.bfloat16) for shape in ((rows, k), (n, k), (rows, n))
    )
    exact = x.double() @ weight.double().T + residual.double()
    cublas = torch.addmm(residual, x, weight.t())
    # its shape class's row; at rows no class takes (5, 8) the row two of them would take (the kernels run any rows)
    config = mm.CONFIGS[(90, gemv.shape_class(x, weight.t(), residual) or gemv.shape_class(x[:2], weight.t()))]
    knobs = {name: config[name] for name in ("block_m", "block_n", "block_k", "num_warps", "num_stages")}
    out = gemv.gemv(x, weight.t(), residual, residual, **knobs)
    assert rel_error(out, exact) <= 1.5 * max(rel_error(cublas, exact), 1e-3)
