"""CPU smoke test of benchmarks/bench_systems.py --small: every system runs (or fails soft into a row that
says why), the JSON and the table have their structure, and the output cross-check runs; plus the
margin-aware check itself on hand-made logits."""

from __future__ import annotations

import json

import pytest
import torch

from benchmarks import bench_systems
from benchmarks.bench_systems import Oracle, parse_grid

SMALL_ARGS = [
    "--small",
    "--prompt-len",
    "8",
    "--new-tokens",
    "6",
    "--grid",
    "4:1/2",
    "--selfdraft-k",
    "2",
    "--ref-batches",
    "1,2",
    "--hf-batches",
    "1,2",
    "--region-reps",
    "2",
    "--warmup-tokens",
    "2",
    "--inject-failure",
    "hf-greedy@2",
]


def test_small_preset_runs_every_system_and_fails_soft(tmp_path, capsys):
    out = tmp_path / "out"
    code = bench_systems.main([*SMALL_ARGS, "--out-dir", str(out)])
    stdout = capsys.readouterr().out
    assert code == 0
    data = json.loads((out / "bench_systems.json").read_text())
    assert data["meta"]["complete"] is True
    assert data["ceilings"]["copy"]["gb_s"] > 0
    info = data["pairs"]["llama"]
    rows = {(r["system"], r["k"], r["batch"]): r for r in info["rows"]}
    expected = [
        ("graphspec", 4, 1),
        ("graphspec", 4, 2),
        ("graphspec-selfdraft", 2, 1),
        ("graphspec-target-only", 0, 1),
        ("graphspec-target-only", 0, 2),
        ("graphspec-reference-eager", 0, 1),
        ("graphspec-reference-eager", 0, 2),
        ("hf-greedy", 0, 1),
        ("hf-greedy", 0, 2),
        ("hf-assisted", 4, 1),
        ("hf-static-compile", 0, 1),
        ("floor (spec)", 4, 1),
        ("floor (target)", 0, 1),
    ]
    for key in expected:
        assert key in rows, f"missing row {key}; have {sorted(rows)}"
    # The injected failure is a row that says why; everything else ran.
    failed = rows[("hf-greedy", 0, 2)]
    assert failed["status"] == "error" and "injected" in failed["error"]
    for key, row in rows.items():
        if key == ("hf-greedy", 0, 2):
            continue
        assert row["status"] == "ok", (key, row.get("error"))
        for field in ("tokens_per_s", "ms_per_step", "tokens_per_step"):
            assert row[field] > 0, (key, field)
    # Cross-check ran against the oracle for every system with outputs; fp32 on CPU is exact.
    for key, row in rows.items():
        if row["status"] == "ok" and not key[0].startswith("floor"):
            assert row["check"]["status"] in ("exact", "ok"), (key, row["check"])
            assert row["check"]["rows"] == key[2]
    assert rows[("graphspec-selfdraft", 2, 1)]["tokens_per_step"] == 3.0  # draft = target: all accepted
    assert rows[("graphspec", 4, 1)]["ratio_vs_gs_k4"] == pytest.approx(1.0)
    assert rows[("graphspec", 4, 1)]["floor"]["ms"] > 0
    # Regions come from inside the compiled step: every region timed, and host = wall per step - step.
    regions = rows[("graphspec", 4, 1)]["regions"]
    assert all(regions[f"{name}_ms"] > 0 for name in ("draft", "verify", "accept")), regions
    assert (regions["mode"], regions["clock"]) == ("eager", "host_clock")
    assert regions["host_ms"] == pytest.approx(rows[("graphspec", 4, 1)]["ms_per_step"] - regions["step_ms"])
    assert [r["batch"] for r in info["regions"]] == [1, 2]
    assert info["oracle"]["rows"] == 2
    # The table is printed last, and also written next to the JSON.
    text = (out / "bench_systems.txt").read_text()
    assert "system" in text and "graphspec-selfdraft" in text and "ERROR: InjectedFailureError" in text
    assert "[llama] regions K=4 B=1 (eager step, host_clock" in text
    assert stdout.rstrip().endswith(text.rstrip().splitlines()[-1])
    assert text.rstrip().splitlines()[-1].startswith("floor (target)")
    if (out / "bench_systems.png").exists():
        assert (out / "bench_systems.png").stat().st_size > 1000
    else:
        assert "plot_error" in data["meta"]  # no matplotlib here: said so, nothing else failed


def test_render_puts_error_rows_in_the_table():
    data = {
        "meta": {"device": "cpu", "torch": "x", "elapsed_s": 1.0, "end_reason": "complete"},
        "args": {"dtype": "float32", "prompt_len": 8, "new_tokens": 6},
        "ceilings": {},
        "pairs": {
            "llama": {
                "models": {"target": "t", "draft": "d"},
                "rows": [
                    {
                        "system": "graphspec",
                        "k": 4,
                        "batch": 1,
                        "status": "ok",
                        "tokens_per_s": 10.0,
                        "ms_per_step": 2.0,
                        "tokens_per_step": 1.0,
                        "check": {"summary": "exact 1/1"},
                    },
                    {"system": "hf-greedy", "k": 0, "batch": 1, "status": "error", "error": "boom"},
                ],
            }
        },
    }
    bench_systems.add_ratios(data)
    text = bench_systems.render(data)
    last = text.splitlines()[-1]
    assert last.startswith("hf-greedy") and "ERROR: boom" in last
    assert "1.00" in text.splitlines()[-2]  # ratio vs graphspec K=4 at batch 1


class LogitsIdentity:
    """A stand-in model whose `logits(hidden)` is `hidden`: the test sets the logits directly."""

    def logits(self, hidden):
        return hidden


def test_margin_aware_check_classifies_divergences():
    vocab = 8
    oracle_tokens = [[1, 2, 3], [4, 5, 6], [1, 1, 1]]
    oracle = Oracle(LogitsIdentity(), [[0]] * 3, oracle_tokens, torch.bfloat16, "cpu", 1e-3, 2.0)
    hidden = []
    for row in oracle_tokens:
        logits = torch.full((len(row), vocab), -5.0)
        for position, token in enumerate(row):
            logits[position, token] = 4.0
        hidden.append(logits)
    hidden[0][1, 7] = 4.0 - 1 / 64  # row 0, position 1: token 7 is half a bf16 ulp below the top
    oracle.hidden = hidden
    assert oracle.check(oracle_tokens)["status"] == "exact"
    near = oracle.check([[1, 7, 0], [4, 5, 6], [1, 1, 1]])  # diverges at a near-tie: benign
    assert near["status"] == "ok" and near["first_divergence"] == [1]
    far = oracle.check([[1, 2, 3], [4, 0, 6], [1, 1, 1]])  # token 0 is 9 logits below the top
    assert far["status"] == "MISMATCH" and far["divergences"][0]["row"] == 1
    short = oracle.check([[1, 2], [4, 5, 6], [1, 1, 1]])
    assert short["status"] == "MISMATCH" and short["divergences"][0]["kind"] == "length"
    assert oracle.check([[1, 2, 3]] * 4)["status"] == "no-oracle"


def test_parse_grid():
    assert parse_grid("2:1,4:1,4:16") == [(2, 1), (4, 1), (4, 16)]
    assert parse_grid("2/4:1/8") == [(2, 1), (2, 8), (4, 1), (4, 8)]


def test_without_cuda_it_exits_with_the_reason(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit, match="CUDA is not available"):
        bench_systems.main([])
