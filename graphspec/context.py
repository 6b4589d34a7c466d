"""The default max_seq_len: the models' own context limit, capped by a memory budget for the caches.

A fixed default (it was 1024) refuses models with fewer positions and wastes long-context ones. The
cap: every cache slot holds max_seq_len positions of the target's KV cache (and a draft model's), so
the positions that fit in a share of the device's memory bound it.
"""

from __future__ import annotations

import torch

from graphspec.models.decoder import kv_cache_shape
from graphspec.models.spec import ModelSpec

CUDA_CACHE_SHARE = 0.3  # of the GPU's memory for KV caches by default; weights and activations need the rest
CPU_CACHE_BYTES = 4 << 30  # a laptop-safe default on the CPU
ALIGN = 16  # positions: keeps kernels' tiles whole


def cache_bytes_per_position(specs: list[ModelSpec], slots: int, dtype: torch.dtype) -> int:
    size = torch.empty((), dtype=dtype).element_size()
    total = 0
    for spec in specs:
        shape = kv_cache_shape(spec, spec.num_layers, slots, 1)
        count = 1
        for dim in shape:
            count *= dim
        total += count * size
    return total


def memory_budget(device: str) -> int:
    if device.startswith("cuda") and torch.cuda.is_available():
        return int(CUDA_CACHE_SHARE * torch.cuda.get_device_properties(torch.device(device)).total_memory)
    return CPU_CACHE_BYTES


def default_max_seq_len(specs: list[ModelSpec], slots: int, dtype: torch.dtype, device: str) -> int:
    """min(each model's max_position_embeddings and sliding window, what the budget holds), aligned down."""
    limit = min(min(s.max_position_embeddings, s.sliding_window or s.max_position_embeddings) for s in specs)
    fits = memory_budget(device) // max(cache_bytes_per_position(specs, slots, dtype), 1)
    length = min(limit, fits)
    return max(length // ALIGN * ALIGN, min(length, ALIGN))
