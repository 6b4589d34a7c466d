"""The kernel table: every (op, SM) entry resolves, unknown SMs fall back to "default", nodes that
do not fit (or have no fake values) keep the reference."""

from __future__ import annotations

import importlib

import pytest
import torch
import torch.fx as fx
from torch.fx.experimental.proxy_tensor import make_fx

from graphspec import ops
from graphspec.lowering import registry
from tests import graphs
from tests.lowering.hot_ops import hot_inputs, traced

REQUIRED_SMS = (80, 90, "default")


def hot_nodes(head_dim: int = 64) -> dict[str, torch.fx.Node]:
    gm = traced(hot_inputs(head_dim))
    by_target = {target: name for name, target in ops.OPS.items()}
    return {by_target[n.target]: n for n in gm.graph.nodes if n.op == "call_function" and n.target in by_target}


def test_every_op_has_80_90_and_default_entries() -> None:
    keys = {(entry.op, entry.sm) for entry in registry.entries()}
    assert {(op, sm) for op in registry.KERNELS for sm in REQUIRED_SMS} <= keys


@pytest.mark.parametrize("entry", list(registry.entries()), ids=lambda e: f"{e.op}-{e.sm}")
def test_entry_resolves_to_its_kernel_op(entry: registry.KernelEntry) -> None:
    """The kernel op exists, takes the reference op's arguments then the config fields in order, and
    resolving the entry's SM (its numerics for "invariant" rows and invariant-only ops) gives it back."""
    reference = registry.REFERENCE_OPS[entry.op]._schema
    arguments = entry.kernel._schema.arguments
    assert [a.name for a in arguments[: len(reference.arguments)]] == [a.name for a in reference.arguments]
    assert [a.name for a in arguments[len(reference.arguments) :]] == list(entry.config)
    returns = [str(r.type) for r in entry.kernel._schema.returns]
    assert returns == [str(r.type) for r in reference.returns]
    assert entry.kernel._schema.is_mutable == reference.is_mutable
    assert str(entry.kernel) == f"graphspec.{entry.op}_triton.default"
    invariant = entry.sm == registry.INVARIANT or entry.op in registry.CUBLAS_BY_DEFAULT
    numerics = registry.INVARIANT if invariant else "default"
    if isinstance(entry.sm, tuple):  # a shape-class row: nodes of that class resolve to it (tests below)
        assert entry.sm[0] in registry._module(entry.op).CONFIGS
    elif entry.sm != "default":
        sm = 90 if entry.sm == registry.INVARIANT else entry.sm
        assert registry.resolve(entry.op, sm, numerics=numerics) == entry


@pytest.mark.parametrize("sm", [86, 89, 100, 120])
def test_unknown_sm_uses_default_config(sm: int) -> None:
    entry = registry.resolve("attention", sm)
    assert entry is not None and entry.sm == "default"
    assert entry.config == registry._module("attention").CONFIGS["default"]


@pytest.mark.parametrize("sm", [None, 70, 75])
def test_no_gpu_or_old_sm_keeps_reference(sm: int | None) -> None:
    assert all(registry.resolve(op, sm) is None for op in registry.KERNELS)


def test_invariant_numerics_picks_invariant_rows_and_matmuls() -> None:
    """numerics="invariant": attention takes its "invariant" row on every SM, row-invariant ops their SM's
    row, ops with neither keep the reference; by default the matmuls keep cuBLAS."""
    for sm in (80, 90, 120):
        assert registry.resolve("attention", sm, numerics="invariant").sm == registry.INVARIANT
        assert registry.resolve("rms_norm", sm, numerics="invariant") == registry.resolve("rms_norm", sm)
        assert registry.resolve("mm", sm, numerics="invariant").kernel is torch.ops.graphspec.mm_triton.default
        assert registry.resolve("mm", sm) is None and registry.resolve("addmm", sm) is None
        assert registry.resolve("verify_rejection", sm, numerics="invariant") is None
        assert registry.resolve("attention", sm).sm != registry.INVARIANT


