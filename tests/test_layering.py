"""The package's import graph: no cycles, and no module imports "up" (runtime from passes, passes from the
lowering, anything from benchmarks/ or tools/). Read from the source with ast, function-level imports included,
so a lazy import cannot hide a cycle."""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx
import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "graphspec"

# (importer prefix, imported prefix) pairs that must not occur.
FORBIDDEN = [
    ("graphspec.runtime", "graphspec.passes"),
    ("graphspec.passes", "graphspec.lowering"),
    ("graphspec.passes", "graphspec.runtime"),
    ("graphspec.lowering", "graphspec.runtime"),
    ("graphspec", "benchmarks"),
    ("graphspec", "tools"),
]


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def type_checking_imports(tree: ast.AST) -> set[ast.AST]:
    """Import statements under `if TYPE_CHECKING:` (annotations only: never run, so never a cycle)."""
    guarded = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            guarded.update(child for statement in node.body for child in ast.walk(statement))
    return guarded


def imported_names(tree: ast.AST, modules: set[str]) -> set[str]:
    """Every module an import statement names; `from pkg import mod` counts as importing pkg.mod."""
    names = set()
    guarded = type_checking_imports(tree)
    for node in ast.walk(tree):
        if node in guarded:
            continue
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                names.add(full if full in modules else node.module)
    return names


def import_graph() -> nx.DiGraph:
    paths = {module_name(path): path for path in PACKAGE.rglob("*.py")}
    graph = nx.DiGraph()
    for module, path in paths.items():
        graph.add_node(module)
        for name in imported_names(ast.parse(path.read_text()), set(paths)):
            if name != module and (name in paths or name.split(".")[0] in ("benchmarks", "tools")):
                graph.add_edge(module, name)
    return graph


def is_under(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def test_the_package_has_no_import_cycle():
    assert list(nx.simple_cycles(import_graph())) == []


@pytest.mark.parametrize(("importer", "imported"), FORBIDDEN)
def test_no_module_imports_up(importer, imported):
    edges = [(a, b) for a, b in import_graph().edges if is_under(a, importer) and is_under(b, imported)]
    assert edges == []


def test_the_checker_sees_imports_inside_functions():
    tree = ast.parse("import os\ndef f():\n    from graphspec.passes import split_attention\n")
    assert imported_names(tree, {"graphspec.passes", "graphspec.passes.split_attention"}) == {
        "os",
        "graphspec.passes.split_attention",
    }


def test_the_checker_skips_annotation_only_imports():
    tree = ast.parse("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from graphspec.runtime import runtime\n")
    assert imported_names(tree, {"graphspec.runtime.runtime"}) == {"typing"}
