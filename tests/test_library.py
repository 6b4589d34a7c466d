"""graphspec/library.py: ops defined on graphspec's torch.library fragment instead of with custom_op keep
what graphspec needs of custom_op (inferred schema with its mutations, a fake for tracing, one graph node
per call) without its per-call wrappers, whose dynamo guard imports torch._dynamo on the first call."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import Tensor
from torch.fx.experimental.proxy_tensor import make_fx
from torch.library import opcheck

from graphspec import library

REPO = Path(__file__).resolve().parents[1]


@library.op("graphspec::test_library_scaled_add", mutates_args=("out",))
def scaled_add(x: Tensor, out: Tensor, scale: float, repeat: int = 1) -> Tensor:
    """out += scale * x (in place, `repeat` times); returns x * 2 (a new tensor)."""
    for _ in range(repeat):
        out.add_(x, alpha=scale)
    return x * 2


@torch.library.register_fake("graphspec::test_library_scaled_add")
def _(x: Tensor, out: Tensor, scale: float, repeat: int = 1) -> Tensor:
    return torch.empty_like(x)


def test_the_schema_is_inferred_from_the_type_hints_with_its_mutation_and_default() -> None:
    assert scaled_add is torch.ops.graphspec.test_library_scaled_add.default
    schema = str(scaled_add._schema)
    assert schema == (
        "graphspec::test_library_scaled_add(Tensor x, Tensor(a1!) out, float scale, SymInt repeat=1) -> Tensor"
    )


def test_a_call_runs_the_function_and_opcheck_passes() -> None:
    x, out = torch.ones(3), torch.zeros(3)
    doubled = scaled_add(x, out, 0.5, 2)
    assert torch.equal(out, torch.full((3,), 1.0)) and torch.equal(doubled, torch.full((3,), 2.0))
    opcheck(scaled_add, (torch.randn(4), torch.randn(4), 2.0))


def test_tracing_records_one_node_and_uses_the_fake() -> None:
    def program(x: Tensor, out: Tensor) -> Tensor:
        return scaled_add(x, out, 1.0) + 1

    gm = make_fx(program, tracing_mode="fake")(torch.ones(2), torch.zeros(2))
    targets = [node.target for node in gm.graph.nodes if node.op == "call_function"]
    assert targets.count(scaled_add) == 1


def _add_rows(state: Tensor, rows: Tensor, values: Tensor, scale: float) -> None:
    state[rows] += scale * values


test_library_rows_update, test_library_rows_write = library.state_update_ops("test_library_rows", _add_rows)


def test_state_update_ops_define_a_functional_update_and_its_in_place_write() -> None:
    update, write = test_library_rows_update, test_library_rows_write
    assert str(update._schema) == (
        "graphspec::test_library_rows_update(Tensor state, Tensor rows, Tensor values, float scale) -> Tensor"
    )
    assert str(write._schema) == (
        "graphspec::test_library_rows_write(Tensor(a0!) state, Tensor rows, Tensor values, float scale) -> ()"
    )
    assert library.IN_PLACE[update] is write
    state, rows, values = torch.zeros(4, 2), torch.tensor([1, 3]), torch.ones(2, 2)
    new = update(state, rows, values, 2.0)
    assert torch.equal(state, torch.zeros(4, 2)), "the functional update wrote its input"
    assert torch.equal(new[rows], torch.full((2, 2), 2.0)) and new[[0, 2]].eq(0).all()
    assert write(state, rows, values, 2.0) is None and torch.equal(state, new)
    opcheck(update, (torch.randn(4, 2), rows, torch.randn(2, 2), 0.5))
    opcheck(write, (torch.randn(4, 2), rows, torch.randn(2, 2), 0.5))
    gm = make_fx(lambda s, r, v: update(s, r, v, 1.0) * 2, tracing_mode="fake")(state, rows, values)
    assert [node.target for node in gm.graph.nodes if node.op == "call_function"].count(update) == 1


def test_only_the_graphspec_namespace() -> None:
    with pytest.raises(ValueError, match="graphspec namespace"):
        library.op("other::name", mutates_args=())


CALLS_WITHOUT_DYNAMO = """
import sys
import torch
from graphspec import ops
from graphspec.kernels import rms_norm  # a Triton kernel op, run by the interpreter here
x, w = torch.randn(4, 64), torch.ones(64)
ops.rms_norm(x, w, 1e-6)
torch.ops.graphspec.rms_norm_triton(x, w, 1e-6, *rms_norm.CONFIGS["default"].values())
print("torch._dynamo" in sys.modules)
"""


def test_calling_reference_and_kernel_ops_does_not_import_dynamo() -> None:
    """custom_op's guard imported torch._dynamo at the first call (about 5 s of a GPU cold start)."""
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": path}
    done = subprocess.run(
        [sys.executable, "-c", CALLS_WITHOUT_DYNAMO], capture_output=True, text=True, timeout=300, env=env
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "False"
