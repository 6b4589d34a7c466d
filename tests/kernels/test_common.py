"""kernels/common.py: round_to rounds fp32 like torch's .to() (nearest even), NaN included, and keeps each
rounding step of a compiled kernel; tiles cut to the shared memory."""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl
from graphspec.kernels import common
from graphspec.kernels.common import round_to

from tests.kernels.helpers import DEVICE, generator

# The interpreter casts 0x7F7FFFFF to fp16 through numpy, which warns about the (correct) infinity.
pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning")


@triton.jit
def round_kernel(x_ptr, out_ptr, n, block: tl.constexpr):
    offsets = tl.arange(0, block)
    mask = offsets < n
    x = tl.load(x_ptr + offsets, mask=mask)
    dtype = out_ptr.dtype.element_ty
    tl.store(out_ptr + offsets, round_to(x, dtype).to(dtype), mask=mask)


def special_values() -> torch.Tensor:
    """Ties both ways, the largest finite floats, values that round to zero, and NaNs whose low 16
    bits carry into the sign bit (0x7FFFFFFF is the GPU's canonical NaN)."""
    raw = [0x3F808000, 0x3F818000, 0x3F80FFFF, 0x7F7FFFFF, 0xFF7FFFFF, 0x00000001, 0x00008000, 0x7F800000,
           0xFF800000, 0x7FC00000, 0x7FFFFFFF, 0xFFFFFFFF, 0x7F80FFFF, 0x80000000]  # fmt: skip
    if DEVICE.type == "cuda":  # the interpreter's fp32->bf16 cast flushes subnormal results to zero
        raw.append(0x8000FFFF)  # rounds up to the smallest bf16 subnormal
    return torch.tensor(raw, dtype=torch.int64).to(torch.int32).view(torch.float32)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_round_to_matches_torch(dtype: torch.dtype) -> None:
    x = torch.cat((special_values(), torch.randn(1000, generator=generator(0)) * 100)).to(DEVICE)
    out = torch.empty(x.shape, dtype=dtype, device=DEVICE)
    round_kernel[(1,)](x, out, x.numel(), block=triton.next_power_of_2(x.numel()))
    expected = x.to(dtype)
    assert out.isnan().equal(expected.isnan())
    torch.testing.assert_close(out, expected, rtol=0, atol=0, equal_nan=True)
    assert out.signbit()[~out.isnan()].equal(expected.signbit()[~expected.isnan()])


@triton.jit
def rounded_steps_kernel(a_ptr, b_ptr, c_ptr, d_ptr, out_ptr, n, block: tl.constexpr):
    offsets = tl.arange(0, block)
    mask = offsets < n
    a, b = tl.load(a_ptr + offsets, mask=mask).to(tl.float32), tl.load(b_ptr + offsets, mask=mask).to(tl.float32)
    c, d = tl.load(c_ptr + offsets, mask=mask).to(tl.float32), tl.load(d_ptr + offsets, mask=mask).to(tl.float32)
    dtype = out_ptr.dtype.element_ty
    out = round_to(round_to(a * b, dtype) - round_to(c * d, dtype), dtype)
    tl.store(out_ptr + offsets, out.to(dtype), mask=mask)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_round_to_keeps_every_rounding_step(dtype: torch.dtype) -> None:
    """a * b - c * d as torch computes it: each product rounded, then the difference. A compiled round_to
    that the compiler can see through lets it fuse a product into the subtraction (one FMA, the product
    never rounded), which is what a plain `.to()` conversion did in 16 bits and a plain return in fp32."""
    g = generator(1)
    a, b, c, d = (torch.randn(4096, generator=g).to(dtype).to(DEVICE) for _ in range(4))
    out = torch.empty(4096, dtype=dtype, device=DEVICE)
    rounded_steps_kernel[(1,)](a, b, c, d, out, out.numel(), block=out.numel())
    expected = a * b - c * d  # torch's ops: each result rounded
    fused = (a.double() * b.double() - (c * d).double()).to(dtype)  # the product a * b unrounded
    assert not torch.equal(fused, expected), "the inputs must tell a fused product from a rounded one"
    torch.testing.assert_close(out, expected, rtol=0, atol=0)


