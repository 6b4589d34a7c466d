"""CPU smoke test of benchmarks/bench_serve.py on the tiny Llama stand-in: every (policy, rate) gets a
row with every metric, both policies serve every request's tokens, and the plot is an SVG with a line
per policy. Timings on CPU mean nothing; only the structure is checked."""

from __future__ import annotations

import json
import math
import xml.etree.ElementTree as ET

from benchmarks import bench_serve


def test_tiny_preset_reports_every_policy_and_rate(tmp_path, capsys) -> None:
    report, plot = tmp_path / "serve.json", tmp_path / "serve.svg"
    args = ["--preset", "tiny-llama", "--device", "cpu", "--requests", "6", "--rates", "50,inf"]
    args += ["--prompt-len", "4,12", "--output-len", "3,9", "--batch-sizes", "1,4", "--max-seq-len", "48"]
    assert bench_serve.main([*args, "--json", str(report), "--plot", str(plot)]) == 0
    rows = json.loads(report.read_text())["rows"]
    assert [(row["policy"], row["rate"]) for row in rows] == [
        ("continuous", 50.0), ("static", 50.0), ("continuous", math.inf), ("static", math.inf)
    ]  # fmt: skip
    tokens = {row["output_tokens"] for row in rows}
    assert len(tokens) == 1 and tokens.pop() >= 6 * 3  # the same requests, all served in full
    for row in rows:
        assert row["tokens_per_s"] > 0 and 0 < row["ttft_p50_ms"] <= row["ttft_p99_ms"]
        assert 0 < row["itl_p50_ms"] <= row["itl_p99_ms"]
    svg = ET.parse(plot).getroot()
    assert len([e for e in svg.iter() if e.tag.endswith("polyline")]) == 2 * len(bench_serve.PANELS)
    assert "continuous" in capsys.readouterr().out
