"""graphspec::fused_pointwise_triton: a group of small integer and boolean elementwise ops in one launch.

A step's glue around its kernels is arithmetic on a few dozen integers: a drafter's positions and clamps,
the masks of padding rows, the commit's lengths. Each aten op of it is a launch of its own on the GPU
(~1-2 us in a captured step, where the data is a few hundred bytes). lowering/fuse_pointwise.py gathers
runs of such ops into one program, and this op runs a program as one generated Triton kernel: every
output element is computed in registers from the group's inputs, intermediate values never touch memory.

A program (JSON, an argument of the op, so a dumped graph shows it and an artifact stores it) is
    {"inputs": [{"shape", "dtype"}], "nodes": [{"op", "args", "shape", "dtype", ...}], "outputs": [node]}
where an argument is {"in": k} (input k), {"node": j} (an earlier node) or a number. Ops: the
elementwise ops of OPS (same dtype in and out, but comparisons, which give bool, and "to", a cast) with
torch's broadcasting; views ("unsqueeze", "expand", "slice", "select", "permute", "reshape"); "cat".
Integer and boolean arithmetic is exact, so the kernel's outputs are bitwise what the aten ops computed
(run_reference computes them with the aten ops; tests compare the two).

Kernels are generated once per program text, written to a module file (Triton reads a kernel's source
from its file) under GRAPHSPEC_CACHE_DIR (default ~/.cache/graphspec) and imported; Triton caches the
binary by source like any kernel's, so an artifact carries it (graphspec/triton_binaries.py).
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import os
import tempfile
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
from graphspec.kernels.common import check_device, next_power_of_2
from torch import Tensor

from graphspec import library

__all__ = ["DTYPES", "OPS", "fused_pointwise_triton", "kernel_source", "run_reference"]

DTYPES = {"int64": torch.int64, "int32": torch.int32, "bool": torch.bool}
# Elementwise ops: name -> (torch function for the reference, Triton expression over operands a, b, c).
OPS: dict[str, tuple[Any, str]] = {
    "add": (torch.add, "({a} + {b})"),
    "sub": (torch.sub, "({a} - {b})"),
    "mul": (torch.mul, "({a} * {b})"),
    "neg": (torch.neg, "(-{a})"),
    "minimum": (torch.minimum, "tl.minimum({a}, {b})"),
    "maximum": (torch.maximum, "tl.maximum({a}, {b})"),
    "eq": (torch.eq, "({a} == {b})"),
    "ne": (torch.ne, "({a} != {b})"),
    "lt": (torch.lt, "({a} < {b})"),
    "le": (torch.le, "({a} <= {b})"),
    "gt": (torch.gt, "({a} > {b})"),
    "ge": (torch.ge, "({a} >= {b})"),
    "logical_and": (torch.logical_and, "({a} & {b})"),
    "logical_or": (torch.logical_or, "({a} | {b})"),
    "logical_not": (torch.logical_not, "({a} == 0)"),
    "where": (torch.where, "tl.where({a}, {b}, {c})"),
}
_TL = {"int64": "tl.int64", "int32": "tl.int32", "bool": "tl.int1"}


# --------------------------------------------------------------------------------------------------
# Reference: the program run with torch ops
# --------------------------------------------------------------------------------------------------


def run_reference(program: str, inputs: list[Tensor]) -> list[Tensor]:
    """The program's outputs computed with the aten ops it was made from (new, contiguous tensors)."""
    spec = json.loads(program)
    values: list[Tensor] = []

    def value(arg: Any) -> Any:
        if isinstance(arg, dict):
            return inputs[arg["in"]] if "in" in arg else values[arg["node"]]
        return arg

    for node in spec["nodes"]:
        args = [value(arg) for arg in node["args"]]
        op = node["op"]
        if op in OPS:
            result = OPS[op][0](*args)
        elif op == "to":
            result = args[0].to(DTYPES[node["dtype"]])
        elif op == "clamp":
            result = torch.clamp(args[0], args[1], args[2])
        elif op == "cat":
            result = torch.cat(args, node["dim"])
        else:
            result = _view(op, args[0], node)
        values.append(result)
    return [values[index].contiguous().clone() for index in spec["outputs"]]


def _view(op: str, x: Tensor, node: dict[str, Any]) -> Tensor:
    if op == "unsqueeze":
        return x.unsqueeze(node["dim"])
    if op == "expand":
        return x.expand(node["shape"])
    if op == "slice":
        return x[(slice(None),) * node["dim"] + (slice(node["start"], node["end"], node["step"]),)]
    if op == "select":
        return x.select(node["dim"], node["index"])
    if op == "permute":
        return x.permute(node["dims"])
    if op == "reshape":
        return x.reshape(node["shape"])
    raise ValueError(f"fused_pointwise: unknown op {op!r}")


