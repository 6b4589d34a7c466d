"""Swap hot reference ops (attention, norms, rotary, SwiGLU, KV writes, verify) for ctx.sm's Triton kernels.

Input:  a flat, in-place step graph (after defunctionalize_kv and fuse_rotary_kv) whose hot ops are
        graphspec reference ops, each carrying fake tensors in its arguments' meta["val"].
Output: each such node whose kernel fits (lowering/registry.py) calls graphspec::<op>_triton with the
        same arguments plus the chosen config as trailing ints, so the printed graph shows the config
        and re-loads as source. The node keeps its name, users and meta["val"] (same outputs), and is
        tagged meta["gs_pass"] and meta["gs_kernel"]. Other nodes are untouched. Nodes are retargeted
        in place, never moved or erased, and no dead-code elimination runs: an in-place kv_write has
        no users, and its kernel op (mutates_args=("cache",)) keeps its position and its effect.
        On CPU (ctx.sm None) or with ctx.lowering == "reference" nothing changes;
        ctx.options["force_sm"] (an int) lowers for that SM anyway, which is how the interpreter tests
        (TRITON_INTERPRET=1) run kernels on CPU.

The CPU table (registry.CPU_KERNELS) is applied by the runtime, not here: lower_for_cpu() rewrites the
copy of a step that a CPU StepGraph runs (runtime/graphs.py). Compiled graphs and artifacts keep the
reference ops on the CPU, so they stay the test oracle and compare bit for bit with the traced program.

    rms_norm(x, w, 1e-05)   becomes   rms_norm_triton(x, w, 1e-05, 4096, 4)
"""

from __future__ import annotations

import torch.fx as fx

from graphspec import ops
from graphspec.config import PassContext, PassResult
from graphspec.lowering import registry
from graphspec.op_nodes import positional_args

NAME = "lower_kernels"

# Reference op target -> op name, for the ops the registry has kernels for (Triton; CPU).
REFERENCE_OPS = {target: name for name, target in ops.OPS.items() if name in registry.KERNELS}
CPU_REFERENCE_OPS = {target: name for name, target in ops.OPS.items() if name in registry.CPU_KERNELS}


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
        entry = registry.resolve(REFERENCE_OPS[node.target], sm, node)
        if entry is None:  # no kernel for this SM, or the node's shapes/dtypes are outside the kernel's
            fallback += 1
            continue
        node.args = positional_args(node) + entry.config_args
        node.kwargs = {}
        node.target = entry.kernel
        node.meta["gs_pass"] = NAME
        node.meta["gs_kernel"] = {"kernel": entry.name, "sm": entry.sm, "config": dict(entry.config)}
        lowered += 1
    stats = {"lowered": lowered, "fallback": fallback}
    if not lowered:
        return PassResult(gm, changed=False, stats=stats, note=f"no kernel fits on sm={sm}")
    gm.graph.lint()
    gm.recompile()
    return PassResult(gm, changed=True, stats=stats, note=f"sm={sm}")


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
