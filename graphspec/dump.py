"""Write one readable, parseable .py file per pass (plus a .diff against the previous one),
summary.md, and kernels.txt. Only the pipeline runner calls this: dumps never change the graph."""

from __future__ import annotations

import collections
import difflib
import re
from dataclasses import dataclass, field
from pathlib import Path

import torch.fx as fx


@dataclass
class PassRecord:
    index: int
    name: str
    doc: str
    ms: float
    nodes_before: int
    nodes_after: int
    changed: bool
    stats: dict = field(default_factory=dict)
    note: str = ""
    created: list[str] = field(default_factory=list)
    erased: list[str] = field(default_factory=list)
    op_delta: dict[str, int] = field(default_factory=dict)
    skipped: bool = False


def all_nodes(gm: fx.GraphModule) -> list[fx.Node]:
    """Nodes of gm and of every nested GraphModule (split graphs keep their pieces as submodules)."""
    return [node for module in gm.modules() if isinstance(module, fx.GraphModule) for node in module.graph.nodes]


def op_counts(gm: fx.GraphModule) -> collections.Counter:
    return collections.Counter(
        str(node.target) for node in all_nodes(gm) if node.op in ("call_function", "call_module")
    )


def region_spans(gm: fx.GraphModule) -> dict[str, tuple[int, str, str]]:
    """region -> (op count, first node, last node) in graph order (pieces of a split graph included), so
    a reader of a dump can find where the draft, verify and accept parts of the step begin and end."""
    spans: dict[str, list] = {}
    for node in all_nodes(gm):
        region = node.meta.get("gs_region") if node.op == "call_function" else None
        if region is None:
            continue
        span = spans.setdefault(region, [0, node.name, node.name])
        span[0] += 1
        span[2] = node.name
    return {region: (count, first, last) for region, (count, first, last) in spans.items()}


def readable(gm: fx.GraphModule) -> str:
    text = gm.print_readable(print_output=False, include_stride=True, include_device=True)
    # make_fx names its module class "<lambda>"; give every class a valid name so the file parses.
    return re.sub(
        r"class (\S+?)\(torch\.nn\.Module\)",
        lambda m: m.group(0) if m.group(1).isidentifier() else "class GraphModule(torch.nn.Module)",
        text,
    )


def _header(record: PassRecord, gm: fx.GraphModule) -> str:
    lines = [
        f"# [{record.index:02d}] {record.name}: {record.doc}",
        f"# time: {record.ms:.1f} ms  nodes: {record.nodes_before} -> {record.nodes_after}  changed: {record.changed}",
    ]
    if record.skipped:
        lines.append("# SKIPPED (--skip)")
    if record.note:
        lines.append(f"# note: {record.note}")
    if record.stats:
        lines.append(f"# stats: {record.stats}")
    if record.op_delta:
        delta = ", ".join(f"{op} {count:+d}" for op, count in sorted(record.op_delta.items()))
        lines.append(f"# op count change: {delta}")
    for label, names in (("created", record.created), ("erased", record.erased)):
        if names:
            shown = ", ".join(names[:40]) + (f", ... ({len(names)} in all)" if len(names) > 40 else "")
            lines.append(f"# {label}: {shown}")
    spans = region_spans(gm)
    if spans:
        shown = "; ".join(f"{region} {count} ops {first} .. {last}" for region, (count, first, last) in spans.items())
        lines.append(f"# regions: {shown}")
    states = [node for node in gm.graph.find_nodes(op="placeholder") if "gs_state" in node.meta]
    if states:  # each state with its rollback rule (graphspec/state.py ROLLBACKS)
        lines.append("# states: " + ", ".join(f"{node.name} ({node.meta['gs_state']})" for node in states))
    return "\n".join(lines) + "\n\n"


class DumpWriter:
    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.previous: str | None = None
        self.previous_name = ""
        self.last_path: Path | None = None

    def write_graph(self, record: PassRecord, gm: fx.GraphModule) -> Path:
        stem = f"{record.index:02d}_{record.name}"
        text = readable(gm)
        path = self.directory / f"{stem}.py"
        path.write_text(_header(record, gm) + text)
        if self.previous is not None:
            diff = difflib.unified_diff(
                self.previous.splitlines(keepends=True),
                text.splitlines(keepends=True),
                fromfile=f"{self.previous_name}.py",
                tofile=f"{stem}.py",
            )
            (self.directory / f"{stem}.diff").write_text("".join(diff))
        self.previous, self.previous_name, self.last_path = text, stem, path
        return path

    def write_summary(self, records: list[PassRecord], title: str) -> Path:
        lines = [
            f"# {title}",
            "",
            "| # | pass | ms | nodes | changed | stats | note |",
            "| --- | --- | --- | --- | --- | --- | --- |",
        ]
        for r in records:
            stats = ", ".join(f"{k}={v}" for k, v in r.stats.items())
            note = ("SKIPPED " if r.skipped else "") + r.note
            lines.append(
                f"| {r.index:02d} | {r.name} | {r.ms:.1f} | {r.nodes_before}->{r.nodes_after} | {r.changed} "
                f"| {stats} | {note} |"
            )
        path = self.directory / "summary.md"
        path.write_text("\n".join(lines) + "\n")
        return path

    def write_kernels(self, rows: list[tuple[str, str, str]], sm: int | None) -> Path:
        path = self.directory / "kernels.txt"
        header = f"# node -> kernel (sm={sm if sm is not None else 'cpu'}) -> config\n"
        body = "".join(f"{node}\t{kernel}\t{config}\n" for node, kernel, config in rows)
        path.write_text(header + (body or "# no kernels chosen: every hot op runs its torch reference\n"))
        return path
