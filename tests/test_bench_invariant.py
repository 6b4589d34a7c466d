"""CPU smoke test of benchmarks/bench_invariant.py on the tiny Llama pair with the default numerics (the
invariant ones need a GPU; tests/e2e/test_invariant.py checks them there): the checkpoints load through
the real loader, the step is timed, speculative and target-only outputs are compared from the runtime's
own prefill, and the self-draft pair is measured. In fp32 on the CPU both paths agree token for token
and a draft equal to the target accepts everything; timings mean nothing."""

from __future__ import annotations

import json

from benchmarks import bench_invariant


def test_tiny_preset_runs_and_reports(tmp_path, capsys) -> None:
    report = tmp_path / "bench_invariant.json"
    args = ["--preset", "tiny-llama", "--numerics", "default", "--device", "cpu", "--prompts", "3"]
    args += ["--new-tokens", "10", "--self-tokens", "12", "--replays", "1", "--warmup", "0", "--context", "30"]
    args += ["--max-seq-len", "96", "--prompt-len", "12", "--prefill-len", "40", "--checkpoint-dir", str(tmp_path)]
    assert bench_invariant.main([*args, "--json", str(report)]) == 0
    (row,) = json.loads(report.read_text())["rows"]
    assert row["outputs"]["equal"] == row["outputs"]["prompts"] == 3
    assert all(row["self_draft"][bucket]["acceptance_rate"] == 1.0 for bucket in ("1", "8"))
    assert row["step_ms"]["1"] > 0 and row["prefill_ms"] > 0
    assert "| default |" in capsys.readouterr().out
