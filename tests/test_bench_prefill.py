"""CPU smoke test of benchmarks/bench_prefill.py with the tiny preset: every system timed at every shape,
the cold start in fresh processes (the median's run reported, every run's time kept), the table printed.
Timings on a test machine mean nothing; only the structure is checked."""

from __future__ import annotations

import json

import pytest

from benchmarks import bench_prefill


def test_the_smoke_run_times_every_shape_and_reports_the_median_cold_start(tmp_path, capsys):
    report = tmp_path / "prefill.json"
    argv = ["--preset", "tiny-llama", "--device", "cpu", "--shapes", "32x1,16x2", "--max-seq-len", "128",
            "--buckets", "1", "--modes", "greedy", "--reps", "1", "--cold-start-tokens", "8",
            "--cold-start-runs", "2", "--no-target-only", "--json", str(report)]  # fmt: skip
    assert bench_prefill.main(argv) == 0
    result = json.loads(report.read_text())
    for system in ("graphspec", "transformers"):
        assert set(result[system]) == {"32x1", "16x2"} and all(row["ms"] > 0 for row in result[system].values())
    cold = result["cold_start"]
    assert "error" not in cold, cold.get("error")
    assert len(cold["load_to_ready_runs_s"]) == 2 and cold["load_to_ready_s"] == max(cold["load_to_ready_runs_s"])
    assert cold["triton_compiles_during_requests"] == 0 and cold["captures_during_requests"] == 0
    assert "median of 2 processes" in capsys.readouterr().out


@pytest.mark.parametrize(("times", "expected"), [([3.0, 1.0, 2.0], 2.0), ([1.0], 1.0), ([2.0, 1.0], 2.0)])
def test_median_run_is_the_middle_run_with_every_time_beside_it(times, expected):
    runs = [{"load_to_ready_s": t, "which": i} for i, t in enumerate(times)]
    chosen = bench_prefill.median_run(runs)
    assert chosen["load_to_ready_s"] == expected and chosen["load_to_ready_runs_s"] == times
    assert bench_prefill.median_run([*runs, {"error": "boom"}]) == {"error": "boom"}
