"""Markers, hardware skips and session-cached tiny checkpoints."""

from __future__ import annotations

import pytest
import torch

from tests.checkpoints import make_checkpoint


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    has_gpu = torch.cuda.is_available()
    sm = torch.cuda.get_device_capability() if has_gpu else None
    for item in items:
        if "gpu" in item.keywords and not has_gpu:
            item.add_marker(pytest.mark.skip(reason="needs a CUDA GPU"))
        if "sm90" in item.keywords and sm != (9, 0):
            item.add_marker(pytest.mark.skip(reason="needs an sm_90 GPU"))


@pytest.fixture(scope="session")
def checkpoint_factory(tmp_path_factory: pytest.TempPathFactory):
    """make(family, seed, **config overrides) -> checkpoint dir, cached per distinct arguments."""
    cache: dict[tuple, object] = {}

    def make(family: str = "llama", seed: int = 0, **overrides):
        key = (family, seed, tuple(sorted(overrides.items())))
        if key not in cache:
            directory = tmp_path_factory.mktemp(f"ckpt_{family}_{seed}")
            cache[key] = make_checkpoint(directory, family, seed, **overrides)
        return cache[key]

    return make
