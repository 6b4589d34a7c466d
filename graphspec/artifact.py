"""Serving artifacts: write a Compiled to a self-describing directory, and load it back verified.

An artifact directory holds:
    manifest.json                        what was compiled, for which machine and software, and the
                                         sha256 of every file the artifact loads (contains or references),
                                         per 64 MiB block so loading verifies on every core
    graphs/<graph>.json                  the step graph, one record per node: what loading rebuilds; its
                                         inputs and outputs carry the shapes they were traced with
    graphs/<graph>.py                    the same graph as generated Python (root, then submodules), for
                                         people only: not hashed, never read, may be edited or deleted
    graphs/<graph>.constants.safetensors tensors the graph reads through get_attr (only when it has any)
    graphs/prefill_b<B>_c<C>.*           the bucket's prefill chunk programs (trace_prefill.py), stored
                                         like the step graphs and listed under "prefill"
    kernels.json                         node -> kernel chosen by lower_kernels, per graph
    triton_cache/<key>/<file>            GPU artifacts: the Triton cache folders (kernels, C launchers) the
                                         compiling process read or wrote (triton_binaries.py), put into
                                         Triton's cache on load so that loading builds nothing;
                                         `graphspec compile` warms a Runtime up before writing
    drafter/<setting>.safetensors        a copy of each file a drafter setting names (a token map);
                                         the manifest's drafter record names the copy, loading reads it
    target/, draft/                      checkpoint copies (config, safetensors, tokenizer files), or,
                                         with copy_weights=False, absolute paths + sha256 in the manifest
    configs/<role>.json                  a model's config as transformers resolved it at compile, where a
                                         plain config with its values gives the same model: loading builds
                                         the model and tokenizer from it, without the family's config
                                         class (whose imports take seconds); checked against config.json

Graphs are stored structurally and rebuilt node by node, so loading neither traces nor runs a pass,
and the rebuilt graph is the compiled graph exactly (same nodes, names and generated code). Re-tracing
the generated code instead (what torch.save of a GraphModule does) would fold tensor-free factory ops
such as aten.arange into tensor constants, so the loaded graph would differ from the one compiled.

Loading checks everything before it builds anything: structure and format version, software versions
and GPU SM, the sha256 of every file, the model configs against the checkpoints' config.json (or the
resolved configs, themselves checked against config.json's plain values), the
schemas of the custom ops the graphs call, and every manifest value the runtime acts on (k, buckets,
dtype, device, max_seq_len, modes, capture, input names) against what the hashed graphs were traced
with. Each refusal is an ArtifactError that says what differs and how to fix it.

The artifact is assembled in a hidden sibling folder `.NAME.partial-HOST-PID-TOKEN` and renamed into
place; a compile killed before the rename (SIGKILL, the OOM killer) leaves that folder behind, and the
next compile into the same path removes it once its process is gone.
"""

from __future__ import annotations

import glob
import hashlib
import importlib
import importlib.metadata
import inspect
import json
import math
import os
import pkgutil
import platform
import re
import secrets
import shlex
import shutil
import socket
import sys
import time
import warnings
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
import torch.fx as fx
from safetensors.torch import load_file, save_file

from graphspec import trace
from graphspec.compiled import Compiled, device_sm, prefill_graph_name
from graphspec.config import DEFAULT_PREFILL_TOKENS, SAMPLING_MODES, SpecConfig, default_fold_norms
from graphspec.drafters import (
    DIRECTORY_KINDS,
    FILE_SETTINGS,
    NAMED_KINDS,
    SETTINGS,
    check_drafter,
    draft_config,
    open_drafter,
)
from graphspec.dump import PassRecord
from graphspec.errors import ArtifactError, GraphspecError
from graphspec.file_digest import copy_and_digest, digest_file, mismatched_blocks
from graphspec.gc_pause import paused_gc
from graphspec.input_names import weight_input_names
from graphspec.lowering.registry import kernel_module
from graphspec.models.loading import (
    VOLATILE_CONFIG_KEYS,
    LoadedModel,
    config_record,
    disagreements,
    known_config,
    known_configs,
    load_config,
    load_model,
    parse_dtype,
    prefetched,
    stands_in_for,
)
from graphspec.pipeline import PIPELINE, PREFILL_PIPELINE
from graphspec.runtime.node_program import LazyGraphModule
from graphspec.trace import model_inputs
from graphspec.trace_prefill import PrefillSignature, chunk_sizes
from graphspec.triton_binaries import FOLDER as TRITON_FOLDER
from graphspec.triton_binaries import RECORDER as TRITON_KERNELS
from graphspec.triton_binaries import cache_dir as triton_cache_dir
from graphspec.triton_binaries import check_listing
from graphspec.triton_binaries import install as install_triton_kernels
from graphspec.version import __version__

FORMAT = "graphspec-artifact"
# 2: fused qkv_proj and gate_up_proj parameters, token-major attention output
# 3: graphs record their example input/output shapes (loading checks the manifest against them);
#    graphs/*.py are no longer hashed
# 4: files are recorded as sha256 per 64 MiB block (file_digest), verified in parallel
FORMAT_VERSION = 4
MANIFEST = "manifest.json"
INVARIANT_MATMUL = "graphspec::mm_triton.default"  # what a numerics="invariant" step calls for its matmuls
# mm_triton's block_m argument: the invariant rows tile M for tensor cores (64); the default numerics' GEMV rows
# (products of 1 to kernels/gemv.py's MAX_ROWS rows) take at most this many rows.
MM_BLOCK_M, GEMV_MAX_ROWS = 2, 8
KERNELS = "kernels.json"
ROLES = ("target", "draft")  # checkpoints an artifact can hold; "draft" only for drafters with weights
# Files of a checkpoint directory that loading reads besides the safetensors shards. Other weight
# formats (.bin, .pt, .gguf) are never copied: graphspec loads safetensors only.
CHECKPOINT_FILES = (
    "config.json",
    "generation_config.json",
    "model.safetensors.index.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "tokenizer.model",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "vocab.txt",
    "merges.txt",
    "spiece.model",
    "chat_template.jinja",
    "chat_template.json",
)
# config.to_dict() keys that say where or by what a config was read, not what the model is.
RESOLVED_CONFIGS = "configs"  # configs/<role>.json: a model's config as transformers resolved it at compile
# Modules a graph's plain-function targets (operator.getitem, ...) may be imported from on load.
FUNCTION_MODULES = ("_operator", "operator", "builtins", "math", "torch")


class ArtifactMismatchWarning(UserWarning):
    """An artifact built for another GPU or software stack, loaded anyway (allow_mismatch=True)."""


# --------------------------------------------------------------------------------------------------
# Saving
# --------------------------------------------------------------------------------------------------


