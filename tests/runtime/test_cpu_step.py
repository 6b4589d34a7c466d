"""A CPU StepGraph runs its own copy of the step with the CPU table's kernels; the compiled graph keeps
the reference ops (the oracle), and both give the same step results."""

from __future__ import annotations

import torch

import graphspec
from graphspec import ops


def test_cpu_step_runs_the_cpu_table_copy_and_keeps_the_compiled_graph(checkpoint_factory) -> None:
    target, draft = checkpoint_factory("llama", 0), checkpoint_factory("qwen3", 1)
    runtime = graphspec.Runtime.from_pretrained(
        target, draft, k=2, batch_sizes=(2,), dtype="float32", device="cpu", max_seq_len=64, modes=("greedy",)
    )
    graph = runtime.graphs[("greedy", 2)]
    assert graph.cpu_gm is None  # made on the first call
    cpu_targets = {n.target for n in graph.cpu_step().graph.nodes}
    compiled_targets = {n.target for n in graph.gm.graph.nodes}
    assert torch.ops.graphspec.rotary_kv_attention_cpu.default in cpu_targets
    assert ops.OPS["rotary_kv_attention"] in compiled_targets
    assert torch.ops.graphspec.rotary_kv_attention_cpu.default not in compiled_targets
    assert graph.cpu_kernels > 0
    prompts = [[1, 2, 3, 4], [5, 6, 7]]
    fast = [r.token_ids for r in runtime.generate(prompts, max_new_tokens=12, stop_token_ids=())]
    graph.cpu_gm, graph._on_cpu_table = None, False  # the compiled graph itself: the reference ops
    reference = [r.token_ids for r in runtime.generate(prompts, max_new_tokens=12, stop_token_ids=())]
    assert fast == reference
