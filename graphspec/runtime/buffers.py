"""Static step buffers per batch bucket, and the smallest bucket that holds a batch.

What stays static across replays: every tensor in StepBuffers.inputs (allocated once per bucket; CUDA
graphs captured against their addresses) and the step's state (KV caches and drafter state, shared by
all buckets). What is
copied in each step: only the per-row values that change (the graph's next_* outputs, row_valid).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from graphspec import trace
from graphspec.errors import InputError


def pick_bucket(rows: int, buckets: tuple[int, ...]) -> int:
    """Smallest compiled batch size that holds `rows`."""
    for bucket in sorted(buckets):
        if bucket >= rows:
            return bucket
    raise InputError(f"{rows} rows exceed the largest bucket {max(buckets)}; split the batch first")


@dataclass
class StepBuffers:
    """The per-row step inputs of one bucket (names as in trace.ROW_INPUTS)."""

    bucket: int
    inputs: dict[str, torch.Tensor]

    @classmethod
    def allocate(cls, bucket: int, device: str | torch.device) -> StepBuffers:
        inputs = trace.new_row_inputs(bucket, device)
        inputs["row_valid"].zero_()  # no real rows until load_rows
        return cls(bucket, inputs)

    def load_rows(self, values: dict[str, torch.Tensor]) -> None:
        """Copy the real rows' values in; rows past them become invalid padding."""
        rows = values["committed_len"].shape[0]
        self.inputs["row_valid"].zero_()
        self.inputs["row_valid"][:rows] = True
        for name, value in values.items():
            self.inputs[name][:rows].copy_(value)