@pytest.mark.parametrize(
    ("dtype", "head_dim", "block_m", "expected"),
    [
        (torch.bfloat16, 128, 128, (64, 3)),  # the sm_90 row as tuned: untouched
        (torch.float32, 128, 128, (64, 3)),
        (torch.bfloat16, 256, 16, (64, 3)),
        (torch.float32, 256, 16, (64, 2)),  # fp32 heads of 256: one stage fewer
        (torch.float32, 256, 128, (32, 1)),  # and a tall q tile: narrower K/V tiles too
    ],
)
def test_tiles_are_cut_to_the_shared_memory_of_an_sm_90(monkeypatch, dtype, head_dim, block_m, expected) -> None:
    monkeypatch.setattr(common, "shared_memory_per_block", lambda device: 232448)  # an H100/H200's opt-in limit
    q = torch.empty(1, 1, 1, head_dim, dtype=dtype)
    assert common.fit_shared_memory(q, block_m, 64, 3) == expected


def test_pdl_launch_only_on_cuda_sm90_and_up(monkeypatch) -> None:
    """Programmatic dependent launch by default (GRAPHSPEC_PDL unset or 1): on for CUDA devices of sm_90 and later,
    off elsewhere (griddepcontrol does not exist before sm_90; the interpreter runs no inline PTX); off with
    GRAPHSPEC_PDL=0; any other value is refused with what to set."""
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    for setting in (None, "", "1"):
        if setting is None:
            monkeypatch.delenv(common.PDL_ENV, raising=False)
        else:
            monkeypatch.setenv(common.PDL_ENV, setting)
        assert common.pdl_launch(torch.device("cpu")) == {"USE_PDL": False}
        for capability in ((9, 0), (10, 0), (12, 0), (8, 9), (8, 0)):
            expected = capability[0] >= 9
            monkeypatch.setattr(common, "_cuda_capability", lambda index, capability=capability: capability)
            launch = common.pdl_launch(torch.device("cuda"))
            assert launch["USE_PDL"] is expected and launch.get("launch_pdl", False) is expected
    monkeypatch.setenv(common.PDL_ENV, "0")
    assert common.pdl_launch(torch.device("cuda", 0)) == {"USE_PDL": False}
    for setting in ("true", "2", " 1"):
        monkeypatch.setenv(common.PDL_ENV, setting)
        with pytest.raises(ValueError, match=r"GRAPHSPEC_PDL=.*use 0"):
            common.pdl_launch(torch.device("cuda", 0))


def test_kernels_launched_with_pdl_wait_first() -> None:
    """Every kernel that takes USE_PDL (common.pdl_launch launches it with PDL) waits for the kernels before it
    before it touches anything they may write: before its wait (a statement of its own) it reads only its weight
    (w_ptr: the registry lowers these kernels only for model weights, which no kernel writes) and stores nothing
    (a load of another operand could read a value an earlier kernel has not written yet, a store could overwrite
    one an earlier kernel still reads). It lets later kernels launch only after its wait."""
    import ast
    import importlib
    import inspect
    import pkgutil

    import graphspec.kernels

    waiting = []
    for module_info in pkgutil.iter_modules(graphspec.kernels.__path__):
        module = importlib.import_module(f"graphspec.kernels.{module_info.name}")
        for name, value in vars(module).items():  # @triton.jit functions (interpreted or not) hold theirs in .fn
            function = getattr(value, "fn", None)
            if not inspect.isfunction(function) or value in (
                common.wait_for_earlier_kernels,
                common.let_later_kernels_launch,
            ):
                continue
            parameters = inspect.signature(function).parameters
            if "USE_PDL" not in parameters:
                continue
            body = ast.parse(inspect.getsource(function)).body[0].body
            statements = [ast.unparse(node) for node in body]
            assert "wait_for_earlier_kernels(USE_PDL)" in statements, (module_info.name, name)
            before = body[: statements.index("wait_for_earlier_kernels(USE_PDL)")]
            names = {node.id for statement in before for node in ast.walk(statement) if isinstance(node, ast.Name)}
            pointers = {parameter for parameter in parameters if parameter.endswith("_ptr")}
            assert names & pointers <= {"w_ptr"}, (module_info.name, name, names & pointers)
            calls = {
                ast.unparse(node.func)
                for statement in before
                for node in ast.walk(statement)
                if isinstance(node, ast.Call)
            }
            assert not {call for call in calls if "store" in call or "atomic" in call or "let_later" in call}, calls
            waiting.append(name)
    expected = {"gemv_kernel", "few_rows_kernel", "swiglu_gemv_kernel", "attention_kernel"}
    assert expected | {"attention_reduce_kernel"} <= set(waiting), waiting
    assert "few_rows_dot_kernel" not in waiting, "launched in plain stream order (kernels/gemv.py: why)"
