"""The Triton binaries an artifact carries (graphspec/triton_binaries.py): what the recorder keeps, how they
are put into a Triton cache, and, with the real Triton compiler on this CPU machine (sm_90 builds, as
tests/lowering/test_gpu_binaries.py does), that a kernel whose folder was installed from an artifact is
found in an empty cache instead of being built."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from graphspec.errors import ArtifactError
from graphspec.triton_binaries import GROUP_PREFIX, KernelRecorder, check_listing, install, recording_manager

REPO = Path(__file__).resolve().parent.parent


def kernel_folder(root: Path, folder: str = "ABCDEF234567", name: str = "add_one") -> list[str]:
    """A kernel's cache-key folder as Triton writes it: binary, metadata, an IR and the group file that
    names them by absolute path. Returns the file names."""
    (root / folder).mkdir(parents=True)
    files = {f"{name}.cubin": b"\x7fELF...", f"{name}.json": b'{"name": "add_one"}', f"{name}.ttir": b""}
    for file, data in files.items():
        (root / folder / file).write_bytes(data)
    group = {"child_paths": {file: str(root / folder / file) for file in files}}
    (root / folder / f"{GROUP_PREFIX}{name}.json").write_text(json.dumps(group))
    return sorted([*files, f"{GROUP_PREFIX}{name}.json"])


def test_the_recorder_notes_the_folders_triton_reads_or_writes_and_counts_builds(tmp_path, monkeypatch):
    from triton.runtime.cache import FileCacheManager

    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    recorder = KernelRecorder()
    manager = recording_manager(FileCacheManager, recorder)
    assert manager("MISSED").get_file("add_one.cubin") is None and recorder.present() == {}
    manager("WRITTEN").put(b"\x7fELF", "add_one.cubin")
    (tmp_path / "READ").mkdir()
    (tmp_path / "READ" / "cuda_utils.so").write_bytes(b"\x7fELF")
    assert manager("READ").get_file("cuda_utils.so") is not None
    present = recorder.present()
    assert sorted(present) == ["READ", "WRITTEN"] and list(present["READ"]) == ["cuda_utils.so"]
    calls = []
    listen = recorder.listener(lambda **event: calls.append(event["cache_hit"]))
    listen(src=None, metadata={}, metadata_group={}, times=None, cache_hit=False)
    listen(src=None, metadata={}, metadata_group={}, times=None, cache_hit=True)
    assert calls == [False, True] and recorder.built == 1  # the listener before it still hears every event


def test_install_copies_each_folder_and_points_its_group_at_the_copies_once(tmp_path):
    source, target = tmp_path / "artifact", tmp_path / "cache"
    listing = {"ABCDEF234567": kernel_folder(source)}
    assert install(source, listing, target) == 1
    group = json.loads((target / "ABCDEF234567" / f"{GROUP_PREFIX}add_one.json").read_text())["child_paths"]
    assert group == {name: str(target / "ABCDEF234567" / name) for name in ("add_one.cubin", "add_one.json",
                                                                               "add_one.ttir")}  # fmt: skip
    assert all(Path(path).read_bytes() == (source / "ABCDEF234567" / name).read_bytes() for name, path in group.items())
    assert install(source, listing, target) == 0  # already there: left alone
    os.remove(target / "ABCDEF234567" / "add_one.cubin")
    assert install(source, listing, target) == 1  # a folder missing a file is written again


@pytest.mark.parametrize("folder, name", [("..", "x.json"), ("ABC", "../x.json"), ("A/B", "x.json"), ("ABC", "")])
def test_a_listing_that_names_anything_but_plain_file_names_is_refused(folder, name):
    with pytest.raises(ArtifactError, match="not a plain Triton cache file name"):
        check_listing({folder: [name]}, "manifest.json")


BUILD_TWICE = """
import json, os, shutil, sys
from pathlib import Path

import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from graphspec.triton_binaries import KernelRecorder, install


@triton.jit
def add_one(x, y, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y + offsets, tl.load(x + offsets, mask=offsets < n) + 1, mask=offsets < n)


def build(cache):
    os.environ["TRITON_CACHE_DIR"] = str(cache)
    signature = {"x": "*fp32", "y": "*fp32", "n": "i32", "BLOCK": "constexpr"}
    triton.compile(ASTSource(add_one, signature, {"BLOCK": 128}), target=GPUTarget("cuda", 90, 32))


root = Path(sys.argv[1])
recorder = KernelRecorder()
assert recorder.install()
build(root / "compiling")  # the process that writes the artifact
present = recorder.present()
listing = {folder: sorted(paths) for folder, paths in present.items()}
for folder, paths in present.items():
    for name, path in paths.items():
        (root / "artifact" / folder).mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, root / "artifact" / folder / name)
shutil.rmtree(root / "compiling")
counts = {"built_compiling": recorder.built, "folders": len(listing)}
counts["installed"] = install(root / "artifact", listing, root / "loading")
build(root / "loading")  # an empty cache that got the artifact's folders
counts["built_loading"] = recorder.built - counts["built_compiling"]
build(root / "bare")  # an empty cache that did not: the control
counts["built_bare"] = recorder.built - counts["built_compiling"] - counts["built_loading"]
print(json.dumps(counts))
"""


def test_a_kernel_installed_from_an_artifact_is_found_in_an_empty_triton_cache_not_built(tmp_path):
    script = tmp_path / "build_twice.py"
    script.write_text(BUILD_TWICE)
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "TRITON_CACHE_DIR")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    done = subprocess.run(
        [sys.executable, str(script), str(tmp_path)], capture_output=True, text=True, env=env, timeout=300
    )
    assert done.returncode == 0, done.stderr
    counts = json.loads(done.stdout.strip().splitlines()[-1])
    assert counts == {"built_compiling": 1, "folders": 1, "installed": 1, "built_loading": 0, "built_bare": 1}
