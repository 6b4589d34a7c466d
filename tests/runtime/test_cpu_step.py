"""A CPU StepGraph runs its own copy of the step with the CPU table's kernels; the compiled graph keeps
the reference ops (the oracle), and both give the same step results. compile_cpu compiles every step at
start-up; cpu_draft_dtype packs only the drafter's weights in bfloat16 and changes no token."""

from __future__ import annotations

import pytest
import torch
from graphspec.kernels import mm_cpu

import graphspec
from graphspec import ops
from graphspec.counters import COUNTERS, compiled_graphs
from graphspec.errors import InputError


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


def test_compile_cpu_compiles_every_step_at_start_up_and_none_during_requests(checkpoint_factory) -> None:
    target, draft = checkpoint_factory("llama", 0), checkpoint_factory("llama", 1, num_hidden_layers=1)
    options = dict(k=2, batch_sizes=(1, 2), dtype="float32", device="cpu", max_seq_len=64, modes=("greedy",))
    before = compiled_graphs()
    inductor = graphspec.Runtime.from_pretrained(target, draft, compile_cpu=True, **options)
    assert compiled_graphs() - before == 2  # one Inductor graph per (mode, bucket) step, at start-up
    assert not any(graph.awaits_cpu_compile for graph in inductor.graphs.values())
    eager = graphspec.Runtime.from_pretrained(target, draft, **options)
    prompts = [[1, 2, 3, 4], [5, 6, 7]]
    for batch in (prompts, prompts[:1]):  # both buckets
        got = [r.token_ids for r in inductor.generate(batch, max_new_tokens=10, stop_token_ids=())]
        assert got == [r.token_ids for r in eager.generate(batch, max_new_tokens=10, stop_token_ids=())]
    assert inductor.stats.cpu_compiles_during_requests == 0


def test_compile_cpu_compiles_a_loaded_artifact_s_lazily_rebuilt_steps(checkpoint_factory, tmp_path) -> None:
    """A loaded artifact's step graphs have no generated code (runtime/node_program.py); Inductor is given
    their CPU copies with code (torch.compile cannot trace a lazy module's forward), the quickstart's path."""
    target, draft = checkpoint_factory("llama", 0), checkpoint_factory("llama", 1, num_hidden_layers=1)
    options = dict(k=2, batch_sizes=(1,), dtype="float32", device="cpu", max_seq_len=64, modes=("greedy",))
    graphspec.compile(target, draft, out=tmp_path / "art", **options)
    before = compiled_graphs()
    loaded = graphspec.Runtime.load(tmp_path / "art", compile_cpu=True)
    assert compiled_graphs() - before == 1
    assert loaded.capture_phase_seconds == {}  # CUDA-graph phases: nothing captured on the CPU
    eager = graphspec.Runtime.from_pretrained(target, draft, **options)
    prompt = [[1, 2, 3, 4]]
    got = [r.token_ids for r in loaded.generate(prompt, max_new_tokens=10, stop_token_ids=())]
    assert got == [r.token_ids for r in eager.generate(prompt, max_new_tokens=10, stop_token_ids=())]


def test_a_cpu_step_compiled_inside_a_request_is_counted(checkpoint_factory) -> None:
    target, draft = checkpoint_factory("llama", 0), checkpoint_factory("llama", 1, num_hidden_layers=1)
    runtime = graphspec.Runtime.from_pretrained(
        target, draft, k=2, batch_sizes=(1,), dtype="float32", device="cpu", max_seq_len=64, modes=("greedy",),
        compile_cpu=True, warm_up=False,
    )  # fmt: skip
    assert runtime.graphs[("greedy", 1)].awaits_cpu_compile
    runtime.generate([[1, 2, 3]], max_new_tokens=4)
    assert runtime.stats.cpu_compiles_during_requests == 1
    runtime.generate([[1, 2, 3]], max_new_tokens=4)
    assert runtime.stats.cpu_compiles_during_requests == 1  # compiled once, replayed after


