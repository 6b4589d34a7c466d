"""CPU smoke test of benchmarks/bench_hybrid.py on the tiny hybrid stand-in: the random checkpoint (target
and its mtp.* head) loads through the real loader, both drafters compile and time, and the target's
decode and verify forwards trace, lower and run. Timings on CPU mean nothing; only the structure is checked."""

from __future__ import annotations

import json

from benchmarks import bench_hybrid
from graphspec.input_names import weight_input_names
from graphspec.models.loading import load_model
from graphspec.trace import model_inputs


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


def test_forward_names_its_weights_as_the_step_does(tmp_path) -> None:
    """The decode forward's weights are target.* inputs, as in the step: the registry lowers a batch-1 product
    to the one-row GEMV only where its weight operand is a model weight (a tiny stand-in's projections)."""
    model = load_model(bench_hybrid.write_checkpoint(tmp_path / "target", "tiny", "cpu", seed=1)).model
    gm, _ = bench_hybrid.trace_forward(model, batch=1, positions=1, max_seq_len=16, device="cpu")
    names = {node.meta.get("gs_input") for node in gm.graph.find_nodes(op="placeholder")}
    assert set(weight_input_names(model_inputs(model))) <= names
