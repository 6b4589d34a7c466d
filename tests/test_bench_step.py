"""CPU smoke test of benchmarks/bench_step.py on the tiny Llama and Qwen3 stand-ins: checkpoints are
written through graphspec's checkpoint layout and load through the real loader, every bucket gets a
row, captured (here: eager-recorded on CPU) and eager generate() agree token for token, and the step
regions are measured. Timings on CPU mean nothing; only the structure is checked."""

from __future__ import annotations

import json

import pytest

from benchmarks import bench_step


# The Llama run also times the sampling step (--sampling): the flag only adds a sampled timing per row,
# so one run checks both reports; the Qwen3 run keeps the default, greedy-only report.
@pytest.mark.parametrize(("preset", "sampling"), [("tiny-llama", True), ("tiny-qwen3", False)])
def test_tiny_preset_runs_and_reports(tmp_path, capsys, preset: str, sampling: bool) -> None:
    report = tmp_path / "bench_step.json"
    args = ["--preset", preset, "--device", "cpu", "--batch-sizes", "1,2", "--replays", "2", "--eager-steps", "1"]
    args += ["--gen-tokens", "6", "--parity-steps", "6", "--parity-tokens", "4", "--self-draft", "none"]
    if sampling:
        args += ["--sampling", "--temperature", "0.7", "--top-k", "20", "--top-p", "0.9"]
    code = bench_step.main([*args, "--max-seq-len", "128", "--context", "32", "--json", str(report)])
    printed = capsys.readouterr().out
    data = json.loads(report.read_text())
    assert code == 0, data
    assert [row["batch"] for row in data["rows"]] == [1, 2]
    for row in data["rows"]:
        assert "error" not in row, row
        assert row["captured"]["median_ms"] > 0 and row["eager"]["median_ms"] > 0
        assert 1.0 <= row["accept"]["tokens_per_step"] <= 5.0  # K=4: between 1 and K+1 tokens per step
        if sampling:
            sampled = row["sampled"]
            assert sampled["step_mode"] == "sample" and sampled["median_ms"] > 0 and sampled["top_k"] == 20
        else:
            assert "sampled" not in row
    assert data["parity"]["identical"] is True and data["parity"]["steps_compared"] > 0
    assert data["floor"]["target_bytes"] > 0 and data["floor"]["draft_bytes"] > 0
    regions = data["regions_batch_1"]
    assert all(regions[f"{name}_ms"] > 0 for name in ("draft", "verify", "accept"))
    assert "step/floor" in printed and "parity captured vs eager generate(): IDENTICAL" in printed
    assert "sample/greedy" in printed or not sampling


def test_sampling_flag_refuses_greedy_parameters() -> None:
    with pytest.raises(SystemExit):
        bench_step.parse_args(["--sampling", "--temperature", "0"])
    with pytest.raises(SystemExit):
        bench_step.parse_args(["--sampling", "--top-p", "1.5"])


def test_profiles_name_the_step_they_time(capsys) -> None:
    """Each printed kernel profile says which step it is and that step's own time: the greedy step's, the sampling
    step's (--sampling) or the stock-torch pair's."""
    profile = {
        "kernels_per_step": 2.0,
        "kernel_us_per_step": 30.0,
        "categories": {"gemm": {"calls_per_step": 2.0, "us_per_step": 30.0}},
        "top": [{"name": "gemv_kernel", "calls_per_step": 2.0, "us_per_step": 30.0, "share": 1.0}],
    }
    report = {
        "rows": [
            {"pair": "8B/1B", "captured": {"median_ms": 7.5}, "sampled": {"median_ms": 8.1}},
            {"pair": "8B/1B stock", "captured": {"median_ms": 9.9}},
        ]
    }
    for kind in ("lowered", "sampling", "stock-torch"):
        bench_step.print_profile(report, profile, kind)
    printed = capsys.readouterr().out
    assert "captured lowered step at batch 1: 2 launches, 0.03 ms of kernel time; the step takes 7.50 ms" in printed
    assert "captured sampling step at batch 1: 2 launches, 0.03 ms of kernel time; the step takes 8.10 ms" in printed
    assert "captured stock-torch step at batch 1: 2 launches, 0.03 ms of kernel time; the step takes 9.90 ms" in printed
