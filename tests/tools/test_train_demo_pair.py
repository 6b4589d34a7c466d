"""CPU smoke test of tools/train_demo_pair.py --smoke: the whole pipeline (tokenizer, target, draft, both
heads, saving, acceptance of every drafter, samples, metadata) runs on a slice of the corpus with tiny
models, and writes what the demo pair's loaders and tests read."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tools"))

import demo_heads  # noqa: E402
import demo_pair_readme  # noqa: E402
import demo_training  # noqa: E402
import train_demo_pair  # noqa: E402

from graphspec.examples import file_sha256  # noqa: E402


def test_smoke_run_writes_pair_heads_and_metadata(tmp_path):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        train_demo_pair.main(["--smoke", "--out", str(tmp_path), "--device", "cpu"])
    finally:
        torch.set_num_threads(threads)
    metadata = json.loads((tmp_path / "metadata.json").read_text())
    for name, digest in metadata["sha256"].items():
        assert file_sha256(tmp_path / name) == digest, name
    assert {name.split("/")[0] for name in metadata["sha256"]} == {"target", "draft", "mtp", "eagle3"}
    target_config = json.loads((tmp_path / "target" / "config.json").read_text())
    mtp = demo_heads.MtpHead.load(tmp_path / "mtp")
    assert mtp.config.hidden_size == target_config["hidden_size"]
    eagle3 = demo_heads.Eagle3Head.load(tmp_path / "eagle3")
    assert eagle3.fc.in_features == 3 * target_config["hidden_size"]
    assert eagle3.aux_layer_ids == demo_heads.default_aux_layers(target_config["num_hidden_layers"])
    assert metadata["heads"]["eagle3"]["draft_vocab_size"] == len(eagle3.d2t) == 256
    acceptance = metadata["acceptance"]["by_new_tokens"]["8"]
    assert set(acceptance) == {"draft", "mtp", "eagle3", "ngram"}
    for result in acceptance.values():
        assert result["prompts"] == 2 and 0 <= result["mean_accepted"] <= 4
    assert [sample["prompt"] for sample in metadata["samples"]] == list(train_demo_pair.SAMPLE_PROMPTS)
    for phase in ("target", "draft"):
        assert metadata[phase]["steps_done"] == 3 and not metadata[phase]["stopped_early_by_deadline"]
    assert all(metadata["heads"][name]["steps_done"] == 3 for name in ("mtp", "eagle3"))
    # The README is written from these files: every hash, and every drafter's measured acceptance.
    readme = demo_pair_readme.render(tmp_path)
    assert all(f"`{digest}`" in readme for digest in metadata["sha256"].values())
    assert all(f"**{result['mean_accepted']:.3f}**" in readme for result in acceptance.values())


def test_target_phase_saved_then_resumed_gives_a_whole_pair(tmp_path):
    """--stop-after-target then --target-from (the target phase in a device call of its own): the second run
    trains on the saved target and tokenizer, ships that target unchanged, and records its phase."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        train_demo_pair.main(["--smoke", "--out", str(tmp_path / "a"), "--device", "cpu", "--stop-after-target"])
        assert sorted(p.name for p in (tmp_path / "a").iterdir()) == ["target", train_demo_pair.TARGET_PHASE]
        first = file_sha256(tmp_path / "a" / "target" / "model.safetensors")
        flags = ["--smoke", "--out", str(tmp_path / "b"), "--device", "cpu", "--heads", "mtp"]
        train_demo_pair.main([*flags, "--target-from", str(tmp_path / "a")])
    finally:
        torch.set_num_threads(threads)
    metadata = json.loads((tmp_path / "b" / "metadata.json").read_text())
    assert metadata["sha256"]["target/model.safetensors"] == first
    phase = json.loads((tmp_path / "a" / train_demo_pair.TARGET_PHASE).read_text())
    assert metadata["target"]["log"] == phase["target"]["log"] and "--stop-after-target" in phase["target"]["command"]
    assert metadata["draft"]["steps_done"] == 3 and set(metadata["heads"]) == {"mtp"}
    # A whole pair is a target source too (its metadata.json holds the phase), and its draft a starting point:
    # the draft trained further alone, its earlier run kept in the record.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        train_demo_pair.main(["--smoke", "--out", str(tmp_path / "c"), "--device", "cpu", "--heads", "",
                              "--target-from", str(tmp_path / "b"), "--draft-from", str(tmp_path / "b")])  # fmt: skip
    finally:
        torch.set_num_threads(threads)
    again = json.loads((tmp_path / "c" / "metadata.json").read_text())
    assert again["sha256"]["target/model.safetensors"] == first and again["target"]["log"] == phase["target"]["log"]
    earlier = again["draft"]["continued_from"]
    assert earlier["command"] == metadata["draft"]["command"] and earlier["final"] == metadata["draft"]["final"]
    assert again["draft"]["shape"] == metadata["draft"]["shape"]
    assert again["draft"]["steps_done"] == 3 and "--draft-from" in again["draft"]["command"]
    # The README names each run with what it made: the target's, the draft's two, the head's.
    runs = demo_pair_readme.training_runs(again)
    assert [command for _, command in runs] == [
        phase["target"]["command"],
        metadata["draft"]["command"],
        again["draft"]["command"],
    ]
    assert "the draft's next 3 steps" in runs[2][0]