# --------------------------------------------------------------------------------------------------
# Code generation
# --------------------------------------------------------------------------------------------------


class _Emitter:
    """Straight-line Triton code for the values of a program's nodes at given index expressions, each
    (value, index) pair computed once."""

    def __init__(self, spec: dict[str, Any]) -> None:
        self.spec, self.lines, self.names, self.count = spec, [], {}, 0

    def emit(self, expression: str) -> str:
        name = f"v{self.count}"
        self.count += 1
        self.lines.append(f"{name} = {expression}")
        return name

    def start_output(self) -> None:
        """A new output: new index values, so nothing computed for the last one is reused."""
        self.lines, self.names = [], {}

    def shape(self, arg: dict[str, Any]) -> list[int]:
        source = self.spec["inputs"][arg["in"]] if "in" in arg else self.spec["nodes"][arg["node"]]
        return source["shape"]

    def value(self, arg: Any, index: tuple[str, ...]) -> str:
        """An expression for argument `arg` at multi-index `index` (one expression per dim of its shape)."""
        if not isinstance(arg, dict):
            return repr(bool(arg)) if isinstance(arg, bool) else repr(arg)
        key = (json.dumps(arg), index)
        if key not in self.names:
            self.names[key] = self._compute(arg, index)
        return self.names[key]

    def _compute(self, arg: dict[str, Any], index: tuple[str, ...]) -> str:
        if "in" in arg:
            k = arg["in"]
            if not index:  # a 0-dim input: one value for every element
                return self.emit(f"tl.load(in{k})")
            offset = " + ".join(f"({i}) * s{k}_{d}" for d, i in enumerate(index))
            return self.emit(f"tl.load(in{k} + {offset}, mask=mask, other=0)")
        node = self.spec["nodes"][arg["node"]]
        op, args = node["op"], node["args"]
        if op in OPS:
            operands = [self.value(a, _broadcast(index, node["shape"], self.shape(a) if isinstance(a, dict) else []))
                        for a in args]  # fmt: skip
            return self.emit(OPS[op][1].format(**dict(zip("abc", operands, strict=False))))
        if op == "to":
            source = args[0]
            return self.emit(f"({self.value(source, index)}).to({_TL[node['dtype']]})")
        if op == "clamp":
            x = self.value(args[0], index)
            if args[1] is not None:
                x = self.emit(f"tl.maximum({x}, {args[1]})")
            if args[2] is not None:
                x = self.emit(f"tl.minimum({x}, {args[2]})")
            return x
        if op == "cat":
            return self._cat(node, index)
        return self.value(args[0], self._view_index(op, node, args[0], index))

    def _view_index(self, op: str, node: dict[str, Any], source: dict[str, Any], index: tuple[str, ...]):
        """The multi-index of the view's source that holds the view's element at `index`."""
        if op == "unsqueeze":
            return index[: node["dim"]] + index[node["dim"] + 1 :]
        if op == "expand":
            return _broadcast(index, node["shape"], self.shape(source))
        if op == "slice":
            d = node["dim"]
            return (*index[:d], f"{node['start']} + ({index[d]}) * {node['step']}", *index[d + 1 :])
        if op == "select":
            d = node["dim"]
            return (*index[:d], str(node["index"]), *index[d:])
        if op == "permute":
            inverse = [0] * len(node["dims"])
            for position, dim in enumerate(node["dims"]):
                inverse[dim] = position
            return tuple(index[inverse[d]] for d in range(len(index)))
        if op == "reshape":
            flat = _linear(index, node["shape"])
            return _unflatten(flat, self.shape(source))
        raise ValueError(f"fused_pointwise: unknown op {op!r}")

    def _cat(self, node: dict[str, Any], index: tuple[str, ...]) -> str:
        d, start, result = node["dim"], 0, None
        parts = []
        for arg in node["args"]:
            size = self.shape(arg)[d]
            local = f"tl.minimum(tl.maximum({index[d]} - {start}, 0), {size - 1})"
            value = self.value(arg, (*index[:d], local, *index[d + 1 :]))
            parts.append((start + size, value))
            start += size
        result = parts[-1][1]
        for end, value in reversed(parts[:-1]):
            result = self.emit(f"tl.where({index[d]} < {end}, {value}, {result})")
        return result


def _broadcast(index: tuple[str, ...], shape: list[int], source: list[int]) -> tuple[str, ...]:
    """torch broadcasting: the index into a `source`-shaped operand of a `shape`-shaped result."""
    lead = len(shape) - len(source)
    return tuple("0" if size == 1 and shape[lead + d] != 1 else index[lead + d] for d, size in enumerate(source))


def _linear(index: tuple[str, ...], shape: list[int]) -> str:
    terms, step = [], 1
    for d in reversed(range(len(shape))):
        terms.append(f"({index[d]}) * {step}")
        step *= shape[d]
    return " + ".join(terms) or "0"


