"""fused_pointwise kernel (kernels/fused_pointwise.py) vs its reference (the same program run with the aten
ops): equal bit for bit for every op and view it generates code for, several outputs, broadcasting, 0-dim
and strided inputs."""

from __future__ import annotations

import json

import pytest
import torch
from graphspec.kernels import fused_pointwise as kernel
from torch.library import opcheck

from tests.kernels.helpers import DEVICE


def node(op: str, args: list, shape: list[int], dtype: str = "int64", **extra) -> dict:
    return {"op": op, "args": args, "shape": shape, "dtype": dtype, **extra}


IN0, IN1, IN2, IN3 = ({"in": k} for k in range(4))


def n(index: int) -> dict:
    return {"node": index}


# A drafter's positions in miniature: inputs length [4], valid [4] (bool), table [5, 3] read transposed
# (strided), a 0-dim scalar.
PROGRAM = {
    "inputs": [
        {"shape": [4], "dtype": "int64"},
        {"shape": [4], "dtype": "bool"},
        {"shape": [3, 5], "dtype": "int64"},
        {"shape": [], "dtype": "int64"},
    ],
    "nodes": [
        node("unsqueeze", [IN0], [4, 1], dim=1),  # 0
        node("slice", [IN2], [3, 2], dim=1, start=1, end=5, step=2),  # 1: columns 1, 3
        node("select", [n(1)], [2], dim=0, index=2),  # 2
        node("add", [n(0), n(2)], [4, 2]),  # 3: broadcast [4, 1] + [2]
        node("clamp", [n(3), 0, 40], [4, 2]),  # 4
        node("sub", [n(4), IN3], [4, 2]),  # 5: a 0-dim operand
        node("mul", [n(5), -3], [4, 2]),  # 6
        node("where", [IN1, IN0, 7], [4]),  # 7: a number branch
        node("le", [n(0), n(3)], [4, 2], dtype="bool"),  # 8
        node("expand", [IN1], [2, 4], dtype="bool"),  # 9: [4] -> [2, 4]
        node("permute", [n(9)], [4, 2], dtype="bool", dims=[1, 0]),  # 10
        node("logical_and", [n(8), n(10)], [4, 2], dtype="bool"),  # 11
        node("to", [n(11)], [4, 2]),  # 12: bool -> int64
        node("cat", [n(6), n(12), n(0)], [4, 5], dim=1),  # 13
        node("reshape", [n(13)], [2, 10]),  # 14
        node("minimum", [n(7), IN3], [4]),  # 15
        node("logical_not", [IN1], [4], dtype="bool"),  # 16
        node("neg", [n(15)], [4]),  # 17
        node("maximum", [n(17), n(7)], [4]),  # 18
        node("eq", [n(18), n(7)], [4], dtype="bool"),  # 19
        node("clamp", [n(7), None, 8], [4]),  # 20: an upper bound only
    ],
    "outputs": [14, 19, 16, 4, 20],
}


def program_inputs() -> list[torch.Tensor]:
    table = torch.arange(15, device=DEVICE).view(5, 3).t()  # [3, 5], strides (1, 3)
    return [
        torch.tensor([3, 9, 4, 30], device=DEVICE),
        torch.tensor([True, False, True, True], device=DEVICE),
        table,
        torch.tensor(5, device=DEVICE),
    ]


def test_every_op_equals_its_reference_bitwise():
    program = json.dumps(PROGRAM)
    inputs = program_inputs()
    got = kernel.fused_pointwise_triton(program, inputs)
    want = kernel.run_reference(program, inputs)
    assert len(got) == len(want) == 5
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape and torch.equal(g, w)


def test_a_program_over_its_maximum_width_and_one_element():
    wide = {"inputs": [{"shape": [3000], "dtype": "int32"}], "nodes": [node("add", [IN0, 1], [3000], "int32")],
            "outputs": [0]}  # fmt: skip
    x = torch.arange(3000, dtype=torch.int32, device=DEVICE)
    assert torch.equal(kernel.fused_pointwise_triton(json.dumps(wide), [x])[0], x + 1)
    single = {"inputs": [{"shape": [], "dtype": "int64"}], "nodes": [node("sub", [IN0, 2], [])], "outputs": [0]}
    assert kernel.fused_pointwise_triton(json.dumps(single), [torch.tensor(9, device=DEVICE)])[0].item() == 7


def test_the_generated_module_is_written_once_and_reused(tmp_path, monkeypatch):
    monkeypatch.setenv("GRAPHSPEC_CACHE_DIR", str(tmp_path))
    program = json.dumps({"inputs": [{"shape": [2], "dtype": "int64"}], "nodes": [node("neg", [IN0], [2])],
                          "outputs": [0]})  # fmt: skip
    module = kernel.kernel_module(program)
    files = list((tmp_path / "pointwise").glob("fused_pointwise_*.py"))
    assert len(files) == 1 and files[0].read_text() == kernel.kernel_source(program)
    assert kernel.kernel_module(program) is module


def test_op_registration():
    opcheck(torch.ops.graphspec.fused_pointwise_triton.default, (json.dumps(PROGRAM), program_inputs()))


TENSORS_ONLY = ("logical_and", "logical_or", "minimum", "maximum")  # aten takes no number for these


@pytest.mark.parametrize("op", sorted(set(kernel.OPS) - {"where", "neg", "logical_not"}))
def test_each_binary_op_equals_its_reference(op):
    """Every binary op alone, tensor with tensor and tensor with a number (where aten takes one)."""
    boolean = op.startswith("logical")
    dtype = "bool" if boolean or op in ("eq", "ne", "lt", "le", "gt", "ge") else "int64"
    inputs = [{"shape": [6], "dtype": "bool" if boolean else "int64"}] * 2
    second = [IN1, IN0] if op in TENSORS_ONLY else [IN0, -1]
    nodes = [node(op, [IN0, IN1], [6], dtype), node(op, second, [6], dtype)]
    program = json.dumps({"inputs": inputs, "nodes": nodes, "outputs": [0, 1]})
    if boolean:
        x = [torch.tensor(row, device=DEVICE) for row in ([True, False] * 3, [True, True, False, False, True, False])]
    else:
        x = [torch.tensor(row, device=DEVICE) for row in ([-2, -1, 0, 1, 2, 5], [3, -1, 0, 2, -7, 5])]
    got, want = kernel.fused_pointwise_triton(program, x), kernel.run_reference(program, x)
    assert all(g.dtype == w.dtype and torch.equal(g, w) for g, w in zip(got, want, strict=True))


def test_an_unwritable_home_falls_back_to_the_temporary_directory(tmp_path, monkeypatch):
    monkeypatch.delenv("GRAPHSPEC_CACHE_DIR", raising=False)
    home = tmp_path / "home"
    home.mkdir()
    (home / ".cache").write_text("a file where a folder should be")  # mkdir fails under it
    monkeypatch.setattr(kernel.Path, "home", classmethod(lambda cls: home))
    monkeypatch.setattr(kernel.tempfile, "gettempdir", lambda: str(tmp_path / "tmp"))
    assert kernel.cache_dir().parent.parent == tmp_path / "tmp"