def matmul_node(
    op: str,
    rows: int,
    weight: torch.Tensor | None = None,
    addend_rows: int | None = None,
    weight_input: str = "target.layers.0.proj.weight",
) -> fx.Node:
    """An aten.mm / addmm / addmm_ node of x [rows, 32] @ weight.t() (weight [N, 32], [24, 32] by default), the
    addend [N] (addend_rows None) or [addend_rows, N]; the weight is the program's input `weight_input` (a model
    weight by default, as trace.StepSignature names them)."""
    weight = torch.randn(24, 32) if weight is None else weight
    n = weight.shape[0]
    addend = torch.randn(n) if addend_rows is None else torch.randn(addend_rows, n)
    product = {
        "mm": lambda x, w, a: torch.mm(x, w.t()),
        "addmm": lambda x, w, a: torch.addmm(a, x, w.t()),
        "addmm_in_place": lambda x, w, a: a.addmm_(x, w.t()),
    }[op]
    gm = make_fx(product, tracing_mode="fake")(torch.randn(rows, 32), weight, addend)
    gm.graph.find_nodes(op="placeholder")[1].meta["gs_input"] = weight_input
    return next(n for n in gm.graph.nodes if n.target is registry.ATEN_OPS[op])


def test_few_row_products_take_the_gemv_kernels_by_default() -> None:
    """By default a one-row product against a transposed weight takes the "one_row" row (the GEMV, block_m 1)
    on every SM, two rows of a narrow weight (N <= 2K and TWO_ROWS_MAX_N) the "two_rows" row, two rows of a wider
    one and 3 to DOT_MAX_ROWS rows of any the "few_rows" row (the tensor-core kernel, block_m MAX_ROWS;
    "few_rows_wide" from N = 4K), and the in-place addmm the same rows; more rows or a weight the kernels cannot read
    keep cuBLAS. Under invariant numerics the matmuls take the SM's row (kernels/mm.py) at one row too, and the
    in-place addmm, which has no invariant kernel, keeps its reference."""
    gemv = importlib.import_module("graphspec.kernels.gemv")  # imported here: kernels load on first use
    few, most = gemv.MAX_ROWS, gemv.DOT_MAX_ROWS
    for sm in (80, 90, 120):
        key = sm if sm in (80, 90) else "default"
        for op in ("mm", "addmm"):
            one = registry.resolve(op, sm, matmul_node(op, 1))
            assert one.sm == (key, "one_row") and one.config["block_m"] == 1
            long_k = registry.resolve(op, sm, matmul_node(op, 1, torch.randn(8, 32)))  # K = 4N
            assert long_k.sm == (key, "one_row_long_k") and long_k.config["block_n"] == 4
            two = registry.resolve(op, sm, matmul_node(op, 2))
            assert two.sm == (key, "two_rows") and two.config["block_m"] == 2
            wider = registry.resolve(op, sm, matmul_node(op, 2, torch.randn(65, 32)))  # N > 2K: the tensor cores
            assert wider.sm == (key, "few_rows") and wider.config["block_m"] == few
            wide = registry.resolve(op, sm, matmul_node(op, 2, torch.randn(128, 32)))  # N >= 4K: its wide tile
            assert wide.sm == (key, "few_rows_wide") and wide.config["block_m"] == few
            for rows in (3, most):
                assert registry.resolve(op, sm, matmul_node(op, rows)).sm == (key, "few_rows")
            for rows in (most + 1, few + 1):
                assert registry.resolve(op, sm, matmul_node(op, rows)) is None
            assert registry.resolve(op, sm, matmul_node(op, 1, torch.randn(32, 24).t())) is None
            assert registry.resolve(op, sm, matmul_node(op, 1), numerics=registry.INVARIANT).config["block_m"] == 64
        assert registry.resolve("addmm", sm, matmul_node("addmm", 1, addend_rows=1)).sm == (key, "one_row")
        in_place = registry.resolve("addmm_in_place", sm, matmul_node("addmm_in_place", 1, addend_rows=1))
        assert in_place.sm == key and in_place.config["block_m"] == 1
        assert in_place.kernel is torch.ops.graphspec.addmm_in_place_triton.default
        two = registry.resolve("addmm_in_place", sm, matmul_node("addmm_in_place", 2, addend_rows=2))
        assert two.sm == (key, "two_rows")
        node = matmul_node("addmm_in_place", 1, torch.randn(8, 32), addend_rows=1)
        assert registry.resolve("addmm_in_place", sm, node).sm == (key, "one_row_long_k")
        node = matmul_node("addmm_in_place", 2, torch.randn(65, 32), addend_rows=2)
        assert registry.resolve("addmm_in_place", sm, node).sm == (key, "few_rows")
        node = matmul_node("addmm_in_place", most, addend_rows=most)
        assert registry.resolve("addmm_in_place", sm, node).sm == (key, "few_rows")
        for rows in (most + 1, few + 1):
            node = matmul_node("addmm_in_place", rows, addend_rows=rows)
            assert registry.resolve("addmm_in_place", sm, node) is None
        node = matmul_node("addmm_in_place", 1, addend_rows=1)
        assert registry.resolve("addmm_in_place", sm, node, numerics=registry.INVARIANT) is None


