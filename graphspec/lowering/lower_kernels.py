"""Swap hot reference ops (attention, norms, rotary, SwiGLU, KV writes, verify, gathers) for ctx.sm's Triton kernels.

Input:  a flat, in-place step graph (after defunctionalize_kv and fuse_rotary_kv) whose hot ops are
        graphspec reference ops, each carrying fake tensors in its arguments' meta["val"].
Output: each such node whose kernel fits (lowering/registry.py) calls graphspec::<op>_triton with the
        same arguments plus the chosen config as trailing ints, so the printed graph shows the config
        and re-loads as source. The node keeps its name, users and meta["val"] (same outputs), and is
        tagged meta["gs_pass"] and meta["gs_kernel"]. Other nodes are untouched. Nodes are retargeted
        in place, never moved or erased, and no dead-code elimination runs: an in-place kv_write has
        no users, and its kernel op (mutates_args=("cache",)) keeps its position and its effect. By default
        aten.mm/addmm/addmm_ are lowered only where kernels/gemv.py's shape_class names the product (one row;
        two rows of a narrow weight); cuBLAS keeps the others.
        ctx.numerics == "invariant" lowers to the row-invariant kernels (registry.resolve) and aten.mm/addmm
        to kernels/mm.py, then refuses a graph in which a reduction is left without one (NOT_INVARIANT),
        naming its nodes. Prefill programs too (fuse_prefill_attention leaves their attention to the
        decode kernel then): a draft model's first catch-up forward recomputes the last prompt position,
        which must come out as the target's prefill wrote it.
        On CPU (ctx.sm None) or with ctx.lowering == "reference" nothing changes;
        ctx.options["force_sm"] (an int) lowers for that SM anyway, which is how the interpreter tests
        (TRITON_INTERPRET=1) run kernels on CPU.

The CPU table (registry.CPU_KERNELS) is applied by the runtime, not here: lower_for_cpu() rewrites the
copy of a step that a CPU StepGraph runs (runtime/graphs.py). Compiled graphs and artifacts keep the
reference ops on the CPU, so they stay the test oracle and compare bit for bit with the traced program.

    rms_norm(x, w, 1e-05)   becomes   rms_norm_triton(x, w, 1e-05, 4096, 4)
"""

from __future__ import annotations

import torch
import torch.fx as fx

from graphspec.config import PassContext, PassResult
from graphspec.errors import InputError
from graphspec.lowering import registry
from graphspec.op_nodes import positional_args

NAME = "lower_kernels"

# Reference op target -> op name, for the ops the registry has kernels for (Triton; CPU).
REFERENCE_OPS = {target: name for name, target in registry.REFERENCE_OPS.items() if name in registry.KERNELS}
CPU_REFERENCE_OPS = {target: name for name, target in registry.REFERENCE_OPS.items() if name in registry.CPU_KERNELS}

# Reductions whose result for a row may depend on what else shares the call (their split or summation
# order follows the shapes), as references: under numerics="invariant" none may stay in a graph.
_aten = torch.ops.aten
_REDUCING = (
    "rms_norm", "add_rms_norm", "offset_rms_norm", "add_offset_rms_norm", "gated_rms_norm", "attention",
    "block_attention",
    "rotary_kv_attention", "prefill_attention", "sample", "verify_rejection", "causal_conv1d",
    "causal_conv1d_snapshots", "gated_delta_rule", "gated_delta_rule_snapshots", "mm", "addmm", "addmm_in_place",
    "scaled_silu_mul_linear",
)  # fmt: skip
_ATEN_REDUCING = (
    _aten.bmm.default, _aten.baddbmm.default, _aten._softmax.default, _aten._log_softmax.default,
    _aten.sum.dim_IntList, _aten.mean.dim, _aten.var_mean.correction, _aten.linalg_vector_norm.default,
    _aten.logsumexp.default, _aten.cumsum.default,
)  # fmt: skip
NOT_INVARIANT = frozenset({registry.REFERENCE_OPS[name] for name in _REDUCING} | set(_ATEN_REDUCING))


def target_sm(ctx: PassContext) -> int | None:
    """The SM to lower for: options["force_sm"] when it is an int, else ctx.sm (None on CPU)."""
    forced = ctx.options.get("force_sm")
    if isinstance(forced, int) and not isinstance(forced, bool):
        return forced
    return ctx.sm


