"""benchmarks/bench_drafters.py: the best-K model on hand-made step times, and a CPU smoke run of several K
with a bucket drafting its own (timings on CPU mean nothing; only the structure is checked)."""

from __future__ import annotations

import json

import pytest

from benchmarks import bench_drafters


def test_expected_tokens_is_the_geometric_sum() -> None:
    assert bench_drafters.expected_tokens(0.5, 1) == 1.5
    assert bench_drafters.expected_tokens(0.5, 3) == pytest.approx(1.875)
    assert bench_drafters.expected_tokens(0.0, 4) == 1.0


def test_best_k_picks_the_most_tokens_per_ms_and_writes_the_compile_options() -> None:
    columns = {"mtp_k1": ("mtp", "mtp", 1), "mtp_k4": ("mtp", "mtp", 4)}
    decode = {1: 4.0, 64: 6.0}
    # B = 1: K = 4 costs 1.4x K = 1's step; B = 64: 2x. At A = 0.7: tokens 1.7 (K = 1) and 2.7731 (K = 4).
    steps = {"mtp_k1": {1: 5.0, 64: 7.0}, "mtp_k4": {1: 7.0, 64: 14.0}}
    k_at = {(column, b): k for column, (_, _, k) in columns.items() for b in decode}
    lines = bench_drafters.best_k_lines(columns, k_at, steps, decode, (1, 64), (0.7,))
    (row,) = [line for line in lines if line.strip().startswith("mtp")]
    # K = 4 at B = 1 (2.7731 / 7 > 1.7 / 5), K = 1 at B = 64 (1.7 / 7 > 2.7731 / 14)
    assert "K=4 1.58x" in row and "K=1 1.46x" in row, row
    assert row.endswith("-k 4 --k-by-bucket 64:1"), row


def test_several_k_and_a_bucket_with_its_own_run_on_cpu(tmp_path, capsys) -> None:
    report = tmp_path / "bench_drafters.json"
    args = ["--preset", "tiny-llama", "--device", "cpu", "--drafters", "ngram", "-k", "1,3", "--batch-sizes", "1,2"]
    args += ["--k-by-bucket", "2:2", "--acceptance", "0.7", "--replays", "1", "--warmup", "0"]
    code = bench_drafters.main([*args, "--max-seq-len", "64", "--context", "32", "--json", str(report)])
    assert code == 0
    rows = {row["batch"]: row for row in json.loads(report.read_text())["rows"]}
    assert rows[1]["k"] == {"ngram_k1": 1, "ngram_k3": 3}
    assert rows[2]["k"] == {"ngram_k1": 1, "ngram_k3": 2}  # bucket 2 drafts 2 where the column drafts more
    assert set(rows[1]["verify_ms"]) == {"2", "4"} and set(rows[2]["verify_ms"]) == {"2", "3"}  # JSON keys
    out = capsys.readouterr().out
    assert "k_by_bucket: bucket 2: K=2" in out and "modelled: best K per bucket" in out
