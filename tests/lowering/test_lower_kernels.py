"""lower_kernels: swaps reference ops for the kernel ops of the target SM, with config args."""

from __future__ import annotations

import importlib
import operator

import pytest
import torch
import torch.fx as fx
from graphspec.kernels import gemv
from torch.fx.experimental.proxy_tensor import make_fx

from graphspec import ops
from graphspec.config import PassContext
from graphspec.errors import InputError
from graphspec.lowering import lower_kernels, registry
from graphspec.op_nodes import positional_args
from tests import graphs
from tests.graphs import assert_graph_equal
from tests.kernels.helpers import DEVICE
from tests.lowering.hot_ops import EPS, LAYER, hot_inputs, traced
from tests.step_case import K, StepCase

HOT_OPS = (
    "rms_norm", "add_rms_norm", "silu_mul", "rotary", "kv_write", "attention", "argmax", "verify_greedy",
    "verify_rejection", "sample",
)  # fmt: skip


CACHE = 7  # index of the KV cache in hot_inputs()


def ctx(sm: int | None = None, mode: str = "sample", **overrides) -> PassContext:
    return PassContext(k=2, batch=2, mode=mode, sm=sm, **overrides)


def test_nothing_to_do_on_cpu() -> None:
    gm = traced(hot_inputs())
    before = gm.code
    result = lower_kernels.run(gm, ctx(sm=None))
    assert not result.changed and "no GPU" in result.note
    assert result.gm.code == before and lower_kernels.kernel_table(result.gm) == []


def test_reference_lowering_changes_nothing() -> None:
    gm = traced(hot_inputs())
    before = gm.code
    result = lower_kernels.run(gm, ctx(sm=90, lowering="reference", options={"force_sm": 90}))
    assert not result.changed and "reference" in result.note
    assert result.gm.code == before


def test_lowers_every_hot_op_with_config_args() -> None:
    gm = traced(hot_inputs())
    expected = traced(hot_inputs())
    for node in expected.graph.nodes:  # the expected graph, built by hand from the table's data
        name = next((op for op in HOT_OPS if node.target == ops.OPS[op]), None)
        if name is not None:
            configs = registry._module(name).CONFIGS
            args = positional_args(node)  # defaults filled in, then the config
            node.target = getattr(torch.ops.graphspec, f"{name}_triton").default
            node.args = (*args, *configs[90].values())
    result = lower_kernels.run(gm, ctx(sm=None, options={"force_sm": 90}))
    assert result.changed and result.stats == {"lowered": len(HOT_OPS), "fallback": 0}
    assert_graph_equal(result.gm, expected)
    lowered = [n for n in result.gm.graph.nodes if "gs_kernel" in n.meta]
    assert {n.meta["gs_pass"] for n in lowered} == {lower_kernels.NAME}
    attention = next(n for n in lowered if n.meta["gs_kernel"]["kernel"] == "graphspec::attention_triton")
    assert attention.meta["gs_kernel"]["sm"] == 90
    assert attention.meta["gs_kernel"]["config"] == registry._module("attention").CONFIGS[90]
    assert "torch.ops.graphspec.attention_triton.default(" in result.gm.code  # the config shows in code


def test_argmax_with_ids_lowers_only_when_the_ids_fit() -> None:
    """argmax(logits, ids) keeps its ids on the kernel (the lookup in its merge launch); ids the kernel does not
    take (int32, or not one per column) keep the reference."""

    def graph(ids: torch.Tensor) -> fx.GraphModule:
        return make_fx(lambda logits, ids: ops.argmax(logits, ids), tracing_mode="fake")(torch.randn(3, 50), ids)

    fits = lower_kernels.run(graph(torch.arange(50)), ctx(sm=90))
    (node,) = [n for n in fits.gm.graph.nodes if n.op == "call_function"]
    assert node.target == torch.ops.graphspec.argmax_triton.default
    assert node.args[1].op == "placeholder" and node.args[2:] == tuple(registry._module("argmax").CONFIGS[90].values())
    for ids in (torch.arange(50, dtype=torch.int32), torch.arange(49)):
        result = lower_kernels.run(graph(ids), ctx(sm=90))
        assert result.stats == {"lowered": 0, "fallback": 1}