def test_gemvs_take_only_model_weights() -> None:
    """The GEMVs ask for their first weight tile before they wait for earlier kernels (PDL), so a product whose
    weight operand a kernel computes (an activation, or any input but a target.* / draft.* weight) keeps cuBLAS,
    and the in-place addmm and the fused gate/up GEMV, which have only GEMVs, their references."""
    for op in ("mm", "addmm", "addmm_in_place"):
        for rows in (1, 2):
            addend_rows = rows if op == "addmm_in_place" else None
            assert registry.resolve(op, 90, matmul_node(op, rows, addend_rows=addend_rows)) is not None
            for name in ("hidden", "draft_cache", "targets.x"):
                node = matmul_node(op, rows, addend_rows=addend_rows, weight_input=name)
                assert registry.resolve(op, 90, node) is None, (op, rows, name)
            node = matmul_node(op, rows, addend_rows=addend_rows, weight_input="draft.fc.weight")
            assert registry.resolve(op, 90, node) is not None
    computed = make_fx(lambda x, w: torch.mm(x, (w * 2).t()), tracing_mode="fake")(
        torch.randn(1, 32), torch.randn(24, 32)
    )
    computed.graph.find_nodes(op="placeholder")[1].meta["gs_input"] = "target.proj.weight"
    node = next(n for n in computed.graph.nodes if n.target is torch.ops.aten.mm.default)
    assert registry.resolve("mm", 90, node) is None  # a product of the weight, not the weight
    assert registry.resolve("mm", 90, node, numerics=registry.INVARIANT) is not None  # kernels/mm.py waits first
    for name, lowered in (("target.layers.0.mlp.gate_up_proj.weight", True), ("hidden", False)):
        swiglu = make_fx(lambda x, w: torch.ops.graphspec.scaled_silu_mul_linear(x, w.t(), 1e-6), tracing_mode="fake")(
            torch.randn(1, 32), torch.randn(48, 32)
        )
        swiglu.graph.find_nodes(op="placeholder")[1].meta["gs_input"] = name
        node = next(n for n in swiglu.graph.nodes if n.target is torch.ops.graphspec.scaled_silu_mul_linear.default)
        assert (registry.resolve("scaled_silu_mul_linear", 90, node) is not None) is lowered, name


def test_op_without_kernel_keeps_reference() -> None:
    assert registry.resolve("kv_update", 90) is None  # functional form: gone after defunctionalize_kv
    assert registry.resolve("commit", 90) is None


def kv_write_node(cache, slot_ids, start_pos, k, v, layer: int = 1) -> torch.fx.Node:
    def write(cache, slot_ids, start_pos, k, v):
        ops.kv_write(cache, layer, slot_ids, start_pos, k, v)
        return cache

    gm = make_fx(write, tracing_mode="fake")(cache, slot_ids, start_pos, k, v)
    return next(n for n in gm.graph.nodes if n.target == ops.OPS["kv_write"])


def test_kv_write_fits_integer_indices_and_matching_shapes() -> None:
    """The kernel takes what the reference takes; kv_write's fake checks nothing, so fits must."""
    cache = torch.zeros(2, 2, 3, 2, 16, 8, dtype=torch.bfloat16)
    k = torch.zeros(2, 2, 3, 8)
    slots, start = torch.tensor([2, 0]), torch.tensor([0, 5], dtype=torch.int32)
    assert registry.resolve("kv_write", 90, kv_write_node(cache, slots, start, k, k)) is not None  # k/v cast
    assert registry.resolve("kv_write", 90, kv_write_node(cache, slots, start, k, k, layer=-2)) is not None
    for bad in (
        kv_write_node(cache, slots, start, k, k[..., :4]),  # v narrower than k
        kv_write_node(cache, slots, start, k[:, :1], k[:, :1]),  # fewer heads than the cache
        kv_write_node(cache, slots, start.float(), k, k),  # float positions
        kv_write_node(cache, slots, torch.tensor([[0, 9], [5, 9]])[:, 0], k, k),  # a column: read as contiguous
        kv_write_node(cache, slots != 0, start, k, k),  # a bool mask, not slot ids
        kv_write_node(cache, slots[:1], start, k, k),  # one slot id for two rows
        kv_write_node(cache, slots, start, k, k, layer=2),  # no such layer
        kv_write_node(cache.to(torch.int8), slots, start, k, k),
    ):
        assert registry.resolve("kv_write", 90, bad) is None, bad.args