def _unflatten(flat: str, shape: list[int]) -> tuple[str, ...]:
    index, step = [], 1
    for d in reversed(range(len(shape))):
        index.append(f"(({flat}) // {step}) % {shape[d]}")
        step *= shape[d]
    return tuple(reversed(index))


def kernel_source(program: str) -> str:
    """The Triton kernel module for a program: `kernel(in0.., s0_0.., out0..)`, one program computing every
    output over a block of its elements."""
    spec = json.loads(program)
    inputs = [f"in{k}" for k in range(len(spec["inputs"]))]
    strides = [f"s{k}_{d}" for k, item in enumerate(spec["inputs"]) for d in range(len(item["shape"]))]
    outputs = [f"out{o}" for o in range(len(spec["outputs"]))]
    body, emitter = [], _Emitter(spec)
    for o, node_index in enumerate(spec["outputs"]):
        shape = spec["nodes"][node_index]["shape"]
        numel = max(1, _numel(shape))
        emitter.start_output()
        result = emitter.value({"node": node_index}, _unflatten("offsets", shape))
        body += [
            f"    # output {o}: node {node_index}, shape {shape}",
            f"    offsets = tl.arange(0, {next_power_of_2(numel)})",
            f"    mask = offsets < {numel}",
            *(f"    {line}" for line in emitter.lines),
            f"    tl.store(out{o} + offsets, {result}, mask=mask)",
        ]
    params = ", ".join([*inputs, *strides, *outputs])
    return "\n".join(
        [
            f'"""Generated by graphspec.kernels.fused_pointwise for the program:\n{program}\n"""',
            "import triton",
            "import triton.language as tl",
            "",
            "",
            "@triton.jit",
            f"def kernel({params}):",
            *body,
            "",
        ]
    )


def _numel(shape: list[int]) -> int:
    numel = 1
    for size in shape:
        numel *= size
    return numel


def cache_dir() -> Path:
    """Where generated modules are written: GRAPHSPEC_CACHE_DIR, else ~/.cache/graphspec, else (a home that
    cannot be written, as in some containers) the temporary directory; a "pointwise" folder in it."""
    configured = os.environ.get("GRAPHSPEC_CACHE_DIR")
    for root in [Path(configured)] if configured else [Path.home() / ".cache" / "graphspec", _temporary_root()]:
        directory = root / "pointwise"
        try:
            directory.mkdir(parents=True, exist_ok=True)
        except OSError:
            continue
        if os.access(directory, os.W_OK):
            return directory
    raise OSError(f"fused_pointwise: cannot write generated kernels to {configured or '~/.cache/graphspec'}; set "
                  f"GRAPHSPEC_CACHE_DIR to a writable folder")  # fmt: skip


def _temporary_root() -> Path:
    return Path(tempfile.gettempdir()) / f"graphspec-{os.getuid() if hasattr(os, 'getuid') else 'user'}"


@functools.cache
def kernel_module(program: str) -> ModuleType:
    """The generated module of a program, written once (atomically: processes may race) and imported."""
    source = kernel_source(program)
    digest = hashlib.sha256(source.encode()).hexdigest()[:32]
    directory = cache_dir()
    path = directory / f"fused_pointwise_{digest}.py"
    if not path.is_file() or path.read_text() != source:
        handle, temporary = tempfile.mkstemp(dir=directory, suffix=".py.tmp")
        with os.fdopen(handle, "w") as file:
            file.write(source)
        os.replace(temporary, path)
    spec = importlib.util.spec_from_file_location(f"graphspec_fused_pointwise_{digest}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# --------------------------------------------------------------------------------------------------
# The op
# --------------------------------------------------------------------------------------------------


@library.op("graphspec::fused_pointwise_triton", mutates_args=())
def fused_pointwise_triton(program: str, inputs: list[Tensor]) -> list[Tensor]:
    """The program's outputs (new contiguous tensors), computed by its generated kernel in one launch."""
    check_device(*inputs)
    spec = json.loads(program)
    device = inputs[0].device
    outputs = [
        torch.empty(spec["nodes"][i]["shape"], dtype=DTYPES[spec["nodes"][i]["dtype"]], device=device)
        for i in spec["outputs"]
    ]
    strides = [stride for tensor in inputs for stride in tensor.stride()]
    kernel_module(program).kernel[(1,)](*inputs, *strides, *outputs)
    return outputs


@torch.library.register_fake("graphspec::fused_pointwise_triton")
def _(program, inputs):
    spec = json.loads(program)
    return [
        inputs[0].new_empty(spec["nodes"][i]["shape"], dtype=DTYPES[spec["nodes"][i]["dtype"]]) for i in spec["outputs"]
    ]
