"""graphspec/gc_pause.py: the collector is paused inside, restored after (also on error, and nested), and
loading and a Runtime's start-up rebuild their graphs inside a pause."""

from __future__ import annotations

import gc

import pytest

import graphspec
from graphspec import artifact
from graphspec.gc_pause import paused_gc
from graphspec.runtime import runtime as runtime_module


def test_paused_inside_restored_after_also_on_error_and_nested():
    assert gc.isenabled()
    with paused_gc():
        assert not gc.isenabled()
        with paused_gc():
            assert not gc.isenabled()
        assert not gc.isenabled()  # the inner pause restores the outer's state, not "enabled"
    assert gc.isenabled()
    with pytest.raises(RuntimeError), paused_gc():
        raise RuntimeError("boom")
    assert gc.isenabled()


def test_a_disabled_collector_stays_disabled():
    gc.disable()
    try:
        with paused_gc():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_load_and_start_up_rebuild_graphs_with_the_collector_paused(checkpoint_factory, monkeypatch, tmp_path):
    seen: dict[str, list[bool]] = {}

    def spy(module, name):
        original = getattr(module, name)

        def wrapped(*args, **kwargs):
            seen.setdefault(name, []).append(gc.isenabled())
            return original(*args, **kwargs)

        monkeypatch.setattr(module, name, wrapped)

    spy(artifact, "decode_graph_module")  # rebuilding stored graphs, inside load_artifact
    spy(runtime_module, "PrefillProgram")  # splitting the prefill programs, inside Runtime()
    target, draft = checkpoint_factory("llama", 0), checkpoint_factory("llama", 1, num_hidden_layers=1)
    graphspec.compile(target, draft, k=2, batch_sizes=(1,), device="cpu", dtype="float32", max_seq_len=64,
                      modes=("greedy",), out=tmp_path / "art")  # fmt: skip
    graphspec.Runtime.load(tmp_path / "art")
    assert set(seen) == {"decode_graph_module", "PrefillProgram"}
    assert not any(enabled for calls in seen.values() for enabled in calls), seen
    assert gc.isenabled()
