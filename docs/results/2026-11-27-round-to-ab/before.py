# ruff: noqa  (kept with its results)
"""Kernel modules as they were at a commit, importable beside today's: `git show REV:kernels/NAME.py` into
a temporary package, graphspec.kernels imports pointed at it and the torch.library registrations cut (the
ops are registered by today's modules already). Used by the A/B scripts in this folder and the one beside.

    old = before.load("4cac85a", ["common", "rms_norm", "silu_mul"])   # {"silu_mul": module, ...}
"""

import importlib
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]


def load(rev: str, names: list[str]) -> dict:
    package = f"kernels_{rev}"
    root = Path(tempfile.mkdtemp(prefix="ab_before_"))
    (root / package).mkdir()
    (root / package / "__init__.py").write_text("")
    for name in names:
        source = subprocess.run(
            ["git", "show", f"{rev}:kernels/{name}.py"], cwd=REPO, check=True, capture_output=True, text=True
        ).stdout
        source = source.replace("graphspec.kernels.", f"{package}.").replace("from graphspec import library\n", "")
        if "@library.op(" in source:
            source = source[: source.index("@library.op(")]
        (root / package / f"{name}.py").write_text(source)
    sys.path.insert(0, str(root))
    return {name: importlib.import_module(f"{package}.{name}") for name in names}
