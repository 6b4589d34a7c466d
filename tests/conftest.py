"""Markers, hardware skips and session-cached tiny checkpoints."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from tests.checkpoints import make_checkpoint
from tests.step_case import StepCase

if os.environ.get("PYTEST_XDIST_WORKER"):
    # One torch thread per xdist worker (the README runs one worker per core): tiny models gain nothing
    # from intra-op threads, and two workers each spawning one per core would oversubscribe the machine.
    torch.set_num_threads(1)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    _fail_on_empty_test_files(config, items)
    has_gpu = torch.cuda.is_available()
    sm = torch.cuda.get_device_capability() if has_gpu else None
    for item in items:
        if "gpu" in item.keywords and not has_gpu:
            item.add_marker(pytest.mark.skip(reason="needs a CUDA GPU"))
        if "sm90" in item.keywords and sm != (9, 0):
            item.add_marker(pytest.mark.skip(reason="needs an sm_90 GPU"))


def _fail_on_empty_test_files(config: pytest.Config, items: list[pytest.Item]) -> None:
    """On a whole-suite run, a test_*.py file that collects nothing is an error: a test that never
    runs is worse than no test."""
    root = Path(config.rootpath) / "tests"
    if [Path(a).resolve() for a in config.args] not in ([root.resolve()], [Path(config.rootpath).resolve()]):
        return
    collected = {Path(item.path).resolve() for item in items}
    empty = sorted(str(p.relative_to(config.rootpath)) for p in root.rglob("test_*.py") if p.resolve() not in collected)
    if empty and not config.option.keyword and not config.option.markexpr:
        raise pytest.UsageError(f"test files that collect no tests: {', '.join(empty)}")


@pytest.fixture(scope="session")
def checkpoint_factory(tmp_path_factory: pytest.TempPathFactory):
    """make(family, seed, **config overrides) -> checkpoint dir, cached per distinct arguments."""
    cache: dict[tuple, object] = {}

    def make(family: str = "llama", seed: int = 0, **overrides):
        key = (family, seed, repr(sorted(overrides.items())))  # repr: overrides may hold dicts
        if key not in cache:
            directory = tmp_path_factory.mktemp(f"ckpt_{family}_{seed}")
            cache[key] = make_checkpoint(directory, family, seed, **overrides)
        return cache[key]

    return make


@pytest.fixture(scope="session")
def step_case(checkpoint_factory) -> StepCase:
    """A traced step of a tiny llama target with an unrelated qwen3 draft (B=3, K=2, one padding row)."""
    return StepCase(checkpoint_factory("llama", seed=0), checkpoint_factory("qwen3", seed=1))


@pytest.fixture(scope="session")
def folded_step_case(checkpoint_factory) -> StepCase:
    """step_case's models with their post-attention norms folded into gate/up (models/fold_norms.py)."""
    return StepCase(checkpoint_factory("llama", seed=0), checkpoint_factory("qwen3", seed=1), fold_norms=True)


@pytest.fixture
def no_weight_loading(monkeypatch):
    """Any weight load fails the test: refusals must come first."""

    def refuse(*args, **kwargs):
        raise AssertionError("weights were loaded before the refusal")

    monkeypatch.setattr("graphspec.compiler.load_model", refuse)
    monkeypatch.setattr("graphspec.drafters.load_model", refuse)
