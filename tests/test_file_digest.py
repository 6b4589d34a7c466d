"""file_digest: per-block sha256 equals hashlib over each slice, and a change anywhere names its block."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from graphspec import file_digest


@pytest.fixture(autouse=True)
def small_blocks(monkeypatch):
    monkeypatch.setattr(file_digest, "BLOCK_BYTES", 1000)
    monkeypatch.setattr(file_digest, "_READ_BYTES", 300)  # several reads per block, one short at the end


def write(path: Path, size: int) -> bytes:
    data = os.urandom(size)
    path.write_bytes(data)
    return data


@pytest.mark.parametrize("size", [0, 1, 999, 1000, 1001, 4321])
def test_blocks_are_the_sha256_of_each_slice(tmp_path, size):
    data = write(tmp_path / "w", size)
    record = file_digest.digest_file(tmp_path / "w")
    expected = [hashlib.sha256(data[at : at + 1000]).hexdigest() for at in range(0, size, 1000)]
    assert record == {"bytes": size, "block_bytes": 1000, "sha256_blocks": expected}


def test_one_changed_byte_names_its_block_and_other_files_stay_clean(tmp_path):
    paths = [tmp_path / name for name in ("a", "b", "c")]
    for path, size in zip(paths, (2500, 4000, 10), strict=True):
        write(path, size)
    records = file_digest.digest_files(paths)
    assert file_digest.mismatched_blocks(list(zip(paths, records, strict=True))) == [None, None, None]
    data = bytearray(paths[1].read_bytes())
    data[3217] ^= 1
    paths[1].write_bytes(bytes(data))
    assert file_digest.mismatched_blocks(list(zip(paths, records, strict=True))) == [None, 3, None]


def test_a_record_made_with_another_block_size_never_matches(tmp_path):
    write(tmp_path / "w", 2500)
    record = {**file_digest.digest_file(tmp_path / "w"), "block_bytes": 2000}
    assert file_digest.mismatched_blocks([(tmp_path / "w", record)]) == [0]


def test_copy_and_digest_hashes_the_copy(tmp_path):
    data = write(tmp_path / "src", 3000)
    record = file_digest.copy_and_digest(tmp_path / "src", tmp_path / "out" / "dst")
    assert (tmp_path / "out" / "dst").read_bytes() == data
    assert record == file_digest.digest_file(tmp_path / "src")