def test_unknown_sm_lowers_with_default_configs() -> None:
    result = lower_kernels.run(traced(hot_inputs()), ctx(sm=89))
    assert result.stats == {"lowered": len(HOT_OPS), "fallback": 0}
    assert {row[2].split()[0] for row in lower_kernels.kernel_table(result.gm)} == {"sm=default"}


def test_node_outside_a_kernel_keeps_reference() -> None:
    result = lower_kernels.run(traced(hot_inputs(head_dim=96)), ctx(sm=90))
    assert result.stats == {"lowered": len(HOT_OPS) - 1, "fallback": 1}
    targets = [n.target for n in result.gm.graph.nodes]
    assert ops.OPS["attention"] in targets and torch.ops.graphspec.attention_triton.default not in targets


def test_kernel_table_rows() -> None:
    result = lower_kernels.run(traced(hot_inputs()), ctx(sm=90))
    rows = dict((node, (kernel, config)) for node, kernel, config in lower_kernels.kernel_table(result.gm))
    assert set(rows) == {n.name for n in result.gm.graph.nodes if "gs_kernel" in n.meta}
    fields = registry._module("attention").CONFIGS[90]
    config = "sm=90 " + " ".join(f"{key}={value}" for key, value in fields.items())  # sm=90 block_n=64 ...
    assert rows["attention"] == ("graphspec::attention_triton", config)


def test_kernel_table_sees_nested_pieces() -> None:
    """After split_attention the lowered nodes live in submodules; the table still lists them."""
    lowered = lower_kernels.run(traced(hot_inputs()), ctx(sm=90)).gm
    outer = fx.GraphModule(torch.nn.Module(), fx.Graph())
    outer.add_submodule("submod_1", lowered)
    names = [row[0] for row in lower_kernels.kernel_table(outer)]
    assert "submod_1.attention" in names and len(names) == len(HOT_OPS)


def test_lowered_graph_matches_reference_graph_fp32() -> None:
    """Run both graphs (the kernels under the interpreter on CPU): same results in fp32; the sampled
    and greedy tokens exactly."""
    inputs = [x.to(DEVICE) for x in hot_inputs()]
    gm = traced(inputs)
    reference_inputs = [x.clone() for x in inputs]  # each run gets its own cache to write into
    expected = gm(*reference_inputs)
    lowered = lower_kernels.run(gm, ctx(sm=None, options={"force_sm": 90})).gm
    lowered_inputs = [x.clone() for x in inputs]
    got = lowered(*lowered_inputs)
    for index, (g, e) in enumerate(zip(got, expected, strict=True)):
        if g.dtype.is_floating_point:
            torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-5, msg=f"output {index}")
        else:
            torch.testing.assert_close(g, e, rtol=0, atol=0, msg=f"output {index}")
    torch.testing.assert_close(lowered_inputs[CACHE], reference_inputs[CACHE], rtol=1e-5, atol=1e-5)


def test_in_place_kv_write_is_lowered_where_it_was_and_still_writes() -> None:
    """kv_write returns nothing and has no users; its effect is the cache write that attention reads
    next. Lowering retargets that node in place (same name, same position, still no users), nothing
    erases it (FX's own dead-code elimination keeps it too: the kernel op's schema mutates `cache`),
    and the lowered graph writes exactly k and v where the reference graph does, nothing else."""
    inputs = [x.to(DEVICE) for x in hot_inputs()]
    gm = traced(inputs)
    order = [node.name for node in gm.graph.nodes]
    reference_inputs = [x.clone() for x in inputs]
    gm(*reference_inputs)
    lowered = lower_kernels.run(gm, ctx(sm=None, options={"force_sm": 90})).gm
    assert [node.name for node in lowered.graph.nodes] == order
    write = next(node for node in lowered.graph.nodes if node.name == "kv_write")
    assert write.target is torch.ops.graphspec.kv_write_triton.default and not write.users
    args = [arg.name if isinstance(arg, fx.Node) else arg for arg in write.args]
    config = registry._module("kv_write").CONFIGS[90].values()
    assert args == ["cache_1", LAYER, "slot_ids_1", "start_pos_1", "getitem_3", "k_1", *config]
    assert write.next.target is torch.ops.graphspec.attention_triton.default  # still before its reader
    lowered.graph.eliminate_dead_code()
    lowered.recompile()
    assert [node.name for node in lowered.graph.nodes] == order

    lowered_inputs = [x.clone() for x in inputs]
    cache = lowered_inputs[CACHE]
    outputs = lowered(*lowered_inputs)
    k_rot, k, slots, start = outputs[3], inputs[4], inputs[8].tolist(), inputs[9].tolist()
    expected = inputs[CACHE].clone()
    t = k.shape[2]
    for row, (slot, pos) in enumerate(zip(slots, start, strict=True)):
        expected[LAYER, 0, slot, :, pos : pos + t] = k_rot[row]
        expected[LAYER, 1, slot, :, pos : pos + t] = k[row]  # v is the unrotated k
    assert not torch.equal(expected, inputs[CACHE])  # the write changes something
    torch.testing.assert_close(cache, expected, rtol=0, atol=0)
    torch.testing.assert_close(cache, reference_inputs[CACHE], rtol=1e-5, atol=1e-5)  # rotary's fp32 ulps


