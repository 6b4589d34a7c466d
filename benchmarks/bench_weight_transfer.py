"""Weight shards to the GPU: the load's prefetch (graphspec.models.loading._Prefetch: file reads into pinned
staging buffers, THREADS threads) next to safe_open + .to(device) (views of the mapped file copied from
pageable memory), alone and beside a busy Python thread (what a loader doing Python work meanwhile does to
the threads: they need the interpreter briefly per buffer).

    python benchmarks/bench_weight_transfer.py              # on a GPU: 16 GB of bf16 shards, ~1 minute

The shards (--shards x --gb-per-shard of random bf16 [14336, 4096] tensors) are written to a temporary
folder and read once beforehand, so every variant reads from a warm page cache.
"""

from __future__ import annotations

import argparse
import functools
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import torch

try:
    from benchmarks import common
except ImportError:  # run as a script from a plain checkout
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from benchmarks import common

common.setup_path()

from safetensors import safe_open  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

from graphspec.models import loading  # noqa: E402

ROWS, COLS = 14336, 4096  # an 8B MLP matrix


def write_shards(directory: Path, shards: int, gb_per_shard: float, device: torch.device) -> list[Path]:
    per_shard = max(1, round(gb_per_shard * 1e9 / (ROWS * COLS * 2)))
    files = []
    for index in range(shards):
        file = directory / f"model-{index:05d}.safetensors"
        tensors = {f"w{j}": torch.randn(ROWS, COLS, device=device, dtype=torch.bfloat16) for j in range(per_shard)}
        save_file({name: tensor.cpu() for name, tensor in tensors.items()}, str(file))
        with file.open("rb") as handle:  # into the page cache
            while handle.read(1 << 28):
                pass
        files.append(file)
    return files


def prefetch(files: list[Path], device: torch.device, threads: int, switch_interval: float | None) -> None:
    loading._Prefetch.THREADS = threads
    loading._Prefetch.SWITCH_INTERVAL = switch_interval
    prefetcher = loading._Prefetch(files, torch.bfloat16, device)
    for file in files:
        prefetcher.take(file, [], torch.bfloat16, device)  # waits for the file
    prefetcher.close()


def mapped_copies(files: list[Path], device: torch.device, threads: int) -> None:
    def read(mine: list[Path]) -> None:
        for file in mine:
            with safe_open(str(file), framework="pt", device="cpu") as handle:
                for name in handle.keys():
                    handle.get_tensor(name).to(device=device, dtype=torch.bfloat16)

    workers = [threading.Thread(target=read, args=(files[i::threads],)) for i in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()


def timed(run: Callable[[], None], device: torch.device, busy: bool) -> float:
    stop = threading.Event()

    def spin() -> None:
        count = 0
        while not stop.is_set():
            count += 1

    spinner = threading.Thread(target=spin) if busy else None
    if spinner:
        spinner.start()
    torch.cuda.synchronize(device)
    began = time.perf_counter()
    run()
    torch.cuda.synchronize(device)
    seconds = time.perf_counter() - began
    stop.set()
    if spinner:
        spinner.join()
    return seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--gb-per-shard", type=float, default=4.0)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("bench_weight_transfer: needs a CUDA GPU", file=sys.stderr)
        return 2
    device = torch.device(args.device)
    with tempfile.TemporaryDirectory(dir=common.checkpoint_dir(int(args.shards * args.gb_per_shard * 1e9))) as work:
        files = write_shards(Path(work), args.shards, args.gb_per_shard, device)
        gigabytes = sum(file.stat().st_size for file in files) / 1e9
        print(f"{gigabytes:.1f} GB of bf16 shards ({len(files)} files) to {common.device_name(args.device)}")
        print(f"{'how':<50} {'threads':>7} {'beside':>12} {'seconds':>8} {'GB/s':>6}")
        interval = loading._Prefetch.SWITCH_INTERVAL
        ours = functools.partial(prefetch, switch_interval=interval)
        stock = functools.partial(prefetch, switch_interval=None)
        variants = (
            (f"prefetch, {interval * 1e3:g} ms switch interval (the load's)", ours),
            ("prefetch, the interpreter's switch interval", stock),
            ("safe_open + .to(device)", mapped_copies),
        )
        for label, run in variants:
            for threads, busy in ((1, False), (4, False), (4, True)):
                seconds = timed(functools.partial(run, files, device, threads), device, busy)
                beside = "busy thread" if busy else "-"
                print(f"{label:<50} {threads:>7} {beside:>12} {seconds:>8.2f} {gigabytes / seconds:>6.1f}", flush=True)
                torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
