"""graphspec::mm_cpu: aten.mm on the CPU, through oneDNN with the weight packed once where the second
operand is a weight's transpose.

The step's projections are `aten.mm(x, aten.t(weight))` with a handful of rows (a verify block, a draft
token, a prefill chunk). torch.mm hands those to MKL's sgemm, which packs the weight on every call: on
the 2-core VM of docs/BENCHMARKS.md a [2048, 384] fp32 weight streams at 9 GB/s at 5 rows (14 GB/s at
one row) of the 35 GB/s a core reads. oneDNN's linear over a weight reordered once into its blocked
layout (torch.ops.mkldnn._reorder_linear_weight, what Inductor's freezing uses) reads it at 20-36 GB/s for
1-5 rows: 1.7-2.8x less time per projection at a verify block's 5 rows, 2.3x over the demo pair's
projections at 1-20 rows (`benchmarks/bench_linear_cpu.py`, docs/BENCHMARKS.md).

mm_cpu has aten.mm's schema, as every CPU table kernel has its reference's (lowering/registry.py,
CPU_KERNELS). The packed copy is made when a CPU step is built (pack(), called by the runtime for every
weight whose transpose an mm of its graph reads) and is found again by the weight's address. An entry
also holds a weak reference to the weight it was made from and is used only while that weight is alive
at that address: a weight freed and another allocated at its address can never meet a stale packed copy.
A weight without a live entry, and every other mm (activations times activations, a graph run without
the runtime), takes torch.mm itself. Results differ from torch.mm by fp32 rounding only, except over a
copy packed as bfloat16 (a drafter's weights under Runtime(cpu_draft_dtype="bfloat16")): bf16 products,
fp32 accumulation and an fp32 result.

Registered through graphspec/library.py as an opaque op (a fake gives its shape), so Inductor keeps it
one call. Imports torch only.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch
from torch import Tensor

from graphspec import library

__all__ = ["CONFIGS", "PackedWeight", "bfloat16_supported", "mm", "mm_cpu", "pack", "packable"]

CONFIGS: dict[str, dict[str, int]] = {"cpu": {}}


@dataclass
class PackedWeight:
    """A weight's oneDNN-packed copy (in its own dtype, float32 or bfloat16); valid while `source` is
    alive at `address`."""

    source: weakref.ref[Tensor]
    address: int
    packed: Tensor


# weight address -> its packed copy. Values are weak: the entry lives as long as the runtime holding it.
_PACKED: weakref.WeakValueDictionary[int, PackedWeight] = weakref.WeakValueDictionary()


def packable(weight: Tensor) -> bool:
    """Whether oneDNN's packed linear takes this weight: a contiguous fp32 [N, K] CPU matrix."""
    return (
        weight.device.type == "cpu"
        and weight.dtype == torch.float32
        and weight.dim() == 2
        and weight.is_contiguous()
        and torch.backends.mkldnn.is_available()
    )


def bfloat16_supported() -> bool:
    """Whether this CPU's oneDNN multiplies bfloat16 (AVX512-BF16 or AMX, AVX-NE-CONVERT, or AVX512
    BW/VL/DQ): without it a bfloat16 packed copy cannot be made (an AVX2-only CPU, such as some AMD EPYC
    VMs)."""
    return torch.backends.mkldnn.is_available() and bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def pack(weight: Tensor, dtype: torch.dtype = torch.float32) -> PackedWeight | None:
    """Pack `weight` for mm_cpu and register it; the caller keeps the returned entry alive for as
    long as the packed copy should be used (None: this weight is not packable). dtype bfloat16 packs a
    bfloat16 copy: mm_cpu then multiplies in bfloat16 (fp32 accumulation) and returns fp32; on a CPU
    without bfloat16 support (bfloat16_supported) that is a ValueError, never a silent float32 copy."""
    if not packable(weight):
        return None
    if dtype == torch.bfloat16 and not bfloat16_supported():
        raise ValueError("mm_cpu: this CPU's oneDNN has no bfloat16 matmul; pack the weight in float32")
    entry = _PACKED.get(weight.data_ptr())
    if entry is None or entry.source() is not weight or entry.packed.dtype != dtype:
        packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach().to(dtype))
        entry = PackedWeight(weakref.ref(weight), weight.data_ptr(), packed)
        _PACKED[weight.data_ptr()] = entry
    return entry


def mm(x: Tensor, mat2: Tensor) -> Tensor:
    """x [M, K] @ mat2 [K, N] -> [M, N]: through the packed copy when mat2 is the transpose of a weight
    packed for this runtime, else torch.mm."""
    weight = mat2.t()  # [N, K]: the weight itself when mat2 is aten.t(weight)
    entry = _PACKED.get(weight.data_ptr())
    if entry is not None and x.dtype == torch.float32 and weight.is_contiguous():
        source = entry.source()
        if source is not None and source.data_ptr() == entry.address and source.shape == weight.shape:
            packed = entry.packed
            if packed.dtype == torch.float32:
                return torch.ops.mkldnn._linear_pointwise(x.contiguous(), packed, None, "none", [None], "")
            product = torch.ops.mkldnn._linear_pointwise(x.to(packed.dtype), packed, None, "none", [None], "")
            return product.float()
    return torch.mm(x, mat2)


def _fake(x: Tensor, mat2: Tensor) -> Tensor:
    return x.new_empty((x.shape[0], mat2.shape[1]))


mm_cpu = library.define_schema("mm_cpu(Tensor self, Tensor mat2) -> Tensor", mm, _fake)
