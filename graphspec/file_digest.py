"""sha256 of files in fixed-size blocks, hashed on every core.

An artifact's weights are tens of GB, and loading verifies every byte. One sha256 over a whole file is
inherently sequential (about 1.5 GB/s on one core: 12 s for an 8B/1B pair); a sha256 per 64 MiB block
detects the same changes (every byte is hashed, any change alters its block's digest) and the blocks
hash in parallel, since hashlib and os.pread release the GIL.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

BLOCK_BYTES = 64 << 20
# One read. Each read and each update re-takes the GIL, and while the weights load the main thread
# needs it (transformers' imports, config checks): 16 MiB reads take it 4x less often than 4 MiB did,
# for 16 MiB of buffer per worker.
_READ_BYTES = 16 << 20
_worker = threading.local()  # each worker's read buffer, reused for every read


def _block_sha256(path: Path, offset: int, size: int) -> str:
    # Reads go into one buffer per thread: a fresh bytes object per read costs an mmap, page faults and
    # an munmap each time, which serialise the threads on the address-space lock.
    if not hasattr(_worker, "buffer"):
        _worker.buffer = memoryview(bytearray(_READ_BYTES))
    buffer = _worker.buffer
    digest = hashlib.sha256()
    fd = os.open(path, os.O_RDONLY)
    try:
        end = offset + size
        while offset < end:
            view = buffer[: min(_READ_BYTES, end - offset)]
            read = os.preadv(fd, [view], offset)
            if not read:  # the file shrank under us: the digest will not match
                break
            digest.update(view[:read])
            offset += read
    finally:
        os.close(fd)
    return digest.hexdigest()


def _workers() -> int:
    return max(1, min(32, os.cpu_count() or 1))


def digest_files(paths: list[Path]) -> list[dict[str, Any]]:
    """One record per file: {"bytes": size, "block_bytes": BLOCK_BYTES, "sha256_blocks": [hex, ...]}
    (an empty file has no blocks), every block of every file hashed in one thread pool."""
    sizes = [path.stat().st_size for path in paths]
    jobs = [(path, offset, min(BLOCK_BYTES, size - offset)) for path, size in zip(paths, sizes, strict=True)
            for offset in range(0, size, BLOCK_BYTES)]  # fmt: skip
    with ThreadPoolExecutor(_workers()) as pool:
        digests = iter(pool.map(lambda job: _block_sha256(*job), jobs))
    records = []
    for size in sizes:
        blocks = [next(digests) for _ in range(0, size, BLOCK_BYTES)]
        records.append({"bytes": size, "block_bytes": BLOCK_BYTES, "sha256_blocks": blocks})
    return records


def digest_file(path: Path) -> dict[str, Any]:
    """digest_files for one file."""
    return digest_files([path])[0]


def copy_and_digest(source: Path, destination: Path) -> dict[str, Any]:
    """Copy (the kernel's copy where it can) and digest the copy: what the artifact holds is what is hashed."""
    destination.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source, destination)
    return digest_file(destination)


def mismatched_blocks(items: list[tuple[Path, dict[str, Any]]]) -> list[int | None]:
    """Per (file, record in digest_files' format): the index of the file's first block whose sha256
    differs from the record, or None when every block matches; all blocks hashed in one thread pool.
    The caller checks sizes first."""
    actual = digest_files([path for path, _ in items])
    results: list[int | None] = []
    for (_, record), found in zip(items, actual, strict=True):
        expected = record["sha256_blocks"]
        if record.get("block_bytes") != BLOCK_BYTES or len(expected) != len(found["sha256_blocks"]):
            results.append(0)
            continue
        bad = [index for index, (a, b) in enumerate(zip(found["sha256_blocks"], expected, strict=True)) if a != b]
        results.append(bad[0] if bad else None)
    return results