def test_fused_rotary_kv_write_is_lowered_and_writes_the_same_bits() -> None:
    """The op fuse_rotary_kv makes lowers like any other (config args, in place, no users needed), and
    its kernel returns the reference's q and writes the reference's cache, bit for bit in bf16."""

    def fused(q, k, v, cos, sin, cache, slot_ids, start_pos):
        return ops.rotary_kv_write(q, k, v, cos, sin, cache, LAYER, slot_ids, start_pos)

    inputs = [x.to(DEVICE) for x in graphs.rotary_kv_chain_inputs(torch.bfloat16)]
    gm = make_fx(fused, tracing_mode="fake")(*inputs)
    reference_inputs = [x.clone() for x in inputs]
    expected = gm(*reference_inputs)
    result = lower_kernels.run(gm, ctx(sm=None, options={"force_sm": 90}))
    assert result.stats == {"lowered": 1, "fallback": 0}
    node = next(n for n in result.gm.graph.nodes if "gs_kernel" in n.meta)
    assert node.target is torch.ops.graphspec.rotary_kv_write_triton.default
    assert node.args[-2:] == tuple(registry._module("rotary_kv_write").CONFIGS[90].values())
    lowered_inputs = [x.clone() for x in inputs]
    got = result.gm(*lowered_inputs)
    cache = 5  # index of the cache in rotary_kv_chain_inputs()
    assert torch.equal(got, expected)
    assert not torch.equal(lowered_inputs[cache], inputs[cache])
    assert torch.equal(lowered_inputs[cache], reference_inputs[cache])