@pytest.mark.skipif(not mm_cpu.bfloat16_supported(), reason="this CPU's oneDNN has no bfloat16 matmul")
def test_a_bfloat16_drafter_packs_only_its_own_weights_and_changes_no_token(checkpoint_factory) -> None:
    target, draft = checkpoint_factory("llama", 0), checkpoint_factory("llama", 1, num_hidden_layers=1)
    options = dict(k=3, batch_sizes=(2,), dtype="float32", device="cpu", max_seq_len=64, modes=("greedy",))
    compiled = graphspec.compile(target, draft, **options)
    # Two Runtimes over one Compiled share its weights; each packs its drafter's as it was asked to.
    fast = graphspec.Runtime(compiled, cpu_draft_dtype="bfloat16")
    exact = graphspec.Runtime(compiled)
    prompts = [[1, 2, 3, 4], [5, 6, 7]]
    got = [r.token_ids for r in fast.generate(prompts, max_new_tokens=16, stop_token_ids=())]
    assert got == [r.token_ids for r in exact.generate(prompts, max_new_tokens=16, stop_token_ids=())]
    assert packed_dtypes(fast) == {"draft": {torch.bfloat16}, "target": {torch.float32}}
    assert packed_dtypes(exact) == {"draft": {torch.float32}, "target": {torch.float32}}


def packed_dtypes(runtime: graphspec.Runtime) -> dict[str, set[torch.dtype]]:
    """The dtypes of the packed copies the bucket-2 step's projections multiply (what mm_cpu finds for
    each weight's address), by role (target, draft)."""
    graph = runtime.graphs[("greedy", 2)]
    step = graph.cpu_step()
    weights = dict(zip(step.graph.find_nodes(op="placeholder"), graph.params, strict=False))
    dtypes: dict[str, set[torch.dtype]] = {}
    for node in step.graph.find_nodes(op="call_function", target=torch.ops.graphspec.mm_cpu.default):
        placeholder = node.args[1].args[0]  # mm(x, t(weight))
        role = placeholder.meta["gs_input"].split(".")[0]
        dtypes.setdefault(role, set()).add(mm_cpu._PACKED[weights[placeholder].data_ptr()].packed.dtype)
    return dtypes


def test_cpu_draft_dtype_is_refused_where_it_does_not_apply(checkpoint_factory, tmp_path, monkeypatch) -> None:
    target, draft = checkpoint_factory("llama", 0), checkpoint_factory("llama", 1, num_hidden_layers=1)
    options = dict(k=2, batch_sizes=(1,), device="cpu", max_seq_len=64, modes=("greedy",))
    with pytest.raises(InputError, match="cpu_draft_dtype must be one of float32, bfloat16, got 'float16'"):
        graphspec.Runtime.from_pretrained(target, draft, cpu_draft_dtype="float16", dtype="float32", **options)
    wrong = r"is for float32 artifacts on the CPU .*; this one is bfloat16 on cpu"
    COUNTERS.reset()
    with pytest.raises(InputError, match=wrong):  # from compile's options, before it traces anything
        graphspec.Runtime.from_pretrained(target, draft, cpu_draft_dtype="bfloat16", dtype="bfloat16", **options)
    COUNTERS.expect(traces=0)
    compiled = graphspec.compile(target, draft, dtype="bfloat16", out=tmp_path / "art", **options)
    with pytest.raises(InputError, match=wrong):
        graphspec.Runtime(compiled, cpu_draft_dtype="bfloat16")
    monkeypatch.setattr("graphspec.artifact.load_artifact", lambda *args, **kwargs: pytest.fail("loaded"))
    with pytest.raises(InputError, match=wrong):  # from the manifest, before the artifact is loaded
        graphspec.Runtime.load(tmp_path / "art", cpu_draft_dtype="bfloat16")


def test_a_bfloat16_drafter_is_refused_on_a_cpu_without_bfloat16_matmul(checkpoint_factory, monkeypatch) -> None:
    """oneDNN's bfloat16 reorder raises on an AVX2-only CPU, which used to surface as a RuntimeError from
    deep inside Runtime's start-up; it is refused before any work, with what is missing."""
    target, draft = checkpoint_factory("llama", 0), checkpoint_factory("llama", 1, num_hidden_layers=1)
    options = dict(k=2, batch_sizes=(1,), dtype="float32", device="cpu", max_seq_len=64, modes=("greedy",))
    monkeypatch.setattr(mm_cpu, "bfloat16_supported", lambda: False)
    COUNTERS.reset()
    with pytest.raises(InputError, match="needs a CPU whose oneDNN multiplies bfloat16"):
        graphspec.Runtime.from_pretrained(target, draft, cpu_draft_dtype="bfloat16", **options)
    COUNTERS.expect(traces=0)
