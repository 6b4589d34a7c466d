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


def test_floors_are_the_weights_read_once_a_step_over_the_copy_rate() -> None:
    """Decode: the target's bytes; a draft model's step: those plus K x the draft's (and, as issue 16 counts it,
    the target's input embedding too); each bucket's ratios to them."""
    decode, steps = {1: 3.3, 8: 4.5}, {"draft_model": {1: 6.0, 8: 7.5}}
    columns = {"draft_model": (10**9, 4)}  # 1 GB of draft, K = 4
    lines, record = bench_drafters.floor_lines(2e12, 6 * 10**9, 10**9, columns, decode, steps, (1, 8))
    assert record["floors_ms"] == {"target_decode": pytest.approx(3.0), "draft_model": pytest.approx(5.0)}
    assert record["floors_with_target_embedding_ms"] == {"draft_model": pytest.approx(5.5)}
    assert "target decode 3.000 ms (6.00 GB), draft_model step 5.000 ms (+ 4 x 1.00 GB; 5.500 with" in lines[1]
    assert lines[2] == "   1 over the floor: target_decode 1.10x, draft_model 1.20x (1.09x)"
    assert lines[3] == "   8 over the floor: target_decode 1.50x, draft_model 1.50x (1.36x)"


def test_several_k_and_a_bucket_with_its_own_run_on_cpu(tmp_path, capsys) -> None:
    report = tmp_path / "bench_drafters.json"
    args = ["--preset", "tiny-llama", "--device", "cpu", "--drafters", "ngram,draft_model", "-k", "1,3"]
    args += ["--batch-sizes", "1,2"]
    args += ["--k-by-bucket", "2:2", "--acceptance", "0.7", "--replays", "1", "--warmup", "0"]
    code = bench_drafters.main([*args, "--max-seq-len", "64", "--context", "32", "--json", str(report)])
    assert code == 0
    rows = {row["batch"]: row for row in json.loads(report.read_text())["rows"]}
    assert rows[1]["k"] == {"ngram_k1": 1, "ngram_k3": 3, "draft_model_k1": 1, "draft_model_k3": 3}
    # bucket 2 drafts 2 where the column drafts more
    assert rows[2]["k"] == {"ngram_k1": 1, "ngram_k3": 2, "draft_model_k1": 1, "draft_model_k3": 2}
    assert set(rows[1]["verify_ms"]) == {"2", "4"} and set(rows[2]["verify_ms"]) == {"2", "3"}  # JSON keys
    out = capsys.readouterr().out
    assert "k_by_bucket: bucket 2: K=2" in out and "modelled: best K per bucket" in out
    # n-gram has no draft model, and draft_model_k3's K differs by bucket: the decode's and draft_model_k1's floors
    floors = json.loads(report.read_text())["floors"]
    assert set(floors["floors_ms"]) == {"target_decode", "draft_model_k1"} and floors["target_bytes"] > 0
    assert floors["floors_ms"]["draft_model_k1"] > floors["floors_ms"]["target_decode"]
    assert "over the floor: target_decode" in out
    # every target forward's lowering is recorded; on the CPU (no SM) every product stays torch's
    lowering = json.loads(report.read_text())["lowering"]
    assert set(lowering) == {"B=1 T=1", "B=2 T=1", "B=1 T=2", "B=1 T=4", "B=2 T=2", "B=2 T=3"}
    products = 4 * 2 + 1  # tiny-llama-target: q/k/v, o, gate/up and down in each of 2 layers, then the lm_head
    assert all(counts == {"torch products": products} for counts in lowering.values()), lowering
    assert f"products left to torch (cuBLAS): B=1 T=1 {products}, B=2 T=1 {products}" in out
