"""CPU smoke test of benchmarks/bench_linear_cpu.py: it times every shape at the rows asked for and both
results agree with fp64. Timings on a test machine mean nothing; only the table is checked."""

from __future__ import annotations

from graphspec.kernels import mm_cpu

from benchmarks import bench_linear_cpu


def test_every_shape_gets_a_row_with_both_timings(capsys):
    assert bench_linear_cpu.main(["--rows", "1,5", "--rotation-mb", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    rows = [line.split() for line in lines if line.startswith(("target", "draft"))]
    assert len(rows) == 2 * len(bench_linear_cpu.SHAPES)
    assert all(float(row[-3]) < 1e-5 for row in rows)  # the larger relative error against fp64
    assert all(row[-1] == "us" for row in rows)
    if mm_cpu.bfloat16_supported():
        assert all(float(row[-2]) > 0 for row in rows)  # the bfloat16 copy's time
    else:  # a CPU without bfloat16 matmuls: the column says so
        assert all(row[-2] == "-" for row in rows)
    assert lines[-1].startswith("sum over the rows above")
