"""The Triton binaries an artifact carries, so that loading it builds nothing.

Triton keeps what it builds in its on-disk cache (`triton.knobs.cache.dir`, TRITON_CACHE_DIR), one folder
per cache key: a kernel's binary (.cubin), metadata (.json), intermediate IRs and a group file
`__grp__<name>.json` that names them by absolute path; and the C launcher modules (.so) that gcc builds
for each kernel signature. A Runtime on a GPU loads or builds all of them while it warms up. RECORDER,
installed before the first kernel, notes every cache folder Triton reads or writes (a cache manager class,
`knobs.cache.manager_class`, Triton's own extension point) and counts the kernels Triton had to build
(its compilation listener).

save_artifact copies the noted folders into the artifact's triton_cache/ (hashed like every file);
load_artifact puts them back into this machine's Triton cache before anything runs, with group files
rewritten to the paths there. The same Triton on the same GPU and toolchain then finds every kernel and
launcher in its cache: loading builds nothing. A key that differs (another Triton, ptxas, compiler or SM)
misses and builds as before, so a copied folder can only save work, never change what runs.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from graphspec.errors import ArtifactError

FOLDER = "triton_cache"  # in an artifact
GROUP_PREFIX = "__grp__"
# Cache-key folders are base32 digests and file names are kernel or module names plus an extension:
# nothing that could reach outside the folder (a manifest could otherwise write anywhere on install).
SAFE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,254}")


class KernelRecorder:
    """The Triton cache folders this process read or wrote (after install()), and how many kernels
    Triton had to build rather than find in its cache."""

    def __init__(self) -> None:
        self.folders: set[Path] = set()
        self.built = 0  # compilations that missed the on-disk cache (0 after loading a complete artifact)
        self.manager: type | None = None  # the cache manager class install() gave Triton

    def install(self) -> bool:
        """Record from now on; False when this Triton lacks the knobs (before 3.4) or another cache
        manager is set (a remote cache: nothing on disk to carry)."""
        if self.manager is not None:
            return True
        try:
            from triton import knobs
            from triton.runtime.cache import FileCacheManager
        except ImportError:
            return False
        cache, compilation = getattr(knobs, "cache", None), getattr(knobs, "compilation", None)
        if not hasattr(cache, "manager_class") or not hasattr(compilation, "listener") or cache.manager_class:
            return False
        self.manager = cache.manager_class = recording_manager(FileCacheManager, self)
        compilation.listener = self.listener(compilation.listener)
        return True

    def listener(self, previous: Callable[..., Any] | None) -> Callable[..., Any]:
        # Keywords as Triton passes them (src, metadata, metadata_group, times, cache_hit), taken loosely so
        # that a Triton adding one still compiles.
        def listen(**event: Any) -> None:
            self.built += not event.get("cache_hit", True)
            if previous is not None:
                previous(**event)

        return listen

    def present(self) -> dict[str, dict[str, str]]:
        """{folder name: {file name: path}} of the noted folders as they are now (in-flight temporary
        files left out; a folder a cleaned cache lost drops out)."""
        found = {}
        for folder in sorted(self.folders):
            files = {p.name: str(p) for p in sorted(folder.glob("*")) if p.is_file() and SAFE_NAME.fullmatch(p.name)}
            if files:
                found[folder.name] = files
        return found


def recording_manager(base: type, recorder: KernelRecorder) -> type:
    """Triton's file cache manager, noting each folder it finds something in or writes to."""

    class RecordingCacheManager(base):
        def get_file(self, filename: str) -> str | None:
            return self.noted(super().get_file(filename))

        def get_group(self, filename: str) -> dict[str, str] | None:
            return self.noted(super().get_group(filename))

        def put(self, data: Any, filename: str, binary: bool = True) -> str:
            return self.noted(super().put(data, filename, binary))

        def noted(self, found: Any) -> Any:
            if found is not None and self.cache_dir:
                recorder.folders.add(Path(self.cache_dir))
            return found

    return RecordingCacheManager


RECORDER = KernelRecorder()


def cache_dir() -> Path | None:
    """Triton's on-disk cache directory, or None when Triton is absent or a custom cache manager
    (knobs.cache.manager_class, e.g. a remote cache) stores kernels elsewhere."""
    try:
        from triton import knobs
    except ImportError:
        return None
    cache = getattr(knobs, "cache", None)
    manager = getattr(cache, "manager_class", None)
    if cache is None or not cache.dir or manager not in (None, RECORDER.manager):
        return None
    return Path(cache.dir)


def check_listing(listing: dict[str, list[str]], where: str) -> None:
    """Refuse a manifest listing whose folder or file names are not plain names."""
    for folder, names in listing.items():
        for name in (folder, *names):
            if not SAFE_NAME.fullmatch(name):
                raise ArtifactError(f"{where}: {FOLDER} entry {folder}/{name} is not a plain Triton cache file name")


def install(source: Path, listing: dict[str, list[str]], target: Path) -> int:
    """Copy the cache folders `listing` names from `source` (an artifact's triton_cache/) into the Triton
    cache `target`; a kernel's group file is written anew with the paths there, last, and renamed into
    place, so a concurrent reader sees a complete kernel or none. Folders that already hold every file
    (and, for a kernel, a group that resolves) are left alone. Returns how many folders were written."""
    written = 0
    for folder, names in listing.items():
        destination = target / folder
        groups = [name for name in names if name.startswith(GROUP_PREFIX)]
        files = [name for name in names if name not in groups]
        if all((destination / name).is_file() for name in files) and all(_resolves(destination / g) for g in groups):
            continue
        destination.mkdir(parents=True, exist_ok=True)
        for name in files:
            partial = destination / f"{name}.tmp.{os.getpid()}"
            shutil.copyfile(source / folder / name, partial)
            os.replace(partial, destination / name)
        for name in groups:
            children = json.loads((source / folder / name).read_text())["child_paths"]
            moved = {child: str(destination / Path(path).name) for child, path in children.items()}
            partial = destination / f"{name}.tmp.{os.getpid()}"
            partial.write_text(json.dumps({"child_paths": moved}))
            os.replace(partial, destination / name)
        written += 1
    return written


def _resolves(group: Path) -> bool:
    try:
        paths = json.loads(group.read_text())["child_paths"].values()
    except (OSError, ValueError, KeyError, AttributeError):
        return False
    return all(os.path.isfile(path) for path in paths)