def test_step_cap_fits_the_budget_and_keeps_the_requested_count_when_it_fits():
    cap = demo_training.StepCap(steps=10_000, budget=1.0)
    for step in range(1, demo_training.StepCap.PROBE + 1):
        cap.after_step(step)  # steps that take no time: everything fits
    assert (cap.steps, cap.capped) == (10_000, False)
    slow = demo_training.StepCap(steps=10_000, budget=1.0)
    for step in range(1, demo_training.StepCap.PROBE + 1):
        if step == demo_training.StepCap.WARM:
            slow.after_step(step)
            slow.warm_at -= 0.5  # pretend the 20 probe steps took 0.5 s: 25 ms each
        elif step == demo_training.StepCap.PROBE:
            slow.after_step(step)
    assert slow.capped and demo_training.StepCap.PROBE <= slow.steps <= 25 + int(0.9 / 0.025)


@pytest.mark.gpu
def test_smoke_run_on_the_gpu(tmp_path):
    """The GPU paths the CPU smoke run cannot take: bf16 autocast, fused AdamW, SDPA with the unroll's mask."""
    train_demo_pair.main(["--smoke", "--out", str(tmp_path), "--device", "cuda"])
    metadata = json.loads((tmp_path / "metadata.json").read_text())
    assert set(metadata["acceptance"]["by_new_tokens"]["8"]) == {"draft", "mtp", "eagle3", "ngram"}
    assert all(metadata["heads"][name]["steps_done"] == 3 for name in ("mtp", "eagle3"))


@pytest.mark.parametrize(
    "flags, named",
    [
        (["--heads", "mtp,medusa"], "--heads"),
        (["--target-shape", "384,8,1024"], "--target-shape"),
        (["--accept-new-tokens", "128,x"], "--accept-new-tokens"),
        (["--eagle3-draft-vocab", "9000"], "--eagle3-draft-vocab"),
    ],
)
def test_bad_flags_are_refused_before_any_work(flags, named, capsys):
    with pytest.raises(SystemExit):
        train_demo_pair.parse_args(["--out", "/nonexistent/never-written", *flags])
    assert named in capsys.readouterr().err


def test_draft_from_a_draft_that_cannot_continue_is_refused_before_any_work(tmp_path, capsys):
    def refusal(*flags: str) -> str:
        with pytest.raises(SystemExit):
            train_demo_pair.parse_args(["--out", str(tmp_path / "out"), "--draft-from", str(tmp_path), *flags])
        return capsys.readouterr().err

    (tmp_path / "draft").mkdir()
    config = {"hidden_size": 64, "num_hidden_layers": 2, "intermediate_size": 64, "num_attention_heads": 2,
              "num_key_value_heads": 2, "vocab_size": 4096}  # fmt: skip
    (tmp_path / "draft" / "config.json").write_text(json.dumps(config))
    assert "metadata.json" in refusal()
    (tmp_path / "metadata.json").write_text("{}")
    assert "--draft-shape" in refusal("--draft-shape", "64,2,64,2,2")
    assert "vocabulary is 4096, the target's 8192" in refusal("--vocab-size", "8192")
    train_demo_pair.parse_args(["--out", str(tmp_path / "out"), "--draft-from", str(tmp_path)])  # this one fits


def test_target_from_a_directory_without_a_saved_target_phase_is_refused(tmp_path, capsys):
    (tmp_path / "target").mkdir()
    with pytest.raises(SystemExit):
        train_demo_pair.parse_args(["--out", str(tmp_path / "out"), "--target-from", str(tmp_path)])
    assert "target_phase.json" in capsys.readouterr().err


def test_a_corpus_without_the_held_out_modules_is_refused_before_tokenizing(tmp_path, monkeypatch):
    (tmp_path / "lib" / "mypackage").mkdir(parents=True)
    (tmp_path / "lib" / "mypackage" / "a.py").write_text("x = 1\n")
    monkeypatch.setattr(train_demo_pair, "train_tokenizer", lambda *a: pytest.fail("tokenized"))
    with pytest.raises(SystemExit, match="none of the held-out modules"):
        train_demo_pair.main(["--smoke", "--stdlib", str(tmp_path / "lib"), "--out", str(tmp_path / "out")])


def test_step_cap_fits_again_once_the_first_evaluation_says_what_evaluations_cost():
    cap = demo_training.StepCap(steps=10_000, budget=10.0)
    cap.per_step = 0.001  # the probe's 1 ms a step: 9,000 steps would fit
    cap.after_evaluation(250, seconds=0.5, every=250)  # but each evaluation takes 0.5 s: 3 ms a step in all
    assert cap.capped and 250 <= cap.steps <= 250 + int(10.0 / 0.003)
    fitted = cap.steps
    cap.after_evaluation(500, seconds=5.0, every=250)  # fitted once: later evaluations do not move it
    assert cap.steps == fitted
    cheap = demo_training.StepCap(steps=1_000, budget=10.0)
    cheap.per_step = 0.001
    cheap.after_evaluation(250, seconds=0.01, every=250)  # everything still fits: the request stands
    assert (cheap.steps, cheap.capped) == (1_000, False)