def test_rope_tables_fit_integer_positions_and_fp32_frequencies() -> None:
    def node(positions: torch.Tensor, inv_freq: torch.Tensor) -> torch.fx.Node:
        gm = make_fx(lambda p, f: ops.rope_tables(p, f, 1.0), tracing_mode="fake")(positions, inv_freq)
        return next(n for n in gm.graph.nodes if n.target == ops.OPS["rope_tables"])

    positions, inv_freq = torch.arange(6).view(2, 3), torch.rand(64)
    assert registry.resolve("rope_tables", 90, node(positions, inv_freq)) is not None
    assert registry.resolve("rope_tables", 90, node(positions.int(), inv_freq)) is not None
    float_positions, fp64_frequencies, too_wide = positions.float(), inv_freq.double(), torch.rand(300)
    for bad in (node(float_positions, inv_freq), node(positions, fp64_frequencies), node(positions, too_wide)):
        assert registry.resolve("rope_tables", 90, bad) is None, bad.args


def rotary_kv_write_node(q, k, v, cache, layer: int = 1) -> torch.fx.Node:
    def fused(q, k, v, cos, sin, cache, slot_ids, start_pos):
        return ops.rotary_kv_write(q, k, v, cos, sin, cache, layer, slot_ids, start_pos)

    cos = torch.zeros(q.shape[0], q.shape[2], q.shape[3])
    slots, start = torch.tensor([2, 0]), torch.tensor([0, 5])
    gm = make_fx(fused, tracing_mode="fake")(q, k, v, cos, cos, cache, slots, start)
    return next(n for n in gm.graph.nodes if n.target == ops.OPS["rotary_kv_write"])


def test_rotary_kv_write_fits_where_rotary_and_kv_write_both_fit() -> None:
    cache = torch.zeros(2, 2, 3, 2, 16, 8, dtype=torch.bfloat16)
    q, k = torch.zeros(2, 4, 3, 8, dtype=torch.bfloat16), torch.zeros(2, 2, 3, 8, dtype=torch.bfloat16)
    assert registry.resolve("rotary_kv_write", 90, rotary_kv_write_node(q, k, k, cache)) is not None
    assert registry.resolve("rotary_kv_write", 90, rotary_kv_write_node(q.float(), k.float(), k, cache)) is not None
    for bad in (
        rotary_kv_write_node(q, k.float(), k, cache),  # rotary: q and k dtypes differ
        rotary_kv_write_node(q[..., :7], k[..., :7], k[..., :7], cache[..., :7]),  # rotary: odd head dim
        rotary_kv_write_node(q, k, k[..., :4], cache),  # kv_write: v narrower than k
        rotary_kv_write_node(q, k[:, :1], k[:, :1], cache),  # kv_write: fewer heads than the cache
        rotary_kv_write_node(q, k, k, cache, layer=2),  # kv_write: no such layer
    ):
        assert registry.resolve("rotary_kv_write", 90, bad) is None, bad.args


def test_silu_mul_needs_an_even_float_last_dim() -> None:
    def act(x):
        return ops.silu_mul(x)

    def node(x: torch.Tensor) -> torch.fx.Node:
        gm = make_fx(act, tracing_mode="fake")(x)
        return next(n for n in gm.graph.nodes if n.target == ops.OPS["silu_mul"])

    assert registry.resolve("silu_mul", 90, node(torch.zeros(3, 4, 16)[..., 2:14])) is not None
    assert registry.resolve("silu_mul", 90, node(torch.zeros(16, 3).t())) is not None  # strided last dim
    assert registry.resolve("silu_mul", 90, node(torch.zeros(3, 15))) is None
    assert registry.resolve("silu_mul", 90, node(torch.zeros(3, 16, dtype=torch.float64))) is None