def save_artifact(compiled: Compiled, out: str | Path, copy_weights: bool = True) -> Path:
    """Write `compiled` to the directory `out` and return its absolute path. On a GPU the artifact carries
    every Triton cache folder (kernels and their C launchers) this process has read or written: a Runtime's
    warm-up uses all of the compiled graphs' (`graphspec compile` runs one first), so that loading it on
    this GPU and software builds nothing.

    The artifact is assembled in a sibling temporary directory and moved into place at the end, so
    an interrupted save never leaves a half-written artifact. An existing artifact at `out` is
    replaced; any other non-empty directory is refused."""
    out = Path(out).expanduser().absolute()
    _check_writable(out, compiled, copy_weights)
    out.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_partials(out)
    staging = out.parent / f".{out.name}.partial-{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(4)}"
    staging.mkdir(mode=0o777)  # the umask applies, as to every file written below (tempfile would force 0700)
    try:
        files: dict[str, dict[str, Any]] = {}
        graphs, kernels = [], {}
        for (mode, bucket), gm in compiled.graphs.items():
            graphs.append(_save_graph(compiled, mode, bucket, gm, staging, files))
            kernels[graphs[-1]["name"]] = kernel_choices(gm)
        prefill = []
        for (bucket, chunk), gm in compiled.prefill_graphs.items():
            entry = {"bucket": bucket, "chunk": chunk}
            name = prefill_graph_name(bucket, chunk)
            prefill.append({**_save_graph_files(compiled, name, gm, staging, files), **entry})
            kernels[prefill[-1]["name"]] = kernel_choices(gm)
        _write(staging / KERNELS, json.dumps(kernels, indent=2, default=str) + "\n", files, KERNELS)
        triton_kernels = _save_triton_kernels(compiled, staging, files)
        models = {
            role: _save_weights(role, loaded, staging, files, copy_weights)
            for role, loaded in checkpoints(compiled).items()
        }
        drafter = {**compiled.drafter.describe(), **_save_drafter_files(compiled, staging, files)}
        manifest = {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "command": compile_command(compiled, out, copy_weights),
            "versions": software_versions(),
            "device": {
                "device": compiled.config.device,
                "sm": compiled.sm,
                "name": _device_name(compiled.config.device),
            },
            "config": {**asdict(compiled.config), "batch_sizes": list(compiled.config.batch_sizes)},
            "modes": sorted({mode for mode, _ in compiled.graphs}, key=SAMPLING_MODES.index),
            "drafter": drafter,
            "models": models,
            "signature": {
                "target_params": list(compiled.signature.target_params),
                "draft_params": list(compiled.signature.draft_params),
                "step_inputs": list(compiled.signature.step_inputs),
            },
            "pipeline": [{"name": module.NAME, "sha256": pass_source_hash(module)} for module in PIPELINE],
            "prefill_pipeline": [
                {"name": module.NAME, "sha256": pass_source_hash(module)} for module in PREFILL_PIPELINE
            ],
            "ops": _op_schemas([*compiled.graphs.values(), *compiled.prefill_graphs.values()]),
            "graphs": graphs,
            "prefill": prefill,
            "kernels": KERNELS,
            "triton_cache": triton_kernels,
            "files": files,
        }
        _write(staging / MANIFEST, json.dumps(manifest, indent=2) + "\n")
        if out.exists():
            shutil.rmtree(out)
        staging.rename(out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return out


def remove_stale_partials(out: Path) -> list[Path]:
    """Remove the staging folders (`.NAME.partial-HOST-PID-TOKEN`) that compiles into `out` left when
    they were killed before finishing, as far as this machine can tell they are dead (same host, no
    such process). Warn about the ones it cannot judge. Returns what it removed."""
    pattern = re.compile(rf"\.{re.escape(out.name)}\.partial-(?P<host>.+)-(?P<pid>\d+)-[0-9a-f]{{8}}")
    removed = []
    for folder in sorted(out.parent.glob(f".{glob.escape(out.name)}.partial-*")):
        match = pattern.fullmatch(folder.name)
        if match and match["host"] == socket.gethostname() and not _process_alive(int(match["pid"])):
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
            continue
        if match and match["host"] == socket.gethostname():
            why = f"process {match['pid']} is still running (another compile into {out}?)"
        elif match:
            why = f"written from host {match['host']}"
        else:
            why = "written by an older graphspec"
        warnings.warn(
            f"{folder} looks like a compile into {out} that did not finish ({why}); if no compile is writing "
            f"{out}, remove it: rm -rf {shlex.quote(str(folder))}",
            stacklevel=3,
        )
    return removed


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another account's process
        return True
    return True


def check_out(out: str | Path) -> None:
    """Refuse an artifact path that cannot be written or would overwrite something that is not an
    artifact; compile() calls it before any work, save_artifact again before writing."""
    out = Path(out).expanduser().absolute()
    if out.exists() and not out.is_dir():
        raise ArtifactError(f"out {out} exists and is not a directory; choose another path")
    if out.is_dir() and any(out.iterdir()) and not (out / MANIFEST).is_file():
        raise ArtifactError(
            f"out {out} is a non-empty directory that is not a graphspec artifact; refusing to overwrite it: "
            f"choose a new or empty directory"
        )


def _check_writable(out: Path, compiled: Compiled, copy_weights: bool) -> None:
    check_out(out)
    if not copy_weights:
        for loaded in checkpoints(compiled).values():
            source = loaded.path.absolute()
            if source == out or out in source.parents:
                raise ArtifactError(
                    f"referencing the weights (copy_weights=False, --reference-weights) would reference {source}, "
                    f"inside out {out}, which is replaced; copy the weights or write to another directory"
                )


def _save_graph(
    compiled: Compiled, mode: str, bucket: int, gm: fx.GraphModule, staging: Path, files: dict[str, dict[str, Any]]
) -> dict[str, Any]:
    entry = _save_graph_files(compiled, graph_name(mode, bucket), gm, staging, files)
    return {"name": entry.pop("name"), "mode": mode, "bucket": bucket, **entry}


def _save_graph_files(
    compiled: Compiled, name: str, gm: fx.GraphModule, staging: Path, files: dict[str, dict[str, Any]]
) -> dict[str, Any]:
    """Write one graph's files (hashed into `files`) and return its manifest entry."""
    modules, constants = encode_graph_module(gm, name)
    entry: dict[str, Any] = {"name": name, "graph": f"graphs/{name}.json"}
    _write(staging / entry["graph"], json.dumps({"name": name, "modules": modules}) + "\n", files, entry["graph"])
    entry["code"] = f"graphs/{name}.py"  # for people: not in `files`, so editing or deleting it is harmless
    _write(staging / entry["code"], graph_source(gm, name))
    if constants:
        entry["constants"] = f"graphs/{name}.constants.safetensors"
        save_file(constants, str(staging / entry["constants"]))
        files[entry["constants"]] = digest_file(staging / entry["constants"])
    entry["nodes"] = sum(len(module["nodes"]) for module in modules.values())
    entry["passes"] = [_record_to_json(record) for record in compiled.records.get(name, [])]
    return entry


def _save_weights(
    role: str, loaded: LoadedModel, staging: Path, files: dict[str, dict[str, Any]], copy_weights: bool
) -> dict[str, Any]:
    source = loaded.path.absolute()
    config = normalized_config(loaded.config)
    entry: dict[str, Any] = {
        "source": str(source),
        "copied": copy_weights,
        "weights": role if copy_weights else str(source),
        "model_type": config.get("model_type"),
        "config": config,
        "files": [],
    }
    if stands_in_for(loaded.config, json.loads((loaded.path / "config.json").read_text())):
        # The config as transformers resolved it, so loading builds it without the family's config class.
        entry["resolved_config"] = f"{RESOLVED_CONFIGS}/{role}.json"
        _write(staging / entry["resolved_config"], json.dumps(config_record(loaded.config), indent=2) + "\n", files,
               entry["resolved_config"])  # fmt: skip
    for file in checkpoint_files(loaded):
        relative = file.absolute().relative_to(source).as_posix()
        if copy_weights:
            key = f"{role}/{relative}"
            files[key] = copy_and_digest(file, staging / key)
        else:
            key = str(source / relative)
            files[key] = digest_file(file)
        entry["files"].append(key)
    return entry


def _save_triton_kernels(compiled: Compiled, staging: Path, files: dict[str, dict[str, Any]]) -> dict[str, list[str]]:
    """Copy the Triton cache folders this process used into triton_cache/ (hashed like every file):
    {cache-key folder: [file names]}. A CPU artifact runs no Triton kernel and has none."""
    if not compiled.config.device.startswith("cuda"):
        return {}
    listing = {}
    for folder, paths in sorted(TRITON_KERNELS.present().items()):
        for name, path in sorted(paths.items()):
            key = f"{TRITON_FOLDER}/{folder}/{name}"
            files[key] = copy_and_digest(Path(path), staging / key)
        listing[folder] = sorted(paths)
    return listing


def _save_drafter_files(compiled: Compiled, staging: Path, files: dict[str, dict[str, Any]]) -> dict[str, str]:
    """Copy each file a drafter setting names into drafter/ (always copied, however the weights are
    stored: it is small and the artifact must not depend on where it was); setting -> its copy."""
    stored = {}
    for name in FILE_SETTINGS:
        if name in compiled.drafter.settings:
            key = f"drafter/{name}{Path(compiled.drafter.settings[name]).suffix}"
            files[key] = copy_and_digest(Path(compiled.drafter.settings[name]), staging / key)
            stored[name] = key
    return stored


def checkpoints(compiled: Compiled) -> dict[str, LoadedModel]:
    """role -> checkpoint the artifact holds: the target, and the drafter's own weights if it has any."""
    roles = {"target": compiled.target}
    if compiled.drafter.loaded is not None:
        roles["draft"] = compiled.drafter.loaded
    return roles


def manifest_roles(manifest: dict[str, Any]) -> tuple[str, ...]:
    roles = tuple(role for role in ROLES if role in manifest["models"])
    if "target" not in roles or set(manifest["models"]) - set(ROLES):
        raise ArtifactError(f"manifest models {sorted(manifest['models'])} are not a target and an optional draft")
    return roles


def checkpoint_files(loaded: LoadedModel) -> list[Path]:
    """Every file of the checkpoint that loading reads: config, safetensors shards, tokenizer files."""
    path = loaded.path
    named = [path / name for name in CHECKPOINT_FILES if (path / name).is_file()]
    tiktoken = sorted(path.glob("*.tiktoken"))
    return sorted({*named, *tiktoken, *loaded.weight_files})


def graph_name(mode: str, bucket: int) -> str:
    """The name compile() gives the (mode, bucket) graph; dumps and artifact files use it too."""
    return f"step_b{bucket}_{mode}"


def kernel_choices(gm: fx.GraphModule) -> dict[str, Any]:
    """node -> meta["gs_kernel"] for every node lower_kernels tagged (submodule nodes as path.node)."""
    return {
        f"{path}.{node.name}" if path else node.name: node.meta["gs_kernel"]
        for path, module in _graph_modules(gm)
        for node in module.graph.nodes
        if "gs_kernel" in node.meta
    }


def compile_command(compiled: Compiled, out: Path, copy_weights: bool) -> str:
    """The `graphspec compile` command line that rebuilds this artifact; error messages quote it."""
    config = compiled.config
    words = [
        "graphspec",
        "compile",
        str(compiled.target.path.absolute()),
        "--draft",
        str(compiled.drafter.loaded.path.absolute()) if compiled.drafter.loaded else compiled.drafter.kind,
        "-k",
        str(config.k),
        "--batch-sizes",
        ",".join(map(str, config.batch_sizes)),
        "--dtype",
        config.dtype,
        "--device",
        config.device,
        "--max-seq-len",
        str(config.max_seq_len),
    ]
    if config.k_by_bucket:
        words += ["--k-by-bucket", ",".join(f"{bucket}:{k}" for bucket, k in config.k_by_bucket)]
    for option, value in compiled.drafter.settings.items():
        words += [f"--{option.replace('_', '-')}", str(value)]
    if config.prefill_tokens != DEFAULT_PREFILL_TOKENS:
        words += ["--prefill-tokens", str(config.prefill_tokens)]
    if config.capture != "auto":
        words += ["--capture", config.capture]
    if config.lowering != "auto":
        words += ["--lowering", config.lowering]
    if config.numerics != "default":
        words += ["--numerics", config.numerics]
    if config.fold_norms != default_fold_norms(config.device, config.numerics):
        words += ["--fold-norms", "on" if config.fold_norms else "off"]
    modes = sorted({mode for mode, _ in compiled.graphs}, key=SAMPLING_MODES.index)
    if tuple(modes) != SAMPLING_MODES:
        words += ["--modes", ",".join(modes)]
    records = next(iter(compiled.records.values()), [])
    for record in records:
        if record.skipped:
            words += ["--skip", record.name]
    if records and records[-1].name != PIPELINE[-1].NAME:
        words += ["--stop-after", records[-1].name]
    if not copy_weights:
        words.append("--reference-weights")
    words += ["--out", str(out)]
    return shlex.join(words)


def software_versions() -> dict[str, str | None]:
    return {
        "graphspec": __version__,
        "torch": torch.__version__,
        "triton": _distribution_version("triton"),
        "transformers": _distribution_version("transformers"),
        "python": platform.python_version(),
    }


def pass_source_hash(module: object) -> str:
    return hashlib.sha256(inspect.getsource(module).encode()).hexdigest()


def normalized_config(config: Any) -> dict[str, Any]:
    """config.to_dict() as it reads back from JSON (or such a record itself), without keys that only say
    where it was read."""
    raw = config if isinstance(config, dict) else config_record(config)
    return {key: value for key, value in raw.items() if not key.startswith("_") and key not in VOLATILE_CONFIG_KEYS}


def _op_schemas(graphs: Any) -> dict[str, str]:
    """Schema of every non-aten op the graphs call. torch's own ops are covered by the torch version."""
    schemas = {}
    for gm in graphs:
        for _, module in _graph_modules(gm):
            for node in module.graph.nodes:
                target = node.target
                if node.op == "call_function" and isinstance(target, torch._ops.OpOverload):
                    if target.namespace != "aten":
                        schemas[_op_name(target)] = str(target._schema)
    return dict(sorted(schemas.items()))


def _record_to_json(record: PassRecord) -> dict[str, Any]:
    fields = asdict(record)
    # created/erased list every node name a pass touched: dump material, too long for a manifest.
    fields.pop("created")
    fields.pop("erased")
    return json.loads(json.dumps(fields, default=str))


def _device_name(device: str) -> str:
    if device.startswith("cuda") and torch.cuda.is_available():
        return torch.cuda.get_device_name(torch.device(device))
    return platform.processor() or platform.machine() or "cpu"


def _distribution_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


# --------------------------------------------------------------------------------------------------
# Graph (de)serialization: one JSON record per node; targets and constants by name.
# --------------------------------------------------------------------------------------------------


def _graph_modules(gm: fx.GraphModule) -> list[tuple[str, fx.GraphModule]]:
    """(qualified path, module) for gm ("") and every nested GraphModule (split graphs' pieces)."""
    return [(path, module) for path, module in gm.named_modules() if isinstance(module, fx.GraphModule)]


def encode_graph_module(gm: fx.GraphModule, name: str) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """{module path: {"nodes": [...], "constants": {...}}} for gm and its nested GraphModules, and
    the constant tensors keyed by qualified name (path.target)."""
    modules: dict[str, Any] = {}
    tensors: dict[str, torch.Tensor] = {}
    for path, module in _graph_modules(gm):
        # HACK(torch private): fx exposes no public accessor for a graph's codegen. A non-default
        # codegen (pytree in/out) would change the forward signature we rebuild with the default one.
        if type(module.graph._codegen) is not fx.graph.CodeGen:
            raise ArtifactError(f"graph {name} ({path or 'root'}) uses {type(module.graph._codegen).__name__}")
        constants = {}
        for node in module.graph.find_nodes(op="get_attr"):
            value = _get_attr(module, node.target)
            if isinstance(value, torch.Tensor):
                key = f"{path}.{node.target}" if path else node.target
                tensors[key] = value.detach().to("cpu").contiguous().clone()
                constants[node.target] = {"key": key, "device": str(value.device)}
            elif not isinstance(value, fx.GraphModule):
                raise ArtifactError(
                    f"cannot store graph {name}: node {node.name} reads {node.target!r}, a {type(value).__name__}"
                )
        nodes = [_encode_node(node, name) for node in module.graph.nodes]
        modules[path] = {"nodes": nodes, "constants": constants}
    return modules, tensors


# node.meta key of a rebuilt placeholder's or output's recorded example (shape, dtype, device), which a traced
# graph has as node.meta["val"] instead; not a "gs_" key, so it is not also saved with the node's meta.
EXAMPLE = "artifact_example"


def _encode_node(node: fx.Node, graph: str) -> dict[str, Any]:
    try:
        record = {
            "name": node.name,
            "op": node.op,
            "target": _encode_target(node),
            "args": _encode_value(node.args),
            "kwargs": _encode_value(node.kwargs),
        }
    except TypeError as error:
        raise ArtifactError(f"cannot store graph {graph}: node {node.name}: {error}") from None
    meta = {}
    for key, value in node.meta.items():
        if key.startswith("gs_"):
            try:
                meta[key] = _encode_value(value)
            except TypeError:
                pass  # graphspec meta that is not plain data is dump material; the graph runs without it
    if meta:
        record["meta"] = meta
    if node.op in ("placeholder", "output") and "val" in node.meta:
        record["example"] = _example(node.meta["val"])
    elif node.op in ("placeholder", "output") and EXAMPLE in node.meta:  # a loaded graph: as it was recorded
        record["example"] = node.meta[EXAMPLE]
    return record


def _example(value: Any) -> Any:
    """Shape, dtype and device of a traced example value (node.meta["val"]), or a list of them for a
    tuple: what loading checks the manifest against (see compiled_for)."""
    if isinstance(value, torch.Tensor):
        try:
            shape = [int(size) for size in value.shape]
        except (TypeError, ValueError):  # a symbolic size: nothing fixed to check against
            return None
        return {"shape": shape, "dtype": str(value.dtype).removeprefix("torch."), "device": str(value.device)}
    if isinstance(value, (tuple, list)):
        return [_example(item) for item in value]
    return None


def _encode_target(node: fx.Node) -> Any:
    target = node.target
    if node.op != "call_function":
        return target  # a string: placeholder/attribute/module/method name
    if isinstance(target, torch._ops.OpOverload):
        return {"op": _op_name(target)}
    module, qualname = getattr(target, "__module__", None), getattr(target, "__qualname__", None)
    if module in FUNCTION_MODULES or (module or "").startswith("torch."):
        if qualname and _resolve_function(module, qualname) is target:
            return {"function": f"{module}:{qualname}"}
    raise TypeError(f"calls {target!r}, which cannot be named by an importable path")


def _op_name(op: torch._ops.OpOverload) -> str:
    return f"{op._schema.name}.{op._overloadname}"  # "graphspec::kv_write.default"


def _encode_value(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else {"float": repr(value)}
    if isinstance(value, fx.Node):
        return {"node": value.name}
    if isinstance(value, list):
        return [_encode_value(item) for item in value]
    if isinstance(value, tuple):
        return {"tuple": [_encode_value(item) for item in value]}
    if isinstance(value, dict):
        if not all(isinstance(key, str) for key in value):
            raise TypeError(f"dict with non-string keys {list(value)!r}")
        return {"dict": {key: _encode_value(item) for key, item in value.items()}}
    if isinstance(value, torch.dtype):
        return {"dtype": str(value).removeprefix("torch.")}
    if isinstance(value, torch.device):
        return {"device": str(value)}
    if isinstance(value, torch.layout):
        return {"layout": str(value).removeprefix("torch.")}
    if isinstance(value, torch.memory_format):
        return {"memory_format": str(value).removeprefix("torch.")}
    if isinstance(value, slice):
        return {"slice": [_encode_value(value.start), _encode_value(value.stop), _encode_value(value.step)]}
    raise TypeError(f"argument of type {type(value).__name__} ({value!r}) has no artifact encoding")


def _decode_value(value: Any, env: dict[str, fx.Node]) -> Any:
    if isinstance(value, list):
        return [_decode_value(item, env) for item in value]
    if not isinstance(value, dict):
        return value
    (tag, payload), *rest = value.items()
    if rest:
        raise ValueError(f"malformed value {value!r}")
    if tag == "node":
        return env[payload]
    if tag == "tuple":
        return tuple(_decode_value(item, env) for item in payload)
    if tag == "dict":
        return {key: _decode_value(item, env) for key, item in payload.items()}
    if tag == "float":
        return float(payload)
    if tag == "slice":
        return slice(*(_decode_value(item, env) for item in payload))
    if tag == "device":
        return torch.device(payload)
    if tag in ("dtype", "layout", "memory_format"):
        kind = {"dtype": torch.dtype, "layout": torch.layout, "memory_format": torch.memory_format}[tag]
        resolved = getattr(torch, payload, None)
        if not isinstance(resolved, kind):
            raise ValueError(f"torch.{payload} is not a {tag} in this torch")
        return resolved
    raise ValueError(f"unknown value tag {tag!r}")


def _resolve_function(module: str, qualname: str) -> Any:
    value: Any = importlib.import_module(module)
    for part in qualname.split("."):
        value = getattr(value, part)
    return value


def resolve_op(name: str) -> torch._ops.OpOverload:
    """torch.ops lookup for "namespace::op.overload". Kernel ops register when graphspec.kernels'
    modules are imported, so those are imported before giving up on a graphspec op."""
    qualified, overload = name.rsplit(".", 1)
    namespace, op = qualified.split("::")
    try:
        return getattr(getattr(getattr(torch.ops, namespace), op), overload)
    except (AttributeError, RuntimeError):
        if namespace != "graphspec":
            raise
    # Only the module that defines it, where the naming rule finds one: importing every kernel module
    # creates every @triton.jit function (each reads its source), a second of a GPU cold start.
    if not (_import_kernel_module(op) and hasattr(torch.ops.graphspec, op)) and not _import_kernels():
        raise AttributeError(f"graphspec registers no op {op!r}")
    return getattr(getattr(torch.ops.graphspec, op), overload)


def _import_kernel_module(op: str) -> bool:
    """Import the graphspec.kernels module that defines kernel op `op` (registry.kernel_module's naming
    rule); False where there is no such module."""
    try:
        kernel_module(op)
    except ImportError:
        return False
    return True


def _import_kernels() -> bool:
    """Import every graphspec.kernels module (each registers its ops); True if any was new."""
    try:
        package = importlib.import_module("graphspec.kernels")
    except ImportError:
        return False
    new = False
    for info in pkgutil.iter_modules(package.__path__, prefix="graphspec.kernels."):
        if info.name not in sys.modules:
            try:
                importlib.import_module(info.name)
                new = True
            except ImportError:
                continue  # a kernel whose dependencies are missing here; its op stays unregistered
    return new


def _get_attr(module: torch.nn.Module, target: str) -> Any:
    value: Any = module
    for part in target.split("."):
        value = getattr(value, part)
    return value


def decode_graph_module(
    modules: dict[str, Any], constants: dict[str, torch.Tensor], name: str, lazy: bool = False
) -> fx.GraphModule:
    """Rebuild the GraphModule from encode_graph_module's records: children first, then parents. `lazy`:
    the root generates its Python code (fx's recompile, about half of a rebuild) only when something calls
    it or reads its code: on CUDA the runtime warms up and captures a loaded graph through
    runtime/node_program.py, and a prefill program runs as the two parts split from it, never whole."""
    built: dict[str, fx.GraphModule] = {}
    # Deepest paths first, so every call_module target exists when its parent is built.
    for path in sorted(modules, key=lambda p: -(p.count(".") + 1 if p else 0)):
        record = modules[path]
        graph = fx.Graph()
        env: dict[str, fx.Node] = {}
        for node_record in record["nodes"]:
            op, target = node_record["op"], node_record["target"]
            if op == "call_function":
                if "op" in target:
                    target = resolve_op(target["op"])
                else:
                    module_name, qualname = target["function"].split(":")
                    if module_name not in FUNCTION_MODULES and not module_name.startswith("torch."):
                        raise ValueError(f"node {node_record['name']} calls {module_name}:{qualname}, not allowed")
                    target = _resolve_function(module_name, qualname)
            args = _decode_value(node_record["args"], env)
            kwargs = _decode_value(node_record["kwargs"], env)
            node = graph.create_node(op, target, tuple(args), dict(kwargs), name=node_record["name"])
            if node.name != node_record["name"]:
                raise ValueError(f"node {node_record['name']} was renamed {node.name} on rebuild")
            node.meta.update({key: _decode_value(value, env) for key, value in node_record.get("meta", {}).items()})
            if "example" in node_record:  # kept for saving the graph again (a loaded graph has no traced values)
                node.meta[EXAMPLE] = node_record["example"]
            env[node.name] = node
        graph.lint()
        prefix = f"{path}." if path else ""
        # Constants go back to the device they were compiled on (the artifact's device).
        attributes: dict[str, Any] = {
            target: constants[info["key"]].to(info["device"]) for target, info in record["constants"].items()
        }
        for child_path, child in built.items():
            if child_path.startswith(prefix) and "." not in child_path[len(prefix) :] and child_path != path:
                attributes[child_path[len(prefix) :]] = child
        module_class = LazyGraphModule if lazy and not path else fx.GraphModule
        built[path] = module_class(attributes, graph, class_name=name if not path else "GraphModule")
    return built[""]


def graph_source(gm: fx.GraphModule, name: str) -> str:
    """The generated Python of gm and of each nested GraphModule, for people (loading uses the JSON)."""
    parts = [f"# {name}: generated code of the compiled step graph; the artifact loads graphs/{name}.json.\n"]
    for path, module in _graph_modules(gm):
        parts.append(f"\n# ---- {path or 'root'} ----\n{module.code.strip()}\n")
    return "".join(parts)


# --------------------------------------------------------------------------------------------------
# Files
# --------------------------------------------------------------------------------------------------


def _write(path: Path, text: str, files: dict[str, dict[str, Any]] | None = None, key: str | None = None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    if files is not None and key is not None:
        files[key] = digest_file(path)


# --------------------------------------------------------------------------------------------------
# Loading
# --------------------------------------------------------------------------------------------------


def read_manifest(path: str | Path) -> dict[str, Any]:
    """The parsed manifest of the artifact at `path`, after structural checks (no hashing)."""
    path = Path(path).expanduser()
    fix = f"write one with `graphspec compile TARGET --draft DRAFT --out {path}`"
    if not path.exists():
        raise ArtifactError(f"artifact directory {path} does not exist; {fix}")
    if not path.is_dir():
        raise ArtifactError(f"artifact {path} is not a directory; {fix}")
    manifest_path = path / MANIFEST
    if not manifest_path.is_file():
        if (path / "config.json").is_file():  # a model checkpoint given where an artifact belongs
            raise ArtifactError(
                f"{path} is a model checkpoint, not a graphspec artifact; compile one from it with "
                f"`graphspec compile {path} --draft DRAFT --out ART` and give ART"
            )
        what = (
            "is empty"
            if not any(path.iterdir())
            else f"has no {MANIFEST} (not a graphspec artifact, or an incomplete one)"
        )
        raise ArtifactError(f"artifact directory {path} {what}; {fix}")
    try:
        manifest = json.loads(manifest_path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ArtifactError(f"{manifest_path}: not valid JSON ({error}); {fix}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise ArtifactError(f'{manifest_path}: not a graphspec artifact manifest (no "format": "{FORMAT}"); {fix}')
    version = manifest.get("format_version")
    if version != FORMAT_VERSION:
        raise ArtifactError(
            f"{manifest_path}: artifact format version {version!r}, this graphspec {__version__} reads "
            f"version {FORMAT_VERSION}: recompile with `{manifest.get('command') or fix}`"
        )
    for key in ("command", "versions", "device", "config", "models", "signature", "pipeline", "ops", "graphs", "files"):
        if key not in manifest:
            raise ArtifactError(f"{manifest_path}: missing field {key!r}; recompile with `{manifest.get('command')}`")
    return manifest


def environment_mismatches(manifest: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(what, compiled for, this machine) for every software or hardware difference that may matter."""
    mismatches = []
    versions, here = manifest["versions"], software_versions()
    device = manifest["device"]["device"]
    compiled_sm = manifest["device"].get("sm")
    current_sm = device_sm(device) if device.startswith("cuda") and torch.cuda.is_available() else None
    if compiled_sm != current_sm:
        mismatches.append(("sm", _sm_text(compiled_sm, device), _sm_text(current_sm, device)))
    if versions.get("graphspec") != here["graphspec"]:
        mismatches.append(("graphspec", f"graphspec {versions.get('graphspec')}", f"graphspec {here['graphspec']}"))
    # Local build tags (+cu128, +cpu) do not change the aten ops a graph calls.
    if str(versions.get("torch")).split("+")[0] != str(here["torch"]).split("+")[0]:
        mismatches.append(("torch", f"torch {versions.get('torch')}", f"torch {here['torch']}"))
    if device.startswith("cuda") and versions.get("triton") != here["triton"]:
        mismatches.append(("triton", f"triton {versions.get('triton')}", f"triton {here['triton']}"))
    return mismatches


def changed_passes(manifest: dict[str, Any]) -> list[str]:
    """Passes whose source differs from the one that compiled the artifact (or that were added or removed)."""
    current = {module.NAME: pass_source_hash(module) for module in PIPELINE}
    compiled = {entry["name"]: entry["sha256"] for entry in manifest["pipeline"]}
    return sorted(name for name in set(current) | set(compiled) if current.get(name) != compiled.get(name))


def _sm_text(sm: int | None, device: str) -> str:
    return f"sm_{sm}" if sm is not None else f"no GPU sm (device {device})"


@paused_gc()
def load_artifact(path: str | Path, allow_mismatch: bool = False) -> Compiled:
    """Verify the artifact at `path` and rebuild its Compiled: models from the (copied or referenced)
    checkpoints, graphs from their stored nodes. Neither traces nor runs a pass.

    Refuses with ArtifactError when anything differs from what the manifest records. With
    allow_mismatch=True, a GPU SM or software version difference is a warning instead; a changed
    or missing file never is."""
    path = Path(path).expanduser().absolute()
    manifest = read_manifest(path)
    command = manifest["command"]
    try:
        return _load(path, manifest, allow_mismatch, command)
    except ArtifactError:
        raise
    except GraphspecError as error:
        raise ArtifactError(f"{path}: {error}; recompile with `{command}`") from None
    except (KeyError, TypeError, ValueError, AttributeError) as error:
        raise ArtifactError(
            f"{path}: malformed artifact ({type(error).__name__}: {error}); recompile with `{command}`"
        ) from None


def _load(path: Path, manifest: dict[str, Any], allow_mismatch: bool, command: str) -> Compiled:
    device = manifest["device"]["device"]
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ArtifactError(
            f"{path} was compiled for {device} ({_sm_text(manifest['device'].get('sm'), device)}) but CUDA is "
            f"not available on this machine: recompile with `{_with_option(command, '--device', 'cpu')}`"
        )
    mismatches = environment_mismatches(manifest)
    if mismatches:
        message = (
            f"{path} was compiled for {', '.join(m[1] for m in mismatches)}; this machine has "
            f"{', '.join(m[2] for m in mismatches)}: recompile with `{command}`"
        )
        if not allow_mismatch:
            raise ArtifactError(f"{message} (or pass --allow-mismatch / allow_mismatch=True to load it anyway)")
        warnings.warn(f"{message}; loading anyway (allow_mismatch)", ArtifactMismatchWarning, stacklevel=3)
    # The stored graphs do not depend on the pass code that produced them, so a changed pass is no
    # reason to refuse (and refusing would break every artifact on each edit during development);
    # it does mean the artifact lacks the change, which is worth saying.
    changed = changed_passes(manifest)
    if changed:
        warnings.warn(
            f"{path} was compiled by another version of pass(es) {', '.join(changed)}; its graphs run as compiled: "
            f"recompile with `{command}` to pick up the change",
            ArtifactMismatchWarning,
            stacklevel=3,
        )

    began = time.perf_counter()
    # The small files (graphs, constants, kernels, configs, tokenizers) are verified before anything
    # reads them. The weight shards, most of the bytes, hash on a side thread while load_model reads
    # them (reading safetensors runs no code from them), and the Compiled is returned only once every
    # block matched: a changed shard still refuses the whole load, in the time the load takes anyway.
    shards = {name for role in manifest_roles(manifest) for name in manifest["models"][role]["files"]}
    shards = {name for name in shards if name.endswith(".safetensors")}
    # The shards' tensors also start moving to the device now, beside the small files' verification and
    # the checks (loading.prefetched); the models take them from there.
    shard_files = sorted(_manifest_file(path, name) for name in shards)
    triton_kernels = manifest.get("triton_cache") or {}  # format-4 artifacts before it had none
    check_listing(triton_kernels, str(path / MANIFEST))
    with prefetched(shard_files, manifest["config"]["dtype"], manifest["config"]["device"]):
        _verify_files(path, manifest, command, lambda name: name not in shards)
        _install_triton_kernels(path, triton_kernels)
        small_files = time.perf_counter() - began

        def hash_shards() -> float:
            start = time.perf_counter()
            _verify_files(path, manifest, command, lambda name: name in shards)
            return time.perf_counter() - start

        with ThreadPoolExecutor(1, thread_name_prefix="graphspec-verify") as pool:
            hashing = pool.submit(hash_shards)
            try:
                with known_configs(_resolved_configs(path, manifest, command)):
                    compiled = _build(path, manifest, command)
            except BaseException:
                hashing.result()  # a changed file explains a failure best: raise that one if there is one
                raise
            waiting = time.perf_counter()
            hashed = hashing.result()
    # Phases on the critical path, in order, plus the hashing that ran beside "weights" (not added).
    verify = small_files + time.perf_counter() - waiting
    compiled.load_seconds = {"verify": verify, **compiled.load_seconds, "hashing_beside_weights": hashed}
    return compiled


def _install_triton_kernels(path: Path, listing: dict[str, list[str]]) -> None:
    """Put the artifact's (verified) Triton cache folders into this machine's Triton cache. Where that
    cannot be done (no Triton cache directory, not writable) the kernels are built on first use, as
    without them."""
    target = triton_cache_dir() if listing else None
    if target is None:
        return
    try:
        install_triton_kernels(path / TRITON_FOLDER, listing, target)
    except OSError as error:
        warnings.warn(
            f"{path}: could not copy its Triton kernels into {target} ({error}); they are built on first use",
            ArtifactMismatchWarning,
            stacklevel=4,
        )


def _resolved_configs(path: Path, manifest: dict[str, Any], command: str) -> dict[Path, dict[str, Any]]:
    """Checkpoint directory -> its config as transformers resolved it at compile (configs/<role>.json,
    verified with the small files), for the models that have one: while the models are built these stand
    in for config.json (models.loading.known_configs), so no family config class is imported (seconds)."""
    resolved = {}
    for role in manifest_roles(manifest):
        model = manifest["models"][role]
        record = model.get("resolved_config")
        if record is None:  # an older artifact, or a config a plain one cannot stand in for
            continue
        if record not in manifest["files"]:  # every file a load reads is hashed in `files`
            raise ArtifactError(f"{path / MANIFEST}: models.{role}.resolved_config {record!r} is not one of its files")
        weights = _weights_dir(path, model)
        try:
            resolved[weights] = json.loads((path / _inside(record)).read_text())
            raw = json.loads((weights / "config.json").read_text())
        except (OSError, json.JSONDecodeError, UnicodeDecodeError) as error:
            raise ArtifactError(f"{path / MANIFEST}: models.{role}.resolved_config: {error}") from None
        differ = disagreements(raw, resolved[weights]) if isinstance(raw, dict) else ["(not an object)"]
        if differ:
            raise ArtifactError(
                f"{weights / 'config.json'} disagrees with {path / record}, the config compiled from it, on "
                f"{', '.join(differ[:5])}: recompile with `{command}`"
            )
    return resolved


def _build(path: Path, manifest: dict[str, Any], command: str) -> Compiled:
    """Check the manifest against the (verified) graphs, then load weights and rebuild the graphs."""
    began = time.perf_counter()
    drafter_record = dict(manifest.get("drafter", {"kind": "draft_model"}))  # format 2 artifacts had none
    kind = drafter_record.pop("kind", None)
    if kind not in SETTINGS:
        raise ArtifactError(f"{path / MANIFEST}: unknown drafter kind {kind!r}: recompile with `{command}`")
    roles = manifest_roles(manifest)
    # Kinds without a name of their own need their checkpoint; MTP has one only as a head directory.
    if ("draft" not in roles and kind not in NAMED_KINDS) or ("draft" in roles and kind not in DIRECTORY_KINDS):
        raise ArtifactError(
            f"{path / MANIFEST}: drafter {kind!r} does not match its models {roles}: recompile with `{command}`"
        )
    weights = {role: _weights_dir(path, manifest["models"][role]) for role in roles}
    for role in roles:
        _verify_config(role, manifest["models"][role], weights[role], command, kind)
    schemas = manifest["ops"]
    for name, schema in schemas.items():
        try:
            op = resolve_op(name)
        except (AttributeError, RuntimeError, ValueError):
            raise ArtifactError(
                f"the graphs call {name}, which this graphspec does not register: recompile with `{command}`"
            ) from None
        if str(op._schema) != schema:
            raise ArtifactError(
                f"the graphs call {schema}, but this graphspec defines {op._schema}: recompile with `{command}`"
            )
    graph_docs = {}
    for entry in manifest["graphs"]:
        graph_file = path / entry["graph"]
        try:
            graph_docs[entry["name"]] = json.loads(graph_file.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as error:
            raise ArtifactError(f"{graph_file}: not valid JSON ({error}); recompile with `{command}`") from None

    traced = _check_against_graphs(path, manifest, graph_docs, command)

    # Everything is verified; build. load_model reads weights, it does not trace.
    try:
        config = SpecConfig(**{**manifest["config"], "batch_sizes": tuple(manifest["config"]["batch_sizes"])})
    except TypeError as error:
        raise ArtifactError(f"{path / MANIFEST}: bad config ({error}); recompile with `{command}`") from None
    verified = time.perf_counter()
    target = load_model(weights["target"], config.dtype, config.device, fold_norms=config.fold_norms)
    settings = {name: value for name, value in drafter_record.items() if name in SETTINGS[kind]}
    # File settings name the artifact's own (verified) copy.
    files = {name: settings.pop(name) for name in FILE_SETTINGS if name in settings}
    settings.update({name: path / _inside(relative) for name, relative in files.items()})
    checked = check_drafter(
        weights.get("draft", kind), kind, weights["target"], target.config, config.max_seq_len, settings, config.k
    )
    drafter = open_drafter(
        weights.get("draft", kind), kind, target, config.dtype, config.device, checked, settings, config.fold_norms
    )
    described = {name: value for name, value in drafter_record.items() if name not in files}
    if drafter.describe() != {"kind": kind, **described}:
        raise ArtifactError(
            f"{path / MANIFEST}: drafter {drafter_record} does not describe what its files give "
            f"({drafter.describe()}): recompile with `{command}`"
        )
    slots, dtype = max(config.batch_sizes) + 1, parse_dtype(config.dtype)
    states = trace.step_states(target.model, drafter, slots, config.max_seq_len, config.k, dtype)
    for state in states:  # what the runtime allocates (laid out for config.k) is what the graphs take
        example = traced["examples"].get(state.name)
        got = (list(state.shape), str(state.dtype).removeprefix("torch."))
        if example and (example["shape"], example["dtype"]) != got:
            raise ArtifactError(
                f"{path / MANIFEST}: config (k={config.k}) lays out state {state.name} as {got[0]} {got[1]}, the "
                f"graphs were compiled for {example['shape']} {example['dtype']}: recompile with `{command}`"
            )
    signature = trace.StepSignature(
        tuple(manifest["signature"]["target_params"]),
        tuple(manifest["signature"]["draft_params"]),
        tuple(state.name for state in states),
    )
    for role, params, names in (
        ("target", model_inputs(target.model), signature.target_params),
        ("draft", drafter.params(), signature.draft_params),
    ):
        if tuple(params) != names:
            raise ArtifactError(
                f"the {role} weights built from {weights.get(role, kind)} are other parameters than the compiled "
                f"graphs take (the model code changed since compile): recompile with `{command}`"
            )
        for name, tensor in params.items():
            example = traced["examples"].get(f"{role}.{name}")
            got = (list(tensor.shape), str(tensor.dtype).removeprefix("torch."))
            if example and (example["shape"], example["dtype"]) != got:
                raise ArtifactError(
                    f"models.{role}: {role}.{name} is {got[0]} {got[1]} in the weights at "
                    f"{weights.get(role, weights['target'])}, the graphs were compiled for {example['shape']} "
                    f"{example['dtype']}: recompile with `{command}`"
                )
    if tuple(manifest["signature"]["step_inputs"]) != signature.step_inputs:
        raise ArtifactError(f"the graphs take other step inputs than this runtime provides: recompile with `{command}`")
    _sync(config.device)
    weighed = time.perf_counter()
    # The graphs are rebuilt (seconds of Python for an 8B pair) once the weights are in, not beside their
    # transfer: the prefetch threads need the interpreter for a moment per buffer, and beside a busy main
    # thread each such moment waits out the GIL's switch interval (docs/BENCHMARKS.md: 16 GB moved in
    # 0.96 s alone, 8.1 s beside a busy thread, on an H200).
    graphs, records = {}, {}
    for entry in manifest["graphs"]:
        name = entry["name"]
        constants = load_file(str(path / entry["constants"])) if entry.get("constants") else {}
        try:
            gm = decode_graph_module(graph_docs[name]["modules"], constants, name, lazy=True)
        except (KeyError, ValueError, TypeError, AttributeError, RuntimeError) as error:
            raise ArtifactError(
                f"{path / entry['graph']}: cannot rebuild the graph ({type(error).__name__}: {error}); "
                f"recompile with `{command}`"
            ) from None
        placeholders = len(gm.graph.find_nodes(op="placeholder"))
        if placeholders != len(signature.input_names):
            raise ArtifactError(
                f"{path / entry['graph']}: graph takes {placeholders} inputs, the signature names "
                f"{len(signature.input_names)}; recompile with `{command}`"
            )
        graphs[(entry["mode"], int(entry["bucket"]))] = gm
        records[name] = [PassRecord(**fields) for fields in entry.get("passes", [])]
    missing = sorted({(m, b) for m in manifest.get("modes", []) for b in config.batch_sizes} - set(graphs))
    if missing:
        raise ArtifactError(f"{path / MANIFEST}: no graph for (mode, bucket) {missing}; recompile with `{command}`")
    prefill_graphs = _load_prefill(path, manifest, config, signature, records, command)
    sm = manifest["device"].get("sm")
    compiled = Compiled(config, target, drafter, graphs, signature, sm, records, prefill_graphs)
    done = time.perf_counter()
    compiled.load_seconds = {"checks": verified - began, "weights": weighed - verified, "graphs": done - weighed}
    return compiled


def _sync(device: str) -> None:
    """Wait for queued copies to the device, so a phase's time includes its transfers."""
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)


def _load_prefill(
    path: Path,
    manifest: dict[str, Any],
    config: SpecConfig,
    signature: trace.StepSignature,
    records: dict[str, list[PassRecord]],
    command: str,
) -> dict[tuple[int, int], fx.GraphModule]:
    """The prefill chunk programs, each checked against the chunk sizes its bucket must have; none for
    artifacts written before prefill programs existed (the runtime then prefills through the reference)."""
    if "prefill" not in manifest:
        warnings.warn(
            f"{path} has no compiled prefill programs (written by an older graphspec): prompts are prefilled "
            f"through the reference ops; recompile with `{command}` for the compiled prefill",
            ArtifactMismatchWarning,
            stacklevel=4,
        )
        return {}
    inputs = PrefillSignature(signature.target_params, signature.draft_params, signature.states).input_names
    graphs = {}
    for entry in manifest["prefill"]:
        name, bucket, chunk, where = entry["name"], int(entry["bucket"]), int(entry["chunk"]), path / entry["graph"]
        try:
            doc = json.loads(where.read_text())
            constants = load_file(str(path / entry["constants"])) if entry.get("constants") else {}
            gm = decode_graph_module(doc["modules"], constants, name, lazy=True)
        except (KeyError, ValueError, TypeError, AttributeError, RuntimeError, UnicodeDecodeError) as error:
            raise ArtifactError(
                f"{where}: cannot rebuild the graph ({type(error).__name__}: {error}); recompile with `{command}`"
            ) from None
        names = tuple(node.meta.get("gs_input") for node in gm.graph.find_nodes(op="placeholder"))
        if names != inputs:
            raise ArtifactError(
                f"{where}: the graph takes other inputs than this runtime provides: recompile with `{command}`"
            )
        traced = doc_shape(doc, "tokens")
        if traced != (bucket, chunk):
            raise ArtifactError(
                f"{where}: prefill chunk tokens {list(traced)}, the manifest says bucket {bucket}, chunk {chunk}: "
                f"recompile with `{command}`"
            )
        graphs[(bucket, chunk)] = gm
        records[name] = [PassRecord(**fields) for fields in entry.get("passes", [])]
    sizes = {b: chunk_sizes(b, config.max_seq_len, config.prefill_tokens, config.device) for b in config.batch_sizes}
    wanted = {(b, c) for b, chunks in sizes.items() for c in chunks}
    if set(graphs) != wanted:
        raise ArtifactError(
            f"{path / MANIFEST}: prefill programs (bucket, chunk) {sorted(graphs)}, but buckets "
            f"{list(config.batch_sizes)} with max_seq_len {config.max_seq_len} and prefill_tokens "
            f"{config.prefill_tokens} run {sorted(wanted)}: recompile with `{command}`"
        )
    return graphs


def doc_shape(doc: dict[str, Any], input_name: str) -> tuple[int, ...]:
    """The traced shape of one placeholder of a stored graph (its "example" record)."""
    for node in doc["modules"][""]["nodes"]:
        if node["op"] == "placeholder" and node.get("meta", {}).get("gs_input") == input_name:
            return tuple((node.get("example") or {}).get("shape") or ())
    return ()


def compiled_for(doc: dict[str, Any], where: str) -> dict[str, Any]:
    """What one stored graph was compiled for, read from the shapes its inputs and outputs were traced
    with (never from the manifest): k and the bucket from tokens [B, K+1]; dtype, device, cache slots
    and max_seq_len from target_cache [L, 2, SLOTS, Hkv, S, D]; input names in placeholder order."""
    nodes = doc["modules"][""]["nodes"]
    placeholders = [node for node in nodes if node["op"] == "placeholder"]
    names = [node.get("meta", {}).get("gs_input") for node in placeholders]
    examples = {name: node.get("example") for name, node in zip(names, placeholders, strict=True)}
    output = next(node for node in nodes if node["op"] == "output")
    output_names = _decode_value(output.get("meta", {}).get("gs_outputs", []), {})
    outputs = dict(zip(output_names, output.get("example") or [], strict=False))
    tokens, cache = outputs.get("tokens"), examples.get("target_cache")
    if not tokens or not cache:
        raise ArtifactError(f"{where} records no traced shapes for its tokens output and target_cache input")
    return {
        "inputs": tuple(names),
        "examples": examples,
        "bucket": tokens["shape"][0],
        "k": tokens["shape"][1] - 1,
        "tokens": tokens["shape"],
        "cache": cache["shape"],
        "dtype": cache["dtype"],
        "device": cache["device"],
        "slots": cache["shape"][2],
        "max_seq_len": cache["shape"][4],
        "split": any(node["op"] == "call_module" for node in nodes),  # split_attention's pieces
        # lower_kernels lowers every matmul to graphspec's tensor-core kernel under numerics="invariant"; by default
        # products of a few rows only, to its GEMV rows
        "numerics": "invariant" if invariant_matmuls(doc) else "default",
    }


def invariant_matmuls(doc: dict[str, Any]) -> bool:
    """Whether a stored graph was lowered under numerics="invariant": it calls graphspec's matmul with a tensor-core
    tile (the GEMV rows default numerics lower a few rows' products to take at most GEMV_MAX_ROWS)."""
    return any(
        node["op"] == "call_function"
        and isinstance(node.get("target"), dict)
        and node["target"].get("op") == INVARIANT_MATMUL
        and node["args"]["tuple"][MM_BLOCK_M] > GEMV_MAX_ROWS  # fx args are a tuple: _encode_value's {"tuple": [...]}
        for module in doc["modules"].values()
        for node in module["nodes"]
    )


def _check_against_graphs(
    path: Path, manifest: dict[str, Any], graph_docs: dict[str, Any], command: str
) -> dict[str, Any]:
    """Every manifest value the runtime acts on must be what the (hashed) graphs were compiled for:
    refuse, naming the field, otherwise. Returns the first graph's compiled_for()."""
    config, problems = manifest["config"], []
    facts = []
    for index, entry in enumerate(manifest["graphs"]):
        stored = graph_docs[entry["name"]].get("name")
        if not entry["name"] == stored == graph_name(entry["mode"], entry["bucket"]):
            problems.append(
                f"graphs[{index}] says name {entry['name']!r}, mode {entry['mode']!r}, bucket {entry['bucket']!r}, "
                f"but {entry['graph']} holds graph {stored!r}"
            )
            continue
        fact = compiled_for(graph_docs[stored], str(path / entry["graph"]))
        if fact["bucket"] != entry["bucket"]:
            problems.append(
                f"graphs[{index}].bucket is {entry['bucket']!r}, {entry['graph']} runs {fact['bucket']} rows"
            )
        facts.append((entry, fact))
    if problems:
        raise ArtifactError(
            f"{path / MANIFEST} disagrees with its graphs: {'; '.join(problems)}: recompile with `{command}`"
        )
    first_entry, first = facts[0]
    where = first_entry["graph"]
    buckets = sorted({entry["bucket"] for entry, _ in facts})
    # Each bucket's drafts per step: config.k unless config.k_by_bucket gives the bucket its own.
    bucket_k = {int(bucket): k for bucket, k in config.get("k_by_bucket") or []}
    for entry, fact in facts:
        recorded = bucket_k.get(entry["bucket"], config["k"])
        if fact["k"] != recorded:
            field = "config.k_by_bucket" if entry["bucket"] in bucket_k else "config.k"
            problems.append(
                f"{field} gives bucket {entry['bucket']} k={recorded} but the graphs were compiled for k={fact['k']} "
                f"({entry['graph']} emits tokens {fact['tokens']}, k+1 per row)"
            )
    expected = {
        "config.batch_sizes": (sorted(config["batch_sizes"]), buckets, "the buckets of the graphs it lists"),
        "config.max_seq_len": (config["max_seq_len"], first["max_seq_len"], f"{where} takes caches {first['cache']}"),
        "config.dtype": (config["dtype"], first["dtype"], f"{where} takes {first['dtype']} caches"),
        "config.device": (config["device"], manifest["device"]["device"], "device.device"),
        "config.numerics": (
            config.get("numerics", "default"),
            first["numerics"],
            f"{where} {'calls' if first['numerics'] == 'invariant' else 'does not call'} {INVARIANT_MATMUL} with "
            f"block_m > {GEMV_MAX_ROWS}",
        ),
        "device.device": (
            torch.device(manifest["device"]["device"]).type,
            torch.device(first["device"]).type,
            f"{where} takes tensors on {first['device']}",
        ),
        "modes": (
            sorted(manifest.get("modes", []), key=SAMPLING_MODES.index),
            sorted({entry["mode"] for entry, _ in facts}, key=SAMPLING_MODES.index),
            "the modes of the graphs it lists",
        ),
        "signature": (
            [
                *weight_input_names(manifest["signature"]["target_params"], manifest["signature"]["draft_params"]),
                *manifest["signature"]["step_inputs"],
            ],
            list(first["inputs"]),
            f"the inputs of {where}",
        ),
    }
    for field, (recorded, actual, evidence) in expected.items():
        if recorded != actual:
            problems.append(
                f"{field} is {_short(recorded)} but the graphs were compiled for {_short(actual)} ({evidence})"
            )
    # capture decides whether attention runs eagerly between captured pieces: only split graphs can.
    if (config["capture"] == "piecewise") != first["split"]:
        compiled = "'piecewise'" if first["split"] else "'auto', 'full' or 'none'"
        problems.append(
            f"config.capture is {config['capture']!r} but the graphs were compiled for {compiled} "
            f"({where} is {'split into pieces around attention' if first['split'] else 'not split'})"
        )
    # Every graph must agree with the first on what the runtime allocates once for all of them.
    for entry, fact in facts[1:]:
        for key in ("dtype", "device", "max_seq_len", "slots", "inputs", "split", "numerics"):
            if fact[key] != first[key]:
                problems.append(
                    f"{entry['graph']} was compiled for {key} {_short(fact[key])}, {where} for {_short(first[key])}"
                )
    if first["slots"] != max(buckets) + 1:
        problems.append(f"the graphs' caches have {first['slots']} slots, not largest bucket + 1 = {max(buckets) + 1}")
    if problems:
        raise ArtifactError(
            f"{path / MANIFEST} disagrees with its graphs: {'; '.join(problems)}: recompile with `{command}`"
        )
    return first


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else f"{text[:60]}... ({len(value)} items)"


def _weights_dir(path: Path, model: dict[str, Any]) -> Path:
    weights = Path(model["weights"])
    return weights if model["copied"] is False else path / _inside(model["weights"])


def _manifest_file(path: Path, name: str) -> Path:
    """A file the manifest lists: a referenced file by its absolute path, else inside the artifact."""
    return Path(name) if Path(name).is_absolute() else path / _inside(name)


def _inside(relative: str) -> str:
    """A manifest path relative to the artifact must stay inside it."""
    if Path(relative).is_absolute() or ".." in Path(relative).parts:
        raise ArtifactError(f"manifest path {relative!r} points outside the artifact")
    return relative


def _verify_files(path: Path, manifest: dict[str, Any], command: str, which: Callable[[str], bool]) -> None:
    """sha256 of the contained and referenced files whose manifest name `which` accepts; every file
    the manifest uses must be listed."""
    entries = [*manifest["graphs"], *manifest.get("prefill", [])]
    used = [entry[key] for entry in entries for key in ("graph", "constants") if entry.get(key)]
    used += [manifest.get("kernels", KERNELS)]
    used += [name for role in manifest_roles(manifest) for name in manifest["models"][role]["files"]]
    drafter = manifest.get("drafter", {})
    used += [drafter[name] for name in FILE_SETTINGS if name in drafter]
    triton_kernels = manifest.get("triton_cache") or {}
    used += [f"{TRITON_FOLDER}/{folder}/{name}" for folder, names in triton_kernels.items() for name in names]
    unlisted = [name for name in used if which(name) and name not in manifest["files"]]
    if unlisted:
        raise ArtifactError(
            f"{path / MANIFEST} lists no sha256 for {', '.join(unlisted)}, so they cannot be verified: "
            f"recompile with `{command}`"
        )
    problems, to_hash = [], []
    for name, record in manifest["files"].items():
        if not which(name):
            continue
        file = _manifest_file(path, name)
        where = name if not Path(name).is_absolute() else f"referenced file {name}"
        if not file.is_file():
            problems.append(f"{where} is missing")
        elif file.stat().st_size != record["bytes"]:
            problems.append(f"{where} has {file.stat().st_size} bytes, the manifest recorded {record['bytes']}")
        else:
            to_hash.append((where, file, record))
    # Every block of every file, hashed on every core (file_digest): the weights are most of the load.
    mismatches = mismatched_blocks([(file, record) for _, file, record in to_hash])
    for (where, _, record), block in zip(to_hash, mismatches, strict=True):
        if block is not None:
            at = f"bytes {block * record['block_bytes']} onwards" if record.get("block_bytes") else "its blocks"
            problems.append(f"{where} has another sha256 than the manifest recorded at {at} (changed or corrupt)")
    if problems:
        referenced = any(Path(name).is_absolute() for name in manifest["files"])
        restore = " or restore the referenced checkpoint" if referenced else ""
        raise ArtifactError(f"{path}: {'; '.join(problems)}: recompile with `{command}`{restore}")


def _verify_config(role: str, model: dict[str, Any], weights: Path, command: str, kind: str) -> None:
    """The manifest's copy of the model config must be what the checkpoint's config.json says."""
    # With a resolved record (configs/<role>.json, hashed) that record is what the models are built from.
    known, source = known_config(weights), f"its resolved config configs/{role}.json"
    if known is None:
        known = draft_config(weights, kind) if role == "draft" else load_config(weights)
        source = str(weights / "config.json")
    actual = normalized_config(known)
    recorded = model["config"]
    # Keys on one side only are transformers-version defaults, not edits; values that differ are.
    differ = sorted(key for key in set(actual) & set(recorded) if actual[key] != recorded[key])
    if differ:
        shown = ", ".join(f"{key} {recorded[key]!r} (manifest) vs {actual[key]!r} (config.json)" for key in differ[:5])
        raise ArtifactError(
            f"the {role} model config in {MANIFEST} differs from {source}: {shown}: recompile with `{command}`"
        )


def _with_option(command: str, option: str, value: str) -> str:
    words = shlex.split(command)
    if option in words:
        words[words.index(option) + 1] = value
    return shlex.join(words)


__all__ = [
    "ArtifactMismatchWarning",
    "changed_passes",
    "environment_mismatches",
    "load_artifact",
    "read_manifest",
    "save_artifact",
]
