"""CPU smoke test of benchmarks/bench_load.py on a tiny artifact: both variants load in fresh processes, and
only the one without resolved configs imports the family's config class. Timings on a test machine mean
nothing; only the structure is checked."""

from __future__ import annotations

import json

import graphspec
from benchmarks import bench_load


def test_both_variants_load_and_only_config_json_imports_the_config_class(checkpoint_factory, tmp_path, capsys):
    artifact = tmp_path / "art"
    target, draft = checkpoint_factory("llama", 0), checkpoint_factory("llama", 1, num_hidden_layers=1)
    graphspec.compile(target, draft, out=artifact, k=2, batch_sizes=(1,), dtype="float32", device="cpu", max_seq_len=64)
    report = tmp_path / "bench_load.json"
    assert bench_load.main(["--artifact", str(artifact), "--runs", "1", "--json", str(report)]) == 0
    rows = {row["variant"]: row for row in json.loads(report.read_text())["rows"]}
    assert set(rows) == set(bench_load.VARIANTS)
    assert not rows["resolved configs"]["config_class_imported"] and rows["config.json"]["config_class_imported"]
    assert all(row["median_load_s"] > 0 for row in rows.values())
    assert "| resolved configs |" in capsys.readouterr().out