def kernel_table(gm: fx.GraphModule) -> list[tuple[str, str, str]]:
    """(node name, kernel, config) for every lowered node, nested pieces included (split graphs
    name them piece.node); the pipeline runner writes this as kernels.txt."""
    rows = []
    for prefix, module in gm.named_modules():
        if not isinstance(module, fx.GraphModule):
            continue
        for node in module.graph.nodes:
            chosen = node.meta.get("gs_kernel")
            if chosen is None or node.op != "call_function":
                continue
            config = " ".join([f"sm={chosen['sm']}", *(f"{key}={value}" for key, value in chosen["config"].items())])
            rows.append((f"{prefix}.{node.name}" if prefix else node.name, chosen["kernel"], config))
    return rows


def run(gm: fx.GraphModule, ctx: PassContext) -> PassResult:
    if ctx.lowering == "reference":
        return PassResult(gm, changed=False, note="lowering=reference: every op keeps its torch reference")
    sm = target_sm(ctx)
    if sm is None:
        return PassResult(gm, changed=False, note="no GPU (sm=None): every op keeps its torch reference")
    lowered, fallback = 0, 0
    for node in gm.graph.nodes:
        if node.op != "call_function" or node.target not in REFERENCE_OPS:
            continue
        entry = registry.resolve(REFERENCE_OPS[node.target], sm, node, ctx.numerics)
        if entry is None:  # no kernel for this SM, or the node's shapes/dtypes are outside the kernel's
            fallback += 1
            continue
        node.args = positional_args(node) + entry.config_args
        node.kwargs = {}
        node.target = entry.kernel
        node.meta["gs_pass"] = NAME
        node.meta["gs_kernel"] = {"kernel": entry.name, "sm": entry.row, "config": dict(entry.config)}
        lowered += 1
    stats = {"lowered": lowered, "fallback": fallback}
    if ctx.numerics == registry.INVARIANT:
        check_invariant(gm, sm)
    if not lowered:
        return PassResult(gm, changed=False, stats=stats, note=f"no kernel fits on sm={sm}")
    gm.graph.lint()
    gm.recompile()
    return PassResult(gm, changed=True, stats=stats, note=f"sm={sm}")


def check_invariant(gm: fx.GraphModule, sm: int) -> None:
    """Refuse a graph (a step or a prefill program) that numerics="invariant" cannot make row-invariant: a
    reduction left without an invariant kernel (on this SM, or at these shapes) would round differently for
    a row computed alone and in a verify block, and a draft equal to the target would be rejected."""
    left = [node for node in gm.graph.nodes if node.op == "call_function" and node.target in NOT_INVARIANT]
    if left:
        names = ", ".join(f"{node.name} ({node.target})" for node in left[:8])
        more = f" and {len(left) - 8} more" if len(left) > 8 else ""
        raise InputError(
            f"numerics='invariant': {len(left)} reductions of this graph have no row-invariant kernel on "
            f"sm_{sm} for their op, shapes or dtypes: {names}{more}. Supported: greedy steps of attention "
            "decoders (Llama, Qwen2/3 families) with head dims 64, 128 or 256, on sm_80+; compile with "
            "numerics='default' otherwise"
        )


def lower_for_cpu(gm: fx.GraphModule) -> int:
    """Retarget, in place, every reference op of `gm` (nested pieces included) that the CPU table has
    a kernel for; return how many. The CPU kernels take exactly the reference's arguments (and
    whatever the reference accepts), so no fake values are needed: artifacts do not store them.
    For graphs that run on the CPU only; nodes keep names, positions, users and meta["val"]."""
    lowered = 0
    for _, module in gm.named_modules():
        if not isinstance(module, fx.GraphModule):
            continue
        for node in module.graph.nodes:
            if node.op != "call_function" or node.target not in CPU_REFERENCE_OPS:
                continue
            entry = registry.resolve(CPU_REFERENCE_OPS[node.target], registry.CPU)
            node.args = positional_args(node)
            node.kwargs = {}
            node.target = entry.kernel
            node.meta["gs_kernel"] = {"kernel": entry.name, "sm": entry.sm, "config": {}}
            lowered += 1
        module.recompile()
    return lowered
