"""The runner: order, --skip/--stop-after, dumps (names, headers, parse as Python), errors."""

import ast

import pytest

from graphspec import pipeline
from graphspec.errors import InputError, PassError
from graphspec.passes import mask_padding


def test_pipeline_order_is_the_documented_one():
    assert pipeline.PASS_NAMES == (
        "insert_verify",
        "mask_padding",
        "fold_constants",
        "defunctionalize_kv",
        "addmm_in_place",
        "fuse_rotary_kv",
        "fuse_kv_attention",
        "fuse_qk_norm",
        "fuse_row_scale",
        "lower_kernels",
        "fuse_pointwise",
        "split_attention",
    )
    described = pipeline.describe().splitlines()
    step, prefill = described[: len(pipeline.PASS_NAMES)], described[len(pipeline.PASS_NAMES) + 1 :]
    assert [line.split()[1].rstrip(":") for line in step] == list(pipeline.PASS_NAMES)
    assert described[len(pipeline.PASS_NAMES)] == "prefill chunk program:"
    assert [line.split()[1].rstrip(":") for line in prefill] == [
        "defunctionalize_kv",
        "addmm_in_place",
        "fuse_prefill_attention",
        "lower_kernels",
    ]


def test_dumps_one_parseable_file_per_pass_with_header(step_case, tmp_path):
    pipeline.run_pipeline(step_case.traced("greedy"), step_case.context("greedy"), dump_dir=tmp_path, check=True)
    names = sorted(p.name for p in tmp_path.iterdir())
    expected_py = ["00_traced.py"] + [f"{i:02d}_{n}.py" for i, n in enumerate(pipeline.PASS_NAMES, start=1)]
    assert [n for n in names if n.endswith(".py")] == expected_py
    assert [n for n in names if n.endswith(".diff")] == [p.replace(".py", ".diff") for p in expected_py[1:]]
    assert "summary.md" in names and "kernels.txt" in names
    for name in expected_py:
        text = (tmp_path / name).read_text()
        ast.parse(text)
        assert text.startswith("# [")
    header = (tmp_path / "04_defunctionalize_kv.py").read_text().splitlines()[:8]
    assert any("nodes:" in line for line in header)
    assert any("kv_write" in line and "+6" in line for line in header)  # op count change
    summary = (tmp_path / "summary.md").read_text()
    for name in pipeline.PASS_NAMES:
        assert name in summary


def test_dumps_do_not_change_the_graph(step_case, tmp_path):
    with_dumps = pipeline.run_pipeline(step_case.traced("greedy"), step_case.context("greedy"), dump_dir=tmp_path)
    without = pipeline.run_pipeline(step_case.traced("greedy"), step_case.context("greedy"))
    assert with_dumps.gm.code == without.gm.code


def test_stop_after_runs_a_prefix(step_case):
    result = pipeline.run_pipeline(step_case.traced("greedy"), step_case.context("greedy"), stop_after="mask_padding")
    assert [r.name for r in result.records] == ["insert_verify", "mask_padding"]


def test_skip_keeps_numbering_and_marks_the_pass(step_case, tmp_path):
    result = pipeline.run_pipeline(
        step_case.traced("greedy"), step_case.context("greedy"), skip=["defunctionalize_kv"], dump_dir=tmp_path
    )
    skipped = [r for r in result.records if r.skipped]
    assert [r.name for r in skipped] == ["defunctionalize_kv"]
    assert "SKIPPED" in (tmp_path / "04_defunctionalize_kv.py").read_text()
    # Without defunctionalize_kv the step still runs (functional caches are returned) and is correct.
    step_case.assert_matches_eager(result.gm, "greedy")


def test_unknown_pass_names_are_refused_with_the_list():
    with pytest.raises(InputError, match=r"unknown pass 'nope'.*insert_verify"):
        pipeline.validate_names("nope", ())
    with pytest.raises(InputError, match="unknown pass 'bad'"):
        pipeline.validate_names(None, ["bad"])


def test_failing_pass_names_itself_the_passes_before_and_the_last_dump(step_case, tmp_path, monkeypatch):
    def broken(gm, ctx):
        raise ValueError("boom")

    monkeypatch.setattr(mask_padding, "run", broken)
    with pytest.raises(PassError) as error:
        pipeline.run_pipeline(step_case.traced("greedy"), step_case.context("greedy"), dump_dir=tmp_path)
    message = str(error.value)
    assert "'mask_padding' failed" in message and "boom" in message
    assert "passes already run: insert_verify" in message
    assert "01_insert_verify.py" in message


def test_checks_catch_a_broken_invariant(step_case, monkeypatch):
    from graphspec.passes import defunctionalize_kv

    def no_op(gm, ctx):
        from graphspec.config import PassResult

        return PassResult(gm, changed=False)

    monkeypatch.setattr(defunctionalize_kv, "run", no_op)
    with pytest.raises(PassError, match="whole-cache copies"):
        pipeline.run_pipeline(step_case.traced("greedy"), step_case.context("greedy"), check=True)


def test_dump_headers_say_where_each_region_of_the_step_runs(step_case, tmp_path):
    result = pipeline.run_pipeline(step_case.traced("greedy"), step_case.context("greedy"), dump_dir=tmp_path)
    last = tmp_path / f"{len(pipeline.PASS_NAMES):02d}_{pipeline.PASS_NAMES[-1]}.py"
    line = next(line for line in last.read_text().splitlines() if line.startswith("# regions: "))
    spans = [part.split() for part in line.removeprefix("# regions: ").split("; ")]
    assert [span[0] for span in spans] == ["draft", "verify", "accept"]  # in the order the step runs them
    names = {node.name for node in result.gm.graph.nodes}
    for region, count, _, first, _, last_node in spans:
        assert int(count) > 0 and first in names and last_node in names, (region, first, last_node)
