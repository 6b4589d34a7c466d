"""benchmarks/common.py's provenance: source_info names the files a result came from by git's tree id (hashed
through a scratch index, the checkout's own index untouched) and says whether they are HEAD's; write_json puts
it first in every benchmark's JSON."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from benchmarks import common


def git(root: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", "-c", "user.name=test", "-c", "user.email=test@example.com", *args],
        cwd=root,
        check=True,
        capture_output=True,
        text=True,
    )
    return done.stdout.rstrip("\n")


def test_the_tree_id_names_the_files_as_they_ran_and_leaves_the_index_alone(tmp_path):
    git(tmp_path, "init", "-q")
    (tmp_path / "a.py").write_text("x = 1\n")
    (tmp_path / ".gitignore").write_text("out/\n")
    git(tmp_path, "add", "-A")
    git(tmp_path, "commit", "-qm", "one")
    head, head_tree = git(tmp_path, "rev-parse", "HEAD"), git(tmp_path, "rev-parse", "HEAD^{tree}")

    clean = common.source_info(tmp_path)
    assert (clean["tree"], clean["commit"], clean["matches_commit"]) == (head_tree, head, True)
    assert clean["torch"] and clean["python"] and clean["utc"]

    (tmp_path / "out").mkdir()  # ignored files are not the code
    (tmp_path / "out" / "result.json").write_text("{}")
    assert common.source_info(tmp_path)["tree"] == head_tree

    (tmp_path / "a.py").write_text("x = 2\n")  # an edit and an untracked file are
    (tmp_path / "b.py").write_text("y = 1\n")
    dirty = common.source_info(tmp_path)
    assert dirty["tree"] != head_tree and dirty["commit"] == head and not dirty["matches_commit"]
    assert git(tmp_path, "status", "--porcelain").splitlines() == [" M a.py", "?? b.py"]  # nothing staged

    git(tmp_path, "add", "-A")  # the id is the tree that committing those files makes
    git(tmp_path, "commit", "-qm", "two")
    assert git(tmp_path, "rev-parse", "HEAD^{tree}") == dirty["tree"]


def test_outside_a_repository_nothing_is_claimed(tmp_path, monkeypatch):
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path.parent))
    info = common.source_info(tmp_path)
    assert (info["tree"], info["commit"], info["matches_commit"]) == (None, None, False)


def test_write_json_puts_the_source_first(tmp_path, monkeypatch):
    monkeypatch.setattr(common, "source_info", lambda: {"tree": "abc"})
    common.write_json(tmp_path / "report.json", {"rows": [1], "floors": {}})
    report = json.loads((tmp_path / "report.json").read_text())
    assert list(report) == ["source", "rows", "floors"] and report["source"] == {"tree": "abc"}
    common.write_json(tmp_path / "rows.json", [{"op": "gemv"}], indent=1)  # a list of rows
    assert json.loads((tmp_path / "rows.json").read_text()) == {"source": {"tree": "abc"}, "rows": [{"op": "gemv"}]}