def test_traced_nodes_fit() -> None:
    for op, node in hot_nodes().items():
        assert registry.resolve(op, 90, node) is not None, op


def test_unsupported_head_dim_falls_back_to_reference() -> None:
    node = hot_nodes(head_dim=96)["attention"]
    assert registry.resolve("attention", 90) is not None
    assert registry.resolve("attention", 90, node) is None


def test_node_without_fake_values_falls_back_to_reference() -> None:
    graph = torch.fx.Graph()
    x, weight = graph.placeholder("x"), graph.placeholder("weight")
    node = graph.call_function(torch.ops.graphspec.rms_norm.default, (x, weight, 1e-5))
    assert registry.resolve("rms_norm", 90, node) is None


def test_mixed_dtypes_fall_back_to_reference() -> None:
    inputs = hot_inputs()
    inputs[2] = inputs[2].to(torch.bfloat16)  # norm weight bf16, activations fp32
    inputs[11] = inputs[11].to(torch.bfloat16)  # draft logits bf16, target logits fp32
    nodes = {n.target: n for n in traced(inputs).graph.nodes}
    assert registry.resolve("rms_norm", 90, nodes[torch.ops.graphspec.rms_norm.default]) is None
    assert registry.resolve("verify_rejection", 90, nodes[torch.ops.graphspec.verify_rejection.default]) is None


@pytest.mark.parametrize("entry", list(registry.cpu_entries()), ids=lambda e: e.op)
def test_cpu_entry_takes_the_reference_schema(entry: registry.KernelEntry) -> None:
    """A CPU kernel op is the reference op under another name: same arguments, returns and mutation,
    no config; resolving "cpu" gives it back, and only where the node's tensors are on the CPU."""
    reference = registry.REFERENCE_OPS[entry.op]._schema  # a graphspec op, or aten's (mm)
    assert [a.name for a in entry.kernel._schema.arguments] == [a.name for a in reference.arguments]
    assert [str(r.type) for r in entry.kernel._schema.returns] == [str(r.type) for r in reference.returns]
    assert entry.kernel._schema.is_mutable == reference.is_mutable
    assert entry.name == f"graphspec::{entry.op}_cpu" and entry.config == {} and entry.sm == registry.CPU
    assert registry.resolve(entry.op, registry.CPU) == entry


def test_cpu_table_resolves_on_cpu_nodes_only() -> None:
    nodes = hot_nodes()
    assert registry.resolve("attention", registry.CPU, nodes["attention"]) is not None
    assert registry.resolve("rms_norm", registry.CPU, nodes["rms_norm"]) is not None
    assert registry.resolve("verify_greedy", registry.CPU, nodes["verify_greedy"]) is None  # not in the table
    meta = make_fx(lambda q, cache: ops.attention(q, cache, 0, torch.tensor([0]), torch.tensor([0]), 0.1))(
        torch.zeros(1, 2, 1, 8, device="meta"), torch.zeros(1, 2, 2, 2, 4, 8, device="meta")
    )
    node = next(n for n in meta.graph.nodes if n.target == ops.OPS["attention"])
    assert registry.resolve("attention", registry.CPU, node) is None


def prefill_attention_node(head_dim: int) -> torch.fx.Node:
    def prefill(q, k, v, cache, slot_ids, start_pos):
        return ops.OPS["prefill_attention"](q, k, v, cache, 1, slot_ids, start_pos, head_dim**-0.5)

    q, k, v = (torch.randn(1, 2, 16, head_dim) for _ in range(3))
    cache = torch.zeros(2, 2, 2, 2, 64, head_dim)
    gm = make_fx(prefill, tracing_mode="fake")(q, k, v, cache, torch.tensor([0]), torch.tensor([0]))
    return next(n for n in gm.graph.nodes if n.target is ops.OPS["prefill_attention"])


@pytest.mark.parametrize(("head_dim", "lowered"), [(128, True), (256, True), (96, False), (512, False)])
def test_prefill_attention_takes_only_the_prefill_kernels_head_dims(head_dim: int, lowered: bool) -> None:
    # Heads of 64, 128 and 256 (the hybrid families') lower; others keep the reference.
    assert (registry.resolve("prefill_attention", 90, prefill_attention_node(head_dim)) is not None) is lowered


