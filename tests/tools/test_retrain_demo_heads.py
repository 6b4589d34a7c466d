"""CPU smoke test of tools/retrain_demo_heads.py --smoke on a copy of the demo pair: the heads are trained again
and saved, their records and file hashes replaced, their stale acceptance dropped, everything else kept."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tools"))

import demo_heads  # noqa: E402
import demo_pair_readme  # noqa: E402
import retrain_demo_heads  # noqa: E402

from graphspec.examples import DEMO_PAIR_DIR, file_sha256  # noqa: E402


@pytest.fixture
def pair(tmp_path):
    copy = tmp_path / "pair"
    shutil.copytree(DEMO_PAIR_DIR, copy)
    return copy


def test_smoke_run_replaces_only_the_retrained_head(pair, tmp_path):
    extra = tmp_path / "extra" / "pkg"
    extra.mkdir(parents=True)
    (extra / "mod.py").write_text("def add(a, b):\n    return a + b\n" * 40)
    before = json.loads((pair / "metadata.json").read_text())
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        args = ["--pair", str(pair), "--heads", "mtp", "--seconds", "60", "--device", "cpu", "--smoke"]
        retrain_demo_heads.main([*args, "--extra-corpus", str(extra)])
    finally:
        torch.set_num_threads(threads)
    after = json.loads((pair / "metadata.json").read_text())
    for name, digest in after["sha256"].items():
        assert file_sha256(pair / name) == digest, name
    assert after["sha256"]["mtp/model.safetensors"] != before["sha256"]["mtp/model.safetensors"]
    assert {k: v for k, v in after["sha256"].items() if not k.startswith("mtp/")} == {
        k: v for k, v in before["sha256"].items() if not k.startswith("mtp/")
    }
    mtp = after["heads"]["mtp"]
    assert mtp["steps_done"] == 2 and "retrain_demo_heads.py" in mtp["command"]
    assert mtp["retrained_over"]["steps_done"] == before["heads"]["mtp"]["steps_done"]
    assert after["heads"]["eagle3"] == before["heads"]["eagle3"] and after["dflash"] == before["dflash"]
    assert all("mtp" not in measured for measured in after["acceptance"]["by_new_tokens"].values())
    assert all("eagle3" in measured for measured in after["acceptance"]["by_new_tokens"].values())
    assert demo_heads.MtpHead.load(pair / "mtp").config.hidden_size == 384
    # The README names the retraining run and the steps of the run it replaced.
    readme = demo_pair_readme.render(pair)
    assert f"the pair's run gave it {before['heads']['mtp']['steps_done']}" in readme
    assert "retrain_demo_heads.py --pair" in readme


@pytest.mark.parametrize(
    ("flags", "named"),
    [(["--heads", "draft"], "--heads"), (["--seconds", "0"], "--seconds"), (["--pair", "/nonexistent"], "--pair")],
)
def test_bad_flags_are_refused(flags, named, capsys):
    with pytest.raises(SystemExit):
        retrain_demo_heads.main(flags)
    assert named in capsys.readouterr().err


def test_a_missing_extra_corpus_directory_is_refused(pair, tmp_path):
    with pytest.raises(SystemExit, match="not found"):
        retrain_demo_heads.main(["--pair", str(pair), "--smoke", "--extra-corpus", str(tmp_path / "nope")])