def test_fused_rotary_kv_attention_is_lowered_and_computes_the_same_bits() -> None:
    """The op fuse_kv_attention makes lowers to the attention kernel's fused launch; output and cache
    equal the lowered pair's (rotary_kv_write kernel, then attention kernel) bit for bit in bf16."""
    g = torch.Generator().manual_seed(3)
    batch, t, q_heads, kv_heads, head_dim = 2, 3, 4, 2, 64
    qkv = torch.randn(batch, t, (q_heads + 2 * kv_heads) * head_dim, generator=g).to(DEVICE, torch.bfloat16)
    q, k, v = (
        part.view(batch, t, -1, head_dim).transpose(1, 2)
        for part in qkv.split([q_heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], dim=-1)
    )
    angles = (torch.rand(batch, t, head_dim // 2, generator=g) * 50).repeat(1, 1, 2).to(DEVICE)
    cache = torch.randn(2, 2, 3, kv_heads, 40, head_dim, generator=g).to(DEVICE, torch.bfloat16)
    inputs = [q, k, v, angles.cos(), angles.sin(), cache, torch.tensor([2, 0], device=DEVICE),
              torch.tensor([4, 37], device=DEVICE)]  # fmt: skip

    def pair(q, k, v, cos, sin, cache, slot_ids, start_pos):
        q_rot = ops.rotary_kv_write(q, k, v, cos, sin, cache, LAYER, slot_ids, start_pos)
        return ops.attention(q_rot, cache, LAYER, slot_ids, start_pos, 0.125)

    def fused(q, k, v, cos, sin, cache, slot_ids, start_pos):
        return ops.rotary_kv_attention(q, k, v, cos, sin, cache, LAYER, slot_ids, start_pos, 0.125)

    force = ctx(sm=None, options={"force_sm": 90})
    lowered_pair = lower_kernels.run(make_fx(pair, tracing_mode="fake")(*inputs), force).gm
    result = lower_kernels.run(make_fx(fused, tracing_mode="fake")(*inputs), force)
    assert result.stats == {"lowered": 1, "fallback": 0}
    node = next(n for n in result.gm.graph.nodes if "gs_kernel" in n.meta)
    assert node.target is torch.ops.graphspec.rotary_kv_attention_triton.default
    config = tuple(registry._module("rotary_kv_attention").CONFIGS[90].values())
    assert node.args[-len(config) :] == config
    pair_inputs, fused_inputs = [x.clone() for x in inputs], [x.clone() for x in inputs]
    expected, got = lowered_pair(*pair_inputs), result.gm(*fused_inputs)
    assert torch.equal(got, expected)
    assert not torch.equal(fused_inputs[5], inputs[5])  # the cache was written
    assert torch.equal(fused_inputs[5], pair_inputs[5])


def test_lowered_code_reloads_as_source() -> None:
    """The generated code names the kernel op and its config; exec'd on its own it computes the same."""

    def norm_only(x, weight):
        return ops.rms_norm(x, weight, EPS)

    x, weight = torch.randn(3, 32, device=DEVICE), torch.randn(32, device=DEVICE)
    gm = torch.fx.experimental.proxy_tensor.make_fx(norm_only, tracing_mode="fake")(x, weight)
    lowered = lower_kernels.run(gm, ctx(sm=90)).gm
    assert "torch.ops.graphspec.rms_norm_triton.default(x_1, weight_1, 1e-05, 4096, 4)" in lowered.code
    namespace = {"torch": torch, "operator": operator}
    exec(lowered.code, namespace)
    torch.testing.assert_close(namespace["forward"](None, x, weight), ops.rms_norm(x, weight, EPS))


# ---------------------------------------------------------------------------------------------------
# The real traced speculation step (tiny Llama target, Qwen3 draft with q/k norms; head dim 64 so
# attention fits too), lowered for sm 90 and run under the interpreter.
# ---------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def real_step(checkpoint_factory) -> StepCase:
    target = checkpoint_factory("llama", seed=0, hidden_size=128, num_attention_heads=2, num_key_value_heads=1)
    draft = checkpoint_factory("qwen3", seed=1, head_dim=64, num_attention_heads=2, num_key_value_heads=1)
    return StepCase(target, draft)


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU step case: its kernels run under the interpreter")
def test_lowered_real_step_matches_unlowered(real_step: StepCase) -> None:
    """Every hot op of the step is lowered; tokens and counts equal the unlowered step's, caches to fp32
    rounding (kernel sums run in a different order)."""
    mode = "sample"
    reference = real_step.through(mode, "defunctionalize_kv")
    lowered = real_step.through(mode, "lower_kernels", options={"force_sm": 90})
    left = [n for n in lowered.graph.nodes if n.op == "call_function" and n.target in lower_kernels.REFERENCE_OPS]
    assert {n.target for n in left} == {torch.ops.aten.mm.default}, "by default cuBLAS keeps the matmuls only"
    assert_same_tokens(real_step, lowered, reference)


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU step case: its kernels run under the interpreter")
def test_the_few_row_products_of_a_folded_batch_1_step_run_gemv_kernels(checkpoint_factory) -> None:
    """Batch 1 with folded norms, K = 2: the draft's one-token forward projects one row, so its q/k/v and lm_head mm
    take the GEMV ("one_row" rows), its in-place residual adds (o and down) addmm_in_place and its gate/up with the
    scaled SwiGLU (one op there) the fused kernel; its catch-up forward's two rows take the two-row GEMV ("two_rows",
    block_m 2) where the weight is narrow (N <= 2K) and the tensor-core kernel ("few_rows_wide", block_m MAX_ROWS)
    where it is wide; the verify's K + 1 = 3 rows take the tensor-core kernel too (its weights are all narrower than
    4K here: "few_rows"). Tokens and counts equal the unlowered step's."""
    target = checkpoint_factory("llama", seed=0, hidden_size=128, num_attention_heads=2, num_key_value_heads=1)
    draft = checkpoint_factory("qwen3", seed=1, head_dim=64, num_attention_heads=2, num_key_value_heads=1)
    step = StepCase(target, draft, fold_norms=True, batch=1)
    reference = step.through("greedy", "defunctionalize_kv")
    lowered = step.through("greedy", "lower_kernels", options={"force_sm": 90})
    calls = [n for n in lowered.graph.nodes if n.op == "call_function"]
    cublas = (torch.ops.aten.mm.default, torch.ops.aten.addmm_.default, torch.ops.aten.addmm.default)
    importlib.import_module("graphspec.kernels.addmm")  # registers graphspec::addmm_triton (lowered here or not)
    kernels = {getattr(torch.ops.graphspec, f"{op}_triton").default for op in ("mm", "addmm", "addmm_in_place")}
    chosen = {}  # (rows, gemv.shape_class) -> the block_m each such product took (None: cuBLAS)
    for n in (n for n in calls if n.target in cublas or n.target in kernels):
        first = 0 if n.target in (torch.ops.aten.mm.default, torch.ops.graphspec.mm_triton.default) else 1
        a, b = (n.args[first + i].meta["val"] for i in (0, 1))
        block_m = n.meta["gs_kernel"]["config"]["block_m"] if n.target in kernels else None
        chosen.setdefault((a.shape[0], gemv.shape_class(a, b)), set()).add(block_m)
    few = gemv.MAX_ROWS
    expected = {(1, "one_row"): {1}, (2, "two_rows"): {2}, (2, "few_rows_wide"): {few}, (K + 1, "few_rows"): {few}}
    assert chosen == expected, chosen
    layers = step.draft.spec.num_layers
    one_row_in_place = [
        n
        for n in calls
        if n.target is torch.ops.graphspec.addmm_in_place_triton.default and n.args[1].meta["val"].shape[0] == 1
    ]
    # o and down of each layer, but the last layer's down, whose add joins the final norm (add_rms_norm)
    assert len(one_row_in_place) == (2 * layers - 1) * (K - 1)
    swiglu = torch.ops.graphspec.scaled_silu_mul_linear_triton.default
    assert sum(n.target is swiglu for n in calls) == layers * (K - 1)
    assert_same_tokens(step, lowered, reference)


def assert_same_tokens(step: StepCase, lowered: fx.GraphModule, reference: fx.GraphModule) -> None:
    """Tokens and counts equal the reference step's, caches to fp32 rounding (kernel sums run in another order)."""
    got, _ = step.run_graph(lowered)
    want, _ = step.run_graph(reference)
    for name in ("tokens", "num_accepted", "next_committed_len", "next_last_tokens"):
        torch.testing.assert_close(got[name], want[name], rtol=0, atol=0, msg=name)
    for name in ("target_cache", "draft_cache"):
        torch.testing.assert_close(got[name], want[name], rtol=1e-4, atol=1e-5, msg=name)


# the hot ops the CPU table has
CPU_OPS = ("rms_norm", "add_rms_norm", "silu_mul", "attention", "argmax", "sample", "verify_rejection")


def test_lower_for_cpu_retargets_the_cpu_table_only() -> None:
    """The runtime's CPU copy: the CPU table's kernels (attention over each row's prefix; the small ops
    as composites of torch ops), config-less, tagged; the other hot ops keep their references."""
    gm = traced(hot_inputs())
    order = [node.name for node in gm.graph.nodes]
    assert lower_kernels.lower_for_cpu(gm) == len(CPU_OPS)
    assert [node.name for node in gm.graph.nodes] == order
    rows = lower_kernels.kernel_table(gm)
    assert sorted(kernel for _, kernel, _ in rows) == sorted(f"graphspec::{op}_cpu" for op in CPU_OPS)
    assert {config for _, _, config in rows} == {"sm=cpu"}
    targets = {n.target for n in gm.graph.nodes}
    assert torch.ops.graphspec.attention_cpu.default in targets and ops.OPS["attention"] not in targets
    assert ops.OPS["rotary"] in targets and ops.OPS["verify_greedy"] in targets


def test_lower_for_cpu_needs_no_fake_values() -> None:
    """Artifacts store no meta["val"]; the CPU table still applies (its kernels take what the
    reference takes)."""
    gm = traced(hot_inputs())
    for node in gm.graph.nodes:
        node.meta.pop("val", None)
    assert lower_kernels.lower_for_cpu(gm) == len(CPU_OPS)


def test_cpu_lowered_graph_matches_reference_graph_fp32() -> None:
    """The CPU kernels compute what the references do: norms, SwiGLU and argmax bit for bit, attention
    to fp32 rounding, and the cache is left the same."""
    inputs = hot_inputs()
    gm = traced(inputs)
    reference_inputs = [x.clone() for x in inputs]
    expected = gm(*reference_inputs)
    lower_kernels.lower_for_cpu(gm)
    lowered_inputs = [x.clone() for x in inputs]
    got = gm(*lowered_inputs)
    for index, (g, e) in enumerate(zip(got, expected, strict=True)):
        tolerance = 1e-5 if index == 4 else 0  # output 4 is attention's
        torch.testing.assert_close(g, e, rtol=tolerance, atol=tolerance, msg=f"output {index}")
    assert torch.equal(lowered_inputs[CACHE], reference_inputs[CACHE])


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU step case: its kernels run under the interpreter")
def test_dflash_step_lowers_block_attention_and_matches_unlowered(checkpoint_factory, tmp_path) -> None:
    """A DFlash step at head dim 64: each drafter layer's non-causal block attention (with its per-head
    norms, rotary and cache write: fuse_kv_attention, fuse_qk_norm) becomes one non-causal
    graphspec::rotary_kv_attention_triton, its context rows' normed k one rotary_kv_write_triton with the
    norm folded in, and the lowered step's tokens equal the unlowered step's."""
    from graphspec import pipeline, trace
    from graphspec.drafters.dflash import DFlash
    from graphspec.models import load_model
    from tests.dflash_oracle import make_dflash_drafter

    target_dir = checkpoint_factory("llama", seed=0, hidden_size=128, num_attention_heads=2, num_key_value_heads=1)
    drafter_dir = make_dflash_drafter(tmp_path, target_dir, seed=1, block_size=4, heads=(2, 1, 64))
    target = load_model(target_dir)
    drafter = DFlash(drafter_dir, target, torch.float32, "cpu")
    k, generator = 3, torch.Generator().manual_seed(0)
    inputs = trace.example_step_inputs(target.model, drafter, k, 2, 3, 48, torch.float32, "cpu")
    for name in ("target_cache", "dflash_cache", "dflash_features"):
        inputs[name] = torch.randn(inputs[name].shape, generator=generator)
    inputs["last_tokens"] = torch.randint(0, 128, (2, 2), generator=generator)
    inputs["committed_len"] = torch.tensor([9, 20])
    inputs["dflash_start"] = torch.tensor([[7], [20], [0]])
    gm, signature = trace.trace_step(target.model, drafter, k, "greedy", inputs)
    context = PassContext(k=k, batch=2, mode="greedy", sm=None, scratch_slot=2)
    reference = pipeline.run_pipeline(gm, context, stop_after="defunctionalize_kv").gm
    gm, _ = trace.trace_step(target.model, drafter, k, "greedy", inputs)
    forced = PassContext(k=k, batch=2, mode="greedy", sm=None, scratch_slot=2, options={"force_sm": 90})
    lowered = pipeline.run_pipeline(gm, forced, stop_after="lower_kernels").gm
    fused = [n for n in lowered.graph.nodes if n.target == torch.ops.graphspec.rotary_kv_attention_triton.default]
    blocks = [n for n in fused if n.args[13] is False]
    assert len(blocks) == 2  # one per drafter layer
    assert all(n.args[10] is not None for n in blocks)  # the Qwen3 drafter's q/k norms folded in
    # By name: an op whose kernel module nothing imported is not registered at all.
    names = [n.target.name() for n in lowered.graph.nodes if isinstance(n.target, torch._ops.OpOverload)]
    assert "graphspec::block_attention_triton" not in names and "graphspec::block_attention" not in names
    # The context rows' K/V: one rotary_kv_write per drafter layer, its k norm folded in (fuse_qk_norm).
    writes = [n for n in lowered.graph.nodes if n.target == torch.ops.graphspec.rotary_kv_write_triton.default]
    assert len(writes) == 2 and all(n.args[10] is not None for n in writes)
    k_norms = [n for n in lowered.graph.nodes if n.op == "call_function" and "k_norm" in str(n.args)]
    assert set(k_norms) <= set(writes) | set(fused)  # no k norm left as a launch of its own
    params = [*trace.model_inputs(target.model).values(), *drafter.params().values()]
    results = []
    for graph in (reference, lowered):
        state = {name: value.clone() for name, value in inputs.items()}
        outputs = graph(*params, *(state[name] for name in signature.step_inputs))
        results.append(dict(zip(trace.output_nodes(graph), outputs, strict=True)))
    for name in ("tokens", "num_accepted"):
        torch.testing.assert_close(results[1][name], results[0][name], rtol=0, atol=0, msg=name)
    torch.testing.assert_close(results[1]["dflash_cache"], results[0]["dflash_cache"], rtol=1e-4, atol=1e-5)


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU step case: its kernels run under the interpreter")
def test_invariant_numerics_lowers_matmuls_and_attention_and_keeps_tokens(real_step: StepCase) -> None:
    """numerics="invariant": every matmul becomes kernels/mm.py's, attention takes its "invariant" row, no
    reduction stays a reference; tokens equal the unlowered step's, caches to fp32 rounding."""
    reference = real_step.through("greedy", "defunctionalize_kv")
    lowered = real_step.through("greedy", "lower_kernels", options={"force_sm": 90}, numerics="invariant")
    calls = [n for n in lowered.graph.nodes if n.op == "call_function"]
    assert not [n.name for n in calls if n.target in lower_kernels.NOT_INVARIANT]
    kernels = [n.meta["gs_kernel"] for n in calls if "gs_kernel" in n.meta]
    assert sum(k["kernel"] == "graphspec::mm_triton" for k in kernels) == sum(
        n.target == torch.ops.aten.mm.default for n in reference.graph.nodes
    )
    attention = [k for k in kernels if "attention" in k["kernel"]]
    assert attention and all(k["sm"] == "invariant" and k["config"]["split_keys"] for k in attention)
    assert_same_tokens(real_step, lowered, reference)


def test_invariant_numerics_refuses_a_reduction_without_an_invariant_kernel(real_step: StepCase) -> None:
    """Sampling statistics split the vocabulary by the batch: a sampling step is refused, naming the op."""
    with pytest.raises(InputError, match=r"numerics='invariant'.*verify_rejection"):
        real_step.through("sample", "lower_kernels", options={"force_sm": 90}, numerics="invariant")


def test_invariant_prefill_program_attends_with_the_decode_kernels_invariant_row(real_step: StepCase) -> None:
    """Prefill programs are lowered invariant too: fuse_prefill_attention leaves each kv_write + attention
    apart, so the attention takes kernels/attention.py's invariant row (what a decode or verify query at
    the same position runs) and the matmuls kernels/mm.py; no prefill_attention kernel remains."""
    from graphspec import pipeline, trace_prefill
    from tests.step_case import MAX_SEQ, SLOTS, K

    target, drafter = real_step.target, real_step.drafter
    inputs = trace_prefill.example_prefill_inputs(target, drafter, K, 2, 8, SLOTS, MAX_SEQ, torch.float32, "cpu")
    gm, _ = trace_prefill.trace_prefill(target, drafter, K, inputs)
    context = PassContext(k=K, batch=2, mode="prefill", sm=None, numerics="invariant", options={"force_sm": 90})
    lowered = pipeline.run_pipeline(gm, context, passes=pipeline.PREFILL_PIPELINE, phase_checks={}).gm
    kernels = [n.meta["gs_kernel"] for n in lowered.graph.nodes if "gs_kernel" in n.meta]
    attention = [k for k in kernels if k["kernel"] == "graphspec::attention_triton"]
    assert attention and all(k["sm"] == registry.INVARIANT for k in attention)
    assert any(k["kernel"] == "graphspec::kv_write_triton" for k in kernels)
    assert any(k["kernel"] == "graphspec::mm_triton" for k in kernels)
    assert not any(k["kernel"] == "graphspec::prefill_attention_triton" for k in kernels)


HEADS_64 = dict(hidden_size=128, num_attention_heads=2, num_key_value_heads=1)  # head dim 64: attention kernels'


def drafter_case(kind: str, checkpoint_factory, tmp_path) -> tuple[object, str | object]:
    """(target checkpoint, draft argument) of each drafter kind at head dim 64."""
    from tests.checkpoints import make_mtp_checkpoint
    from tests.dflash_oracle import make_dflash_drafter
    from tests.eagle3_oracle import make_eagle3_head

    if kind == "mtp":
        return make_mtp_checkpoint(tmp_path / "mtp", layout="qwen3_next", seed=0, head_dim=64, **HEADS_64), "mtp"
    target = checkpoint_factory("llama", seed=0, num_hidden_layers=5, **HEADS_64)
    if kind == "ngram":
        return target, "ngram"
    if kind == "eagle3":
        heads = dict(num_attention_heads=2, num_key_value_heads=1, head_dim=64)
        return target, make_eagle3_head(tmp_path / "eagle3", target, seed=1, draft_vocab=64, **heads)
    return target, make_dflash_drafter(tmp_path / "dflash", target, seed=1, block_size=4, heads=(2, 1, 64))


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU step case: its kernels run under the interpreter")
@pytest.mark.parametrize("kind", ["ngram", "mtp", "eagle3", "dflash"])
def test_every_drafter_step_lowers_invariant_and_keeps_its_tokens(kind: str, checkpoint_factory, tmp_path) -> None:
    """numerics="invariant" is not a draft-model feature: each drafter's greedy step lowers with no reduction
    left on a reference, and its tokens equal the unlowered step's."""
    from graphspec import pipeline, trace
    from graphspec.drafters import check_drafter, drafter_kind, open_drafter
    from graphspec.models.loading import load_config, load_model

    target_dir, draft = drafter_case(kind, checkpoint_factory, tmp_path)
    kind = drafter_kind(draft, None)
    k, slots, max_seq = 3, 3, 48
    checked = check_drafter(draft, kind, target_dir, load_config(target_dir), max_seq, {}, k)
    target = load_model(target_dir)
    drafter = open_drafter(draft, kind, target, "float32", "cpu", checked, {})
    generator = torch.Generator().manual_seed(0)
    inputs = trace.example_step_inputs(target.model, drafter, k, 2, slots, max_seq, torch.float32, "cpu")
    for state in trace.step_states(target.model, drafter, slots, max_seq, k, torch.float32):
        value = inputs[state.name]  # allocated, not initialized
        # Caches and feature rows random; token ids and positions 0 (valid everywhere).
        inputs[state.name] = (
            torch.randn(value.shape, generator=generator) if value.is_floating_point() else value.zero_()
        )
    inputs["last_tokens"] = torch.randint(0, 128, (2, 2), generator=generator)
    inputs["committed_len"] = torch.tensor([9, 20])
    params = [*trace.model_inputs(target.model).values(), *drafter.params().values()]
    results = []
    for numerics, last in (("default", "defunctionalize_kv"), ("invariant", "lower_kernels")):
        gm, signature = trace.trace_step(target.model, drafter, k, "greedy", inputs)
        context = PassContext(
            k=k, batch=2, mode="greedy", sm=None, scratch_slot=2, numerics=numerics, options={"force_sm": 90}
        )
        graph = pipeline.run_pipeline(gm, context, stop_after=last).gm
        state = {name: value.clone() for name, value in inputs.items()}
        outputs = graph(*params, *(state[name] for name in signature.step_inputs))
        results.append(dict(zip(trace.output_nodes(graph), outputs, strict=True)))
    calls = [n for n in graph.graph.nodes if n.op == "call_function"]
    assert not [n.name for n in calls if n.target in lower_kernels.NOT_INVARIANT]
    assert any(n.target == torch.ops.graphspec.mm_triton.default for n in calls)
    for name in ("tokens", "num_accepted"):
        torch.testing.assert_close(results[1][name], results[0][name], rtol=0, atol=0, msg=f"{kind}: {name}")
