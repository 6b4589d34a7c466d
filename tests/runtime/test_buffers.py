"""Static step buffers: picking a bucket, padding rows on load."""

from __future__ import annotations

import pytest
import torch

from graphspec import trace
from graphspec.errors import InputError
from graphspec.runtime.buffers import StepBuffers, pick_bucket

BUCKETS = (1, 4, 8)


@pytest.mark.parametrize(("rows", "bucket"), [(1, 1), (2, 4), (3, 4), (4, 4), (5, 8), (8, 8)])
def test_pick_bucket_takes_the_smallest_that_fits(rows: int, bucket: int) -> None:
    assert pick_bucket(rows, BUCKETS) == bucket


def test_pick_bucket_ignores_bucket_order() -> None:
    assert pick_bucket(3, (8, 1, 4)) == 4


def test_pick_bucket_refuses_rows_above_the_largest_bucket() -> None:
    with pytest.raises(InputError, match="exceed the largest bucket 8"):
        pick_bucket(9, BUCKETS)


def test_allocate_has_every_per_row_step_input_and_starts_all_invalid() -> None:
    buffers = StepBuffers.allocate(4, "cpu")
    assert tuple(buffers.inputs) == trace.ROW_INPUTS
    assert all(t.shape[0] == 4 for t in buffers.inputs.values())
    assert buffers.inputs["last_tokens"].shape == (4, 2)
    assert not buffers.inputs["row_valid"].any()


def test_load_rows_fills_real_rows_and_marks_the_rest_padding() -> None:
    buffers = StepBuffers.allocate(4, "cpu")
    buffers.load_rows(
        {
            "last_tokens": torch.tensor([[5, 6], [7, 8]]),
            "committed_len": torch.tensor([10, 20]),
            "slot_ids": torch.tensor([3, 1]),
            "temperature": torch.tensor([0.5, 0.0]),
        }
    )
    inputs = buffers.inputs
    assert inputs["row_valid"].tolist() == [True, True, False, False]
    assert inputs["last_tokens"][:2].tolist() == [[5, 6], [7, 8]]
    assert inputs["committed_len"][:2].tolist() == [10, 20]
    assert inputs["slot_ids"][:2].tolist() == [3, 1]
    assert inputs["temperature"][:2].tolist() == [0.5, 0.0]


def test_load_rows_clears_rows_left_valid_by_a_larger_earlier_batch() -> None:
    buffers = StepBuffers.allocate(4, "cpu")
    buffers.load_rows({"committed_len": torch.tensor([3, 4, 5, 6])})
    buffers.load_rows({"committed_len": torch.tensor([9])})
    assert buffers.inputs["row_valid"].tolist() == [True, False, False, False]
    assert buffers.inputs["committed_len"][0].item() == 9


def test_load_rows_writes_in_place_so_captured_addresses_stay_valid() -> None:
    buffers = StepBuffers.allocate(4, "cpu")
    addresses = {name: t.data_ptr() for name, t in buffers.inputs.items()}
    buffers.load_rows({"committed_len": torch.tensor([3, 4]), "seed": torch.tensor([1, 2])})
    assert {name: t.data_ptr() for name, t in buffers.inputs.items()} == addresses
