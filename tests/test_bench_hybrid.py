"""CPU smoke test of benchmarks/bench_hybrid.py on the tiny hybrid stand-in: the random checkpoint (target
and its mtp.* head) loads through the real loader, both drafters compile and time, and the target's
decode and verify forwards trace, lower and run. Timings on CPU mean nothing; only the structure is checked."""

from __future__ import annotations

import json

from benchmarks import bench_hybrid


def test_tiny_preset_runs_and_reports(tmp_path, capsys) -> None:
    report = tmp_path / "bench_hybrid.json"
    args = ["--preset", "tiny", "--device", "cpu", "--batch-sizes", "2", "--replays", "1", "--warmup", "0"]
    code = bench_hybrid.main([*args, "--max-seq-len", "64", "--context", "32", "--json", str(report)])
    data = json.loads(report.read_text())
    assert code == 0
    (row,) = data["rows"]
    assert row["batch"] == 2 and row["target_decode_ms"] > 0 and row["verify_ms"] > 0
    assert set(row["steps_ms"]) == {"mtp", "ngram"} and all(ms > 0 for ms in row["steps_ms"].values())
    assert "mtp /decode" in capsys.readouterr().out