def test_cpu_table_keeps_the_reference_for_a_non_causal_rotary_kv_attention() -> None:
    """The CPU row loop is causal only: a DFlash block's fused op (causal=False) keeps the reference."""
    q, k, v, cos, sin, cache, slots, start = graphs.rotary_kv_chain_inputs(torch.float32)

    def fused(causal: bool):
        def call(q, k, v, cos, sin, cache, slots, start):
            return ops.rotary_kv_attention(q, k, v, cos, sin, cache, 1, slots, start, 0.3, None, None, 1e-6, causal)

        return call

    for causal, lowered in ((True, True), (False, False)):
        gm = make_fx(fused(causal), tracing_mode="fake")(q, k, v, cos, sin, cache, slots, start)
        node = next(n for n in gm.graph.nodes if n.target is ops.OPS["rotary_kv_attention"])
        assert (registry.resolve("rotary_kv_attention", registry.CPU, node) is not None) is lowered


def silu_mul_node(rows: int) -> torch.fx.Node:
    gm = make_fx(ops.OPS["silu_mul"], tracing_mode="fake")(torch.randn(rows, 16))
    return next(n for n in gm.graph.nodes if n.target is ops.OPS["silu_mul"])


def test_shape_class_rows() -> None:
    """A node of a shape class the kernel names takes the (sm, class) row where the table has one, else the
    SM's row; without a node, or on an SM without such a row, the SM's (or the default) row."""
    silu_mul = registry._module("silu_mul")
    many, few = silu_mul_node(silu_mul.MANY_ROWS), silu_mul_node(silu_mul.MANY_ROWS - 1)
    assert registry.resolve("silu_mul", 90, many).sm == (90, "many_rows")
    assert registry.resolve("silu_mul", 90, many).config == silu_mul.CONFIGS[(90, "many_rows")]
    assert registry.resolve("silu_mul", 90, many).row == "90:many_rows"  # as dumps show it
    assert registry.resolve("silu_mul", 90, few).row == 90
    assert registry.resolve("silu_mul", 90, few).sm == 90
    assert registry.resolve("silu_mul", 90).sm == 90
    assert registry.resolve("silu_mul", 80, many).sm == 80
    assert registry.resolve("silu_mul", 120, many).sm == "default"
    # Elementwise: every row gives the same bits, so invariant numerics keep the SM's row.
    assert registry.resolve("silu_mul", 90, many, numerics=registry.INVARIANT).sm == 90
    assert registry.resolve("prefill_attention", 90, prefill_attention_node(256)).sm == (90, "head_dim_256")
    assert registry.resolve("prefill_attention", 90, prefill_attention_node(128)).sm == 90


def test_scaled_silu_mul_takes_wide_tiles_from_a_verify_s_rows() -> None:
    """The folded-norm SwiGLU re-reads x per program, so its wide tiles start at its own MANY_ROWS (48: a verify
    block of B = 16, K = 4 is 80 rows), far below silu_mul's 512."""
    scaled = registry._module("scaled_silu_mul")

    def node(rows: int) -> torch.fx.Node:
        gm = make_fx(ops.OPS["scaled_silu_mul"], tracing_mode="fake")(torch.randn(rows, 16), torch.randn(rows, 8), 1e-5)
        return next(n for n in gm.graph.nodes if n.target is ops.OPS["scaled_silu_mul"])

    assert 16 < scaled.MANY_ROWS <= 80
    assert registry.resolve("scaled_silu_mul", 90, node(80)).config == scaled.CONFIGS[(90, "many_rows")]
    assert registry.resolve("scaled_silu_mul", 90, node(scaled.MANY_ROWS - 1)).config == scaled.CONFIGS[90]
    assert registry.resolve("scaled_silu_mul", 90, node(1)).config["tile_elems"] == 512


def test_config_tables_refuse_malformed_shape_class_rows() -> None:
    from graphspec.kernels.common import check_config_table

    row = {"tile_elems": 512, "num_warps": 4}
    assert check_config_table({"default": row, 90: row, (90, "many_rows"): row}) == ("tile_elems", "num_warps")
    for key in ((80, "many_rows"), (90,), (90, 3)):
        with pytest.raises(ValueError, match="shape-class row"):
            check_config_table({"default": row, 90: row, key: row})
