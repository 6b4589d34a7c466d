"""The ordered pass list and the runner (timing, checks, dumps, errors).

`graphspec compile --list-passes` prints PIPELINE from here, so docs cannot drift from the code.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import torch.fx as fx

from graphspec import checks
from graphspec.config import PassContext
from graphspec.dump import DumpWriter, PassRecord, all_nodes, op_counts
from graphspec.errors import InputError, PassError
from graphspec.lowering import fuse_pointwise, lower_kernels
from graphspec.passes import (
    addmm_in_place,
    defunctionalize_kv,
    fold_constants,
    fuse_kv_attention,
    fuse_prefill_attention,
    fuse_qk_norm,
    fuse_rotary_kv,
    fuse_row_scale,
    insert_verify,
    mask_padding,
    split_attention,
)

log = logging.getLogger("graphspec")

PIPELINE = (
    # Phase 1: speculation structure. Functional graph; padding rows still visible.
    insert_verify,
    mask_padding,
    fold_constants,  # last while the graph is pure: after mask_padding's where(row_valid, x, number)
    # Phase 2: leave functional form. Nothing below may assume purity; no dead-code elimination.
    defunctionalize_kv,
    addmm_in_place,
    # Phase 3: fusions across the in-place KV writes (they need those writes), into reference ops
    # that compute the same bits; before lowering, so fused ops get their kernels like any other op.
    fuse_rotary_kv,
    fuse_kv_attention,
    fuse_qk_norm,
    fuse_row_scale,
    # Phase 4: kernels chosen for ctx.sm (reference ops stay where no kernel fits), then the integer glue
    # between them, one launch per stretch.
    lower_kernels,
    fuse_pointwise,
    # Phase 5: capture regions. Last, so every rewrite above works on one flat graph.
    split_attention,
)
PASS_NAMES = tuple(p.NAME for p in PIPELINE)

# The prefill chunk program (trace_prefill.py): no verify, no padding masks (the runtime points padding
# rows at the spare slot), no capture regions; the same in-place form and kernels as the step.
PREFILL_PIPELINE = (
    # Phase 1: leave functional form (prefill writes the target's and the drafter's states in place).
    defunctionalize_kv,
    addmm_in_place,
    # Phase 2: each layer's KV write and attention become one flash-style prefill attention.
    fuse_prefill_attention,
    # Phase 3: kernels chosen for ctx.sm.
    lower_kernels,
)


@dataclass
class PipelineResult:
    gm: fx.GraphModule
    records: list[PassRecord]
    dump_dir: Path | None


def describe() -> str:
    """One line per pass: index, name, first docstring line; the step's pipeline, then the prefill program's."""
    lines = [f"[{i:02d}] {p.NAME}: {_doc(p)}" for i, p in enumerate(PIPELINE, start=1)]
    lines.append("prefill chunk program:")
    lines += [f"[{i:02d}] {p.NAME}: {_doc(p)}" for i, p in enumerate(PREFILL_PIPELINE, start=1)]
    return "\n".join(lines)


def _doc(module: object) -> str:
    return (module.__doc__ or "").strip().splitlines()[0]


def validate_names(stop_after: str | None, skip: Iterable[str]) -> None:
    for name in [*([stop_after] if stop_after else []), *skip]:
        if name not in PASS_NAMES:
            raise InputError(f"unknown pass {name!r}; passes are: {', '.join(PASS_NAMES)}")


def run_pipeline(
    gm: fx.GraphModule,
    ctx: PassContext,
    dump_dir: str | Path | None = None,
    stop_after: str | None = None,
    skip: Iterable[str] = (),
    check: bool | None = None,
    title: str = "graphspec pipeline",
    on_pass: Callable[[str], None] | None = None,
    passes: tuple[ModuleType, ...] = PIPELINE,
    phase_checks: dict[str, tuple[Callable[[fx.GraphModule], None], ...]] | None = None,
) -> PipelineResult:
    """Run `passes` (PIPELINE, or PREFILL_PIPELINE with checks.PREFILL_PHASE_CHECKS) over gm in order.
    Each pass is timed, checked (GRAPHSPEC_CHECK=1 or check=True) and dumped; a failure names the
    pass, the passes that ran and the last dump written."""
    skip = tuple(skip)
    validate_names(stop_after, skip)
    phase_checks = checks.PHASE_CHECKS if phase_checks is None else phase_checks
    check = os.environ.get("GRAPHSPEC_CHECK") == "1" if check is None else check
    dump_dir = dump_dir or os.environ.get("GRAPHSPEC_DUMP") or None
    writer = DumpWriter(dump_dir) if dump_dir else None
    records: list[PassRecord] = []
    nodes = len(all_nodes(gm))
    if writer:
        traced = PassRecord(0, "traced", "the speculation step as traced", 0.0, nodes, nodes, False)
        writer.write_graph(traced, gm)
    ran: list[str] = []
    for index, module in enumerate(passes, start=1):
        name = module.NAME
        before_ops, before_nodes = op_counts(gm), {n.name for n in all_nodes(gm)}
        if name in skip:
            record = PassRecord(index, name, _doc(module), 0.0, nodes, nodes, False, skipped=True)
        else:
            if on_pass:
                on_pass(name)
            start = time.perf_counter()
            try:
                result = module.run(gm, ctx)
                if check:
                    for invariant in phase_checks.get(name, ()):
                        invariant(result.gm)
            except InputError:
                raise  # a request the compiler cannot serve (it says which), not a pass failure
            except Exception as error:
                last = writer.last_path if writer else "(no dumps: pass --dump-dir)"
                raise PassError(
                    f"pass {name!r} failed ({type(error).__name__}: {error}); passes already run: "
                    f"{', '.join(ran) or 'none'}; last dump: {last}"
                ) from error
            ms = (time.perf_counter() - start) * 1e3
            gm = result.gm
            after_nodes = {n.name for n in all_nodes(gm)}
            after_ops = op_counts(gm)
            delta = {op: after_ops[op] - before_ops[op] for op in set(after_ops) | set(before_ops)}
            record = PassRecord(
                index,
                name,
                _doc(module),
                ms,
                nodes,
                len(all_nodes(gm)),
                result.changed,
                dict(result.stats),
                result.note,
                created=sorted(after_nodes - before_nodes),
                erased=sorted(before_nodes - after_nodes),
                op_delta={op: d for op, d in delta.items() if d},
            )
            nodes = record.nodes_after
            ran.append(name)
            log.info("[%02d] %s %.1f ms %d->%d nodes", index, name, ms, record.nodes_before, record.nodes_after)
        records.append(record)
        if writer:
            writer.write_graph(record, gm)
        if name == stop_after:
            break
    if writer:
        writer.write_summary(records, title)
        writer.write_kernels(lower_kernels.kernel_table(gm), ctx.sm)
    return PipelineResult(gm, records, Path(dump_dir) if dump_dir else None)
