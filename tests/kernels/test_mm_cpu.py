"""mm_cpu (oneDNN over a weight packed once) vs torch.mm; what it does with weights it has no live packed
copy for, and which weights a CPU step packs."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch
from graphspec.kernels import mm_cpu as kernel

import graphspec
from graphspec.runtime.graphs import pack_mm_weights
from tests.kernels.helpers import TOLERANCE, generator, rel_error


@pytest.mark.parametrize("rows", [1, 2, 5, 20, 300])
def test_mm_cpu_over_a_packed_weight_matches_torch_mm(rows: int) -> None:
    g = generator(rows)
    weight = torch.randn(96, 40, generator=g)  # [N, K]
    x = torch.randn(rows, 40, generator=g)
    entry = kernel.pack(weight)
    assert entry is not None and entry.packed.layout == torch._mkldnn
    out = kernel.mm_cpu(x, weight.t())
    assert out.shape == (rows, 96) and out.dtype == torch.float32
    assert rel_error(out, x.double() @ weight.double().t()) < 1e-6


def test_mm_cpu_without_a_packed_copy_is_torch_mm() -> None:
    g = generator(1)
    weight, x, other = torch.randn(96, 40, generator=g), torch.randn(5, 40, generator=g), torch.randn(40, 7)
    assert torch.equal(kernel.mm_cpu(x, weight.t()), torch.mm(x, weight.t()))  # never packed
    assert torch.equal(kernel.mm_cpu(x, other), torch.mm(x, other))  # not a weight's transpose


def test_a_packed_copy_is_never_used_once_its_weight_is_gone(monkeypatch) -> None:
    g = generator(2)
    weight, x = torch.randn(96, 40, generator=g), torch.randn(5, 40, generator=g)
    entry = kernel.pack(weight)
    calls = []
    packed_linear = torch.ops.mkldnn._linear_pointwise

    def spy(*args):
        calls.append(args[1])
        return packed_linear(*args)

    monkeypatch.setattr(torch.ops.mkldnn, "_linear_pointwise", spy)
    kernel.mm_cpu(x, weight.t())
    assert len(calls) == 1 and calls[0] is entry.packed
    # As if the weight had been freed and another allocated at its address: the entry's weight is dead.
    entry.source = weakref.ref(torch.zeros(1))
    gc.collect()
    assert torch.equal(kernel.mm_cpu(x, weight.t()), torch.mm(x, weight.t()))
    assert len(calls) == 1


def test_pack_refuses_what_onednn_does_not_take() -> None:
    assert kernel.pack(torch.randn(8, 4, dtype=torch.bfloat16)) is None
    assert kernel.pack(torch.randn(4, 8).t()) is None  # not contiguous
    assert kernel.pack(torch.randn(8)) is None


def test_a_cpu_step_packs_the_weights_of_its_projections(checkpoint_factory) -> None:
    target, draft = checkpoint_factory("llama", 0), checkpoint_factory("llama", 1, num_hidden_layers=1)
    runtime = graphspec.Runtime.from_pretrained(
        target, draft, k=2, batch_sizes=(1,), dtype="float32", device="cpu", max_seq_len=64, modes=("greedy",)
    )
    graph = runtime.graphs[("greedy", 1)]
    step = graph.cpu_step()
    projections = step.graph.find_nodes(op="call_function", target=kernel.mm_cpu)
    weights = {node.args[1].args[0] for node in projections}  # mm(x, t(weight placeholder))
    assert projections and all(node.op == "placeholder" for node in weights)
    assert len(graph.packed_weights) == len(weights)
    assert pack_mm_weights(step, graph.params[:0]) == []  # nothing to pack without the weights


def test_a_bfloat16_copy_is_refused_where_the_cpu_has_no_bfloat16_matmul(monkeypatch) -> None:
    """oneDNN raises deep inside its reorder on such a CPU; pack says what is missing instead, and never
    falls back to a float32 copy (the products would silently change)."""
    monkeypatch.setattr(kernel, "bfloat16_supported", lambda: False)
    with pytest.raises(ValueError, match="no bfloat16 matmul"):
        kernel.pack(torch.randn(8, 4), torch.bfloat16)
    assert kernel.pack(torch.randn(8, 4)) is not None  # float32 copies are unaffected


@pytest.mark.skipif(not kernel.bfloat16_supported(), reason="this CPU's oneDNN has no bfloat16 matmul")
def test_mm_cpu_over_a_bfloat16_copy_multiplies_in_bfloat16_and_returns_fp32() -> None:
    g = generator(3)
    weight, x = torch.randn(96, 40, generator=g), torch.randn(5, 40, generator=g)
    entry = kernel.pack(weight, torch.bfloat16)
    assert entry is not None and entry.packed.dtype == torch.bfloat16
    out = kernel.mm_cpu(x, weight.t())
    assert out.dtype == torch.float32
    exact = x.double() @ weight.double().t()
    assert 1e-5 < rel_error(out, exact) < TOLERANCE[torch.bfloat16]  # bf16 products: not the fp32 result
    assert kernel.pack(weight).packed.dtype == torch.float32  # packing again in fp32 replaces the copy
    assert rel_error(kernel.mm_cpu(x, weight.t()), exact) < 1e-6
