"""Built-in examples. demo_pair/ holds a small trained target/draft pair, two heads for the target
(MTP, EAGLE-3) and a DFlash drafter for it (see demo_pair/README.md).

This module defines the demo pair's corpus and its train/held-out split, so the training script,
the acceptance measurement and the tests agree on which files were never trained on. It imports
nothing but the standard library: tools/ load it by file path without importing graphspec itself.
"""

from __future__ import annotations

import hashlib
import json
import sysconfig
from pathlib import Path

DEMO_PAIR_DIR = Path(__file__).resolve().parent / "demo_pair"
DEMO_TARGET = DEMO_PAIR_DIR / "target"
DEMO_DRAFT = DEMO_PAIR_DIR / "draft"
DEMO_METADATA = DEMO_PAIR_DIR / "metadata.json"
# Heads trained for the demo target, each a head directory (config.json + model.safetensors; the
# embedding and lm_head are the target's): an MTP head in SGLang's standalone NextN layout and an
# EAGLE-3 head in the public layout. Pass them as `draft` with the demo target.
DEMO_MTP = DEMO_PAIR_DIR / "mtp"
DEMO_EAGLE3 = DEMO_PAIR_DIR / "eagle3"
# A DFlash block drafter for the demo target (z-lab layout, block_size 5: K = 4), trained on CPU by
# tools/train_demo_dflash.py; it reads target layers 1, 3, 5's outputs and uses the target's embedding and lm_head.
DEMO_DFLASH = DEMO_PAIR_DIR / "dflash"

# Corpus: every .py file of a Python standard library, its test suite (Lib/test) included, except
# installed third-party packages and two packages that are generated data tables rather than code.
EXCLUDED_PARTS = ("__pycache__", "site-packages", "dist-packages")
EXCLUDED_TOP_LEVEL = ("encodings", "pydoc_data")
# Held-out split: every file whose top-level package or module is one of these (about 10% of the
# library's bytes). Their tests (test_json/, test_email/, test_httplib.py, test_logging.py, ...: any
# path part named test_<held-out name>*) are in neither split, so no test of held-out code is trained on.
HELDOUT_TOP_LEVEL = ("argparse", "difflib", "email", "http", "json", "logging", "textwrap")


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def split_of(relative_path: str) -> str | None:
    """'train', 'heldout', or None (not in the corpus) for a stdlib-relative posix path."""
    parts = relative_path.split("/")
    top = parts[0].removesuffix(".py")
    if not relative_path.endswith(".py") or set(parts) & set(EXCLUDED_PARTS) or top in EXCLUDED_TOP_LEVEL:
        return None
    if top in HELDOUT_TOP_LEVEL:
        return "heldout"
    names = (part.removesuffix(".py") for part in parts)
    if any(name.startswith("test_") and name[len("test_") :].startswith(HELDOUT_TOP_LEVEL) for name in names):
        return None
    return "train"


def stdlib_files(split: str, root: Path | None = None) -> list[tuple[str, str]]:
    """(relative path, source text) of the corpus files in `split`, sorted by path.
    Files that are not valid UTF-8 are skipped."""
    root = Path(root) if root is not None else stdlib_root()
    found = []
    for path in sorted(root.rglob("*.py")):
        relative = path.relative_to(root).as_posix()
        if split_of(relative) != split or not path.is_file():
            continue
        try:
            found.append((relative, path.read_text(encoding="utf-8")))
        except UnicodeDecodeError:
            continue
    return found


def corpus_fingerprint(files: list[tuple[str, str]]) -> str:
    """sha256 over the sorted (path, sha256 of text) list: identifies the exact files a split held."""
    digest = hashlib.sha256()
    for name, text in files:
        digest.update(f"{name}\0{hashlib.sha256(text.encode()).hexdigest()}\n".encode())
    return digest.hexdigest()


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def load_metadata() -> dict:
    return json.loads(DEMO_METADATA.read_text())
