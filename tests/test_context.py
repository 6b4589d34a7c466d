"""The default max_seq_len: the models' position limit, capped by the cache memory budget."""

from __future__ import annotations

import torch

import graphspec
from graphspec import context
from graphspec.models.loading import load_config
from graphspec.models.spec import ModelSpec


def test_a_model_with_few_positions_compiles_with_the_default(checkpoint_factory):
    target = checkpoint_factory("llama", 0, max_position_embeddings=96)
    draft = checkpoint_factory("llama", 1, num_hidden_layers=1, max_position_embeddings=80)
    compiled = graphspec.compile(target, draft, k=2, batch_sizes=(1,), dtype="float32", device="cpu")
    assert compiled.config.max_seq_len == 80  # the smaller of the two models' limits


def test_the_memory_budget_caps_the_default(checkpoint_factory, monkeypatch):
    spec = ModelSpec.from_config(load_config(checkpoint_factory("llama", 0)))  # 512 positions
    per_position = context.cache_bytes_per_position([spec], 3, torch.float32)
    assert per_position == spec.num_layers * 2 * 3 * spec.num_kv_heads * spec.head_dim * 4
    monkeypatch.setattr(context, "CPU_CACHE_BYTES", 100 * per_position)
    assert context.default_max_seq_len([spec], 3, torch.float32, "cpu") == 96  # 100 fit, aligned down to 16
    monkeypatch.setattr(context, "CPU_CACHE_BYTES", 10**12)
    assert context.default_max_seq_len([spec], 3, torch.float32, "cpu") == 512
