"""graphspec/cublas.py: graphspec's processes turn cuBLAS's workspace off unless the user chose one."""

from __future__ import annotations

import os

import pytest
import torch

import graphspec
from graphspec import cli, cublas
from graphspec.errors import GraphspecError


@pytest.fixture
def no_variable(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    monkeypatch.delenv(cublas.WORKSPACE_VARIABLE, raising=False)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    return monkeypatch


def test_unset_becomes_no_workspace(no_variable: pytest.MonkeyPatch) -> None:
    assert cublas.use_no_workspace() == ":0:0"
    assert os.environ[cublas.WORKSPACE_VARIABLE] == ":0:0"


def test_the_users_value_wins(no_variable: pytest.MonkeyPatch) -> None:
    no_variable.setenv(cublas.WORKSPACE_VARIABLE, ":4096:8")
    assert cublas.use_no_workspace() == ":4096:8"


def test_nothing_is_set_once_cuda_started(no_variable: pytest.MonkeyPatch) -> None:
    # torch has read the variable by then (or will read what the process had): setting it would only mislead.
    no_variable.setattr(torch.cuda, "is_initialized", lambda: True)
    assert cublas.use_no_workspace() is None


def test_the_cli_sets_it_before_running_a_command(no_variable: pytest.MonkeyPatch) -> None:
    seen = {}

    def command(_args: object) -> int:
        seen["value"] = os.environ.get(cublas.WORKSPACE_VARIABLE)
        return 0

    parser = cli.build_parser()
    no_variable.setattr(cli, "build_parser", lambda: parser)
    no_variable.setattr(parser, "parse_args", lambda argv: type("Args", (), {"run": staticmethod(command)})())
    assert cli.main(["inspect", "x"]) == 0
    assert seen["value"] == ":0:0"


def test_compile_sets_it_before_loading_anything(no_variable: pytest.MonkeyPatch, tmp_path) -> None:
    with pytest.raises(GraphspecError):  # no checkpoint there: refused after the setting, before CUDA
        graphspec.compile(tmp_path / "missing", "ngram", device="cpu")
    assert os.environ[cublas.WORKSPACE_VARIABLE] == ":0:0"


def test_runtime_load_sets_it_before_loading_anything(no_variable: pytest.MonkeyPatch, tmp_path) -> None:
    with pytest.raises(GraphspecError):
        graphspec.Runtime.load(tmp_path / "missing")
    assert os.environ[cublas.WORKSPACE_VARIABLE] == ":0:0"
