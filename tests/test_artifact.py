"""Serving artifacts: a fresh process reproduces the in-process tokens without tracing or running passes,
and every kind of damage or mismatch is refused with a message naming the file or field."""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import re
import shutil
import signal
import socket
import stat
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
import torch.fx as fx

import graphspec
from graphspec import artifact
from graphspec.artifact import ArtifactMismatchWarning, LazyGraphModule, load_artifact, resolve_op, save_artifact
from graphspec.counters import COUNTERS
from graphspec.errors import ArtifactError
from graphspec.file_digest import digest_file
from graphspec.models.loading import config_record
from graphspec.runtime.runtime import Runtime

REPO = Path(__file__).resolve().parents[1]
# Fresh interpreters (the tests' subprocesses) import this checkout's graphspec and tests.
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
PROMPTS = [[3, 4, 5], [7, 8, 9, 10]]
NEW_TOKENS = 12
SAMPLING = dict(temperature=0.9, top_k=40, top_p=0.95, seed=7)
COMPILE = dict(k=3, batch_sizes=(1, 2), dtype="float32", device="cpu", max_seq_len=64)


@pytest.fixture(scope="module")
def checkpoints(checkpoint_factory, tmp_path_factory):
    """Private copies: the reference-weights tests modify a checkpoint, which must not leak into the
    session-wide cache other test files share."""
    root = tmp_path_factory.mktemp("artifact_checkpoints")
    target = shutil.copytree(checkpoint_factory("llama", 0), root / "target")
    draft = shutil.copytree(checkpoint_factory("llama", 1, num_hidden_layers=1), root / "draft")
    return Path(target), Path(draft)


@pytest.fixture(scope="module")
def compiled(checkpoints, tmp_path_factory):
    """(Compiled, artifact dir): compiled once for the module, weights copied into the artifact."""
    out = tmp_path_factory.mktemp("artifact") / "art"
    result = graphspec.compile(*checkpoints, out=out, **COMPILE)
    return result, out


@pytest.fixture(scope="module")
def expected(compiled):
    runtime = Runtime(compiled[0])
    greedy = [r.token_ids for r in runtime.generate(PROMPTS, max_new_tokens=NEW_TOKENS)]
    sampled = [r.token_ids for r in runtime.generate(PROMPTS, max_new_tokens=NEW_TOKENS, **SAMPLING)]
    return {"greedy": greedy, "sample": sampled}


def damaged(compiled, tmp_path: Path) -> Path:
    """A private copy of the module's artifact to break."""
    return Path(shutil.copytree(compiled[1], tmp_path / "art"))


def edit_manifest(artifact: Path, edit) -> None:
    path = artifact / "manifest.json"
    manifest = json.loads(path.read_text())
    edit(manifest)
    path.write_text(json.dumps(manifest, indent=2))


def flip_byte(path: Path, offset: int | None = None) -> None:
    data = bytearray(path.read_bytes())
    offset = len(data) // 2 if offset is None else offset
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))


# --------------------------------------------------------------------------------------------------
# Round trip
# --------------------------------------------------------------------------------------------------

FRESH_PROCESS = """
import json, sys
from graphspec.counters import COUNTERS
from graphspec.runtime.runtime import Runtime

prompts, new_tokens, sampling = json.loads(sys.argv[2])
runtime = Runtime.load(sys.argv[1])
after_load = {"traces": COUNTERS.traces, "pipeline_runs": COUNTERS.pipeline_runs,
              # the artifact's resolved configs stand in for config.json: no family config class
              "config_class": "transformers.models.llama.configuration_llama" in sys.modules,
              # nor torch._dynamo (imported by such classes, by meta-device parameter init, and by
              # the first call of any torch.library.custom_op: graphspec's ops are not defined so)
              "dynamo": "torch._dynamo" in sys.modules}
greedy = [r.token_ids for r in runtime.generate(prompts, max_new_tokens=new_tokens)]
sampled = [r.token_ids for r in runtime.generate(prompts, max_new_tokens=new_tokens, **sampling)]
print(json.dumps({"after_load": after_load, "greedy": greedy, "sample": sampled,
                  "dynamo_after_requests": "torch._dynamo" in sys.modules, "traces": COUNTERS.traces,
                  "pipeline_runs": COUNTERS.pipeline_runs, "eager_steps": COUNTERS.eager_steps}))
"""


def test_fresh_process_generates_the_same_tokens_without_compiling(compiled, expected, tmp_path):
    result = subprocess.run(
        [sys.executable, "-c", FRESH_PROCESS, str(compiled[1]), json.dumps([PROMPTS, NEW_TOKENS, SAMPLING])],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env=ENV,
    )
    assert result.returncode == 0, result.stderr
    fresh = json.loads(result.stdout.strip().splitlines()[-1])
    assert fresh["after_load"] == {"traces": 0, "pipeline_runs": 0, "config_class": False, "dynamo": False}
    assert not fresh["dynamo_after_requests"]
    assert (fresh["traces"], fresh["pipeline_runs"]) == (0, 0)
    assert fresh["eager_steps"] > 0  # the tokens came from the loaded step graphs
    assert fresh["greedy"] == expected["greedy"]
    assert fresh["sample"] == expected["sample"]


def test_loaded_graphs_are_the_compiled_graphs(compiled):
    before = (COUNTERS.traces, COUNTERS.pipeline_runs)
    loaded = load_artifact(compiled[1])
    assert (COUNTERS.traces, COUNTERS.pipeline_runs) == before
    assert set(loaded.graphs) == set(compiled[0].graphs)
    for key, gm in compiled[0].graphs.items():
        assert loaded.graphs[key].code == gm.code, key
        inputs = [node.meta.get("gs_input") for node in loaded.graphs[key].graph.find_nodes(op="placeholder")]
        assert inputs == list(loaded.signature.input_names)
    assert loaded.config == compiled[0].config
    assert [r.name for r in loaded.records["step_b1_greedy"]] == [r.name for r in compiled[0].records["step_b1_greedy"]]


def test_a_loaded_runtime_says_where_its_start_up_went(compiled):
    runtime = Runtime.load(compiled[1])
    phases = runtime.startup_seconds
    assert list(phases) == [
        "verify", "checks", "weights", "graphs", "hashing_beside_weights", "state_and_programs", "warm_up_and_capture"
    ]  # fmt: skip
    assert all(seconds >= 0 for seconds in phases.values()), phases
    assert runtime.warm_up_seconds == {} == runtime.capture_phase_seconds  # a CPU runtime prepares nothing ahead


def test_loaded_prefill_programs_are_the_compiled_ones(compiled):
    loaded = load_artifact(compiled[1])
    assert set(loaded.prefill_graphs) == set(compiled[0].prefill_graphs) == {(1, 64), (1, 16), (2, 64), (2, 16)}
    for key, gm in compiled[0].prefill_graphs.items():
        assert loaded.prefill_graphs[key].code == gm.code, key
    runtime = Runtime(loaded)
    assert runtime.prefiller is not None
    prompts = [[3, 4, 5, 6, 7], [9]]
    params = {
        "temperature": torch.zeros(2), "top_k": torch.zeros(2, dtype=torch.int64), "top_p": torch.ones(2),
        "seed": torch.zeros(2, dtype=torch.int64), "step_counter": torch.zeros(2, dtype=torch.int64),
    }  # fmt: skip
    assert (
        runtime.prefill(prompts, [1, 0], params).tolist() == runtime.reference_prefill(prompts, [1, 0], params).tolist()
    )


def test_refuses_flipped_byte_in_prefill_graph_file(compiled, tmp_path):
    artifact = damaged(compiled, tmp_path)
    flip_byte(artifact / "graphs" / "prefill_b2_c64.json")
    with pytest.raises(ArtifactError, match=r"graphs/prefill_b2_c64.json has another sha256"):
        load_artifact(artifact)


def test_refuses_a_prefill_chunk_the_config_disagrees_with(compiled, tmp_path):
    """A prefill_tokens edit in the manifest would give bucket 2 another chunk than its program runs."""
    artifact = damaged(compiled, tmp_path)
    edit_manifest(artifact, lambda m: m["config"].update(prefill_tokens=8))
    programs = r"\[\(1, 16\), \(1, 64\), \(2, 16\), \(2, 64\)\]"
    with pytest.raises(ArtifactError, match=rf"prefill programs \(bucket, chunk\) {programs}, but"):
        load_artifact(artifact)


def test_artifact_without_prefill_programs_loads_with_a_warning_and_prefills_by_reference(compiled, expected, tmp_path):
    artifact = damaged(compiled, tmp_path)
    edit_manifest(artifact, lambda m: m.pop("prefill"))
    with pytest.warns(ArtifactMismatchWarning, match="no compiled prefill programs"):
        loaded = load_artifact(artifact)
    runtime = Runtime(loaded)
    assert runtime.prefiller is None
    assert [r.token_ids for r in runtime.generate(PROMPTS, max_new_tokens=NEW_TOKENS)] == expected["greedy"]


# One interpreter imports graphspec.artifact, then forks a child per op: each child resolves its op from
# exactly the state a fresh `import graphspec.artifact` process has (the parent resolves nothing), and the
# three ops pay for one torch import instead of three.
RESOLVE_IN_FRESH_PROCESSES = """
import json, os, sys, traceback
from graphspec.artifact import resolve_op
results = {}
for op in sys.argv[1:]:
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(read)
            resolve_op(op)
            os.write(write, json.dumps(sorted(m for m in sys.modules if m.startswith("graphspec.kernels."))).encode())
            os.close(write)
        except BaseException:
            traceback.print_exc()
            os._exit(1)
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        data = pipe.read()
    _, status = os.waitpid(pid, 0)
    results[op] = json.loads(data) if status == 0 else None
print(json.dumps(results))
"""
RESOLVED_OPS = [
    ("graphspec::rms_norm_triton.default", False),
    ("graphspec::rms_norm_cpu.default", False),
    ("graphspec::kv_attention_cpu.default", True),  # no module of its name: every kernel module
]


@pytest.fixture(scope="module")
def resolved_in_fresh_processes() -> dict[str, list[str] | None]:
    """op -> the graphspec.kernels modules imported after resolving it in a fresh process (None: it failed)."""
    done = subprocess.run(
        [sys.executable, "-c", RESOLVE_IN_FRESH_PROCESSES, *(op for op, _ in RESOLVED_OPS)],
        capture_output=True,
        text=True,
        env=ENV,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    results = json.loads(done.stdout.strip().splitlines()[-1])
    assert all(results[op] is not None for op, _ in RESOLVED_OPS), done.stderr
    return results


@pytest.mark.parametrize("op, imports_all", RESOLVED_OPS)
def test_resolving_a_kernel_op_imports_the_module_that_defines_it(op, imports_all, resolved_in_fresh_processes):
    # A load resolves each op its graphs call; importing every kernel module for the first kernel op
    # created every Triton function (each reads its source), about a second of a GPU cold start.
    modules = resolved_in_fresh_processes[op]
    module = "graphspec.kernels." + op.split("::")[1].split(".")[0].removesuffix("_triton")
    assert (module in modules) != imports_all
    assert ("graphspec.kernels.gated_delta_rule" in modules) == imports_all, modules


def test_resolving_an_op_nothing_defines_is_refused():
    with pytest.raises(AttributeError):
        resolve_op("graphspec::no_such_op_triton.default")


def test_split_graph_round_trips_with_its_pieces(checkpoints, tmp_path):
    original = graphspec.compile(
        *checkpoints, **{**COMPILE, "k": 2, "batch_sizes": (1,)}, capture="piecewise", modes=("greedy",), out=tmp_path
    )
    loaded = load_artifact(tmp_path)
    gm, rebuilt = original.graphs[("greedy", 1)], loaded.graphs[("greedy", 1)]
    pieces = [name for name, module in rebuilt.named_children() if isinstance(module, fx.GraphModule)]
    assert len(pieces) > 2  # attention cut the step into several pieces
    assert [(n, m.code) for n, m in gm.named_modules() if isinstance(m, fx.GraphModule)] == [
        (n, m.code) for n, m in rebuilt.named_modules() if isinstance(m, fx.GraphModule)
    ]
    prompts = [[3, 4, 5]]
    assert [r.token_ids for r in Runtime(loaded).generate(prompts, max_new_tokens=8)] == [
        r.token_ids for r in Runtime(original).generate(prompts, max_new_tokens=8)
    ]


def test_folded_norms_round_trip_and_the_graphs_refuse_unfolded_weights(checkpoints, tmp_path, monkeypatch):
    """An artifact compiled with fold_norms records it; its loader folds the checkpoint's own weights again and
    generates what the compiled runtime does. Weights loaded the other way are other parameters than the graphs
    take (the folded norms leave the declared weights), so they are refused, not run."""
    options = {**COMPILE, "batch_sizes": (1,), "modes": ("greedy",)}
    original = graphspec.compile(*checkpoints, **options, fold_norms=True, out=tmp_path / "art")
    manifest = json.loads((tmp_path / "art" / "manifest.json").read_text())
    assert manifest["config"]["fold_norms"] is True
    addmms = [n.target for n in original.graphs[("greedy", 1)].graph.nodes if "addmm" in str(n.target)]
    assert addmms and set(addmms) == {torch.ops.aten.addmm_.default}
    assert [r.token_ids for r in Runtime.load(tmp_path / "art").generate(PROMPTS, max_new_tokens=8)] == [
        r.token_ids for r in Runtime(original).generate(PROMPTS, max_new_tokens=8)
    ]
    from graphspec import artifact

    load_model = artifact.load_model
    monkeypatch.setattr(artifact, "load_model", lambda *args, fold_norms: load_model(*args, fold_norms=False))
    with pytest.raises(ArtifactError, match="other parameters than the compiled graphs take") as refused:
        load_artifact(tmp_path / "art")
    assert "--fold-norms on" in str(refused.value)  # the recompile command keeps the choice (auto: off on the CPU)


def test_kernel_choices_are_saved_and_restored(compiled, tmp_path):
    result = compiled[0]
    gm = copy.deepcopy(result.graphs[("greedy", 1)])
    attention = next(n for n in gm.graph.nodes if n.op == "call_function" and "attention" in str(n.target))
    attention.meta["gs_kernel"] = "attention_sm90"
    greedy = dataclasses.replace(result, graphs={("greedy", 1): gm, ("greedy", 2): result.graphs[("greedy", 2)]})
    save_artifact(greedy, tmp_path / "art")
    assert json.loads((tmp_path / "art" / "kernels.json").read_text()) == {
        "step_b1_greedy": {attention.name: "attention_sm90"},
        "step_b2_greedy": {},
        "prefill_b1_c64": {},  # CPU: the prefill programs keep their reference ops too
        "prefill_b1_c16": {},
        "prefill_b2_c64": {},
        "prefill_b2_c16": {},
    }
    loaded = load_artifact(tmp_path / "art").graphs[("greedy", 1)]
    assert {n.name: n.meta["gs_kernel"] for n in loaded.graph.nodes if "gs_kernel" in n.meta} == {
        attention.name: "attention_sm90"
    }


def test_save_refuses_to_overwrite_a_directory_that_is_not_an_artifact(compiled, tmp_path):
    (tmp_path / "notes.txt").write_text("keep me")
    with pytest.raises(ArtifactError, match="not a graphspec artifact"):
        save_artifact(compiled[0], tmp_path)
    assert (tmp_path / "notes.txt").read_text() == "keep me"


# --------------------------------------------------------------------------------------------------
# Refusals: structure
# --------------------------------------------------------------------------------------------------


def test_refuses_missing_directory(tmp_path):
    with pytest.raises(ArtifactError, match=r"missing_art does not exist"):
        load_artifact(tmp_path / "missing_art")


def test_refuses_empty_directory(tmp_path):
    with pytest.raises(ArtifactError, match="is empty"):
        load_artifact(tmp_path)


def test_refuses_directory_without_manifest(compiled, tmp_path):
    artifact = damaged(compiled, tmp_path)
    (artifact / "manifest.json").unlink()
    with pytest.raises(ArtifactError, match=r"has no manifest\.json"):
        load_artifact(artifact)


def test_refuses_manifest_that_is_not_json(compiled, tmp_path):
    artifact = damaged(compiled, tmp_path)
    (artifact / "manifest.json").write_text('{"format": "graphspec-artifact",')
    with pytest.raises(ArtifactError, match=r"manifest.json: not valid JSON"):
        load_artifact(artifact)


def test_refuses_other_format_version(compiled, tmp_path):
    artifact = damaged(compiled, tmp_path)
    edit_manifest(artifact, lambda m: m.update(format_version=99))
    with pytest.raises(ArtifactError, match="format version 99"):
        load_artifact(artifact)


def test_refuses_manifest_without_a_hash_for_a_file_it_uses(compiled, tmp_path):
    artifact = damaged(compiled, tmp_path)
    edit_manifest(artifact, lambda m: m["files"].pop("graphs/step_b1_greedy.json"))
    with pytest.raises(ArtifactError, match=r"lists no sha256 for graphs/step_b1_greedy.json"):
        load_artifact(artifact)


def carry_a_kernel(artifact: Path) -> Path:
    """Give the artifact a Triton kernel folder, hashed and listed as save_artifact does on a GPU."""
    folder = artifact / "triton_cache" / "ABCDEF234567"
    folder.mkdir(parents=True)
    (folder / "add_one.cubin").write_bytes(b"\x7fELF" + bytes(range(64)))
    (folder / "add_one.json").write_text('{"name": "add_one"}')
    compiling = "/home/someone/.triton/cache/ABCDEF234567"  # the group names files where they were built
    children = {name: f"{compiling}/{name}" for name in ("add_one.cubin", "add_one.json")}
    (folder / "__grp__add_one.json").write_text(json.dumps({"child_paths": children}))

    def edit(manifest: dict) -> None:
        manifest["triton_cache"] = {folder.name: ["__grp__add_one.json", "add_one.cubin", "add_one.json"]}
        for name in manifest["triton_cache"][folder.name]:
            manifest["files"][f"triton_cache/{folder.name}/{name}"] = digest_file(folder / name)

    edit_manifest(artifact, edit)
    return folder


def test_a_cpu_artifact_carries_no_triton_kernels(compiled):
    assert json.loads((compiled[1] / "manifest.json").read_text())["triton_cache"] == {}
    assert not (compiled[1] / "triton_cache").exists()


def test_carried_triton_kernels_are_verified_then_put_into_the_triton_cache(compiled, tmp_path, monkeypatch):
    artifact = damaged(compiled, tmp_path)
    folder = carry_a_kernel(artifact)
    cache = tmp_path / "triton-cache"
    monkeypatch.setenv("TRITON_CACHE_DIR", str(cache))
    load_artifact(artifact)
    group = json.loads((cache / folder.name / "__grp__add_one.json").read_text())["child_paths"]
    assert group == {name: str(cache / folder.name / name) for name in ("add_one.cubin", "add_one.json")}
    assert (cache / folder.name / "add_one.cubin").read_bytes() == (folder / "add_one.cubin").read_bytes()
    # A changed kernel file refuses the load before anything reaches the cache.
    shutil.rmtree(cache)
    flip_byte(folder / "add_one.cubin")
    with pytest.raises(ArtifactError, match=r"add_one\.cubin"):
        load_artifact(artifact)
    assert not cache.exists()


def test_a_carried_kernel_file_without_a_hash_is_refused(compiled, tmp_path):
    artifact = damaged(compiled, tmp_path)
    folder = carry_a_kernel(artifact)
    edit_manifest(artifact, lambda m: m["files"].pop(f"triton_cache/{folder.name}/add_one.cubin"))
    with pytest.raises(ArtifactError, match=rf"lists no sha256 for triton_cache/{folder.name}/add_one\.cubin"):
        load_artifact(artifact)


# --------------------------------------------------------------------------------------------------
# Refusals: files
# --------------------------------------------------------------------------------------------------


def test_refuses_missing_weight_shard(compiled, tmp_path):
    artifact = damaged(compiled, tmp_path)
    (artifact / "target" / "model.safetensors").unlink()
    with pytest.raises(ArtifactError, match=r"target/model.safetensors is missing"):
        load_artifact(artifact)


def test_refuses_flipped_byte_in_weight_file(compiled, tmp_path):
    artifact = damaged(compiled, tmp_path)
    flip_byte(artifact / "draft" / "model.safetensors")
    with pytest.raises(ArtifactError, match=r"draft/model.safetensors has another sha256 .* at bytes 0 onwards"):
        load_artifact(artifact)


def test_a_shard_that_no_longer_parses_is_refused_for_its_hash(compiled, tmp_path):
    # The shards hash while the weights load: a load that fails on the damage must still report it as
    # the changed file it is, not as a checkpoint error.
    artifact = damaged(compiled, tmp_path)
    flip_byte(artifact / "target" / "model.safetensors", offset=8)  # the header's opening brace
    with pytest.raises(ArtifactError, match=r"target/model.safetensors has another sha256 .* at bytes 0 onwards"):
        load_artifact(artifact)


def test_refuses_flipped_byte_in_graph_file(compiled, tmp_path):
    artifact = damaged(compiled, tmp_path)
    flip_byte(artifact / "graphs" / "step_b2_sample.json")
    with pytest.raises(ArtifactError, match=r"graphs/step_b2_sample.json has another sha256"):
        load_artifact(artifact)


def test_refuses_truncated_safetensors_header(compiled, tmp_path):
    artifact = damaged(compiled, tmp_path)
    shard = artifact / "target" / "model.safetensors"
    shard.write_bytes(shard.read_bytes()[:20])  # inside the 8-byte length + JSON header
    with pytest.raises(ArtifactError, match=r"target/model.safetensors has 20 bytes"):
        load_artifact(artifact)


def test_allow_mismatch_never_allows_a_changed_file(compiled, tmp_path):
    artifact = damaged(compiled, tmp_path)
    edit_manifest(artifact, lambda m: m["versions"].update(torch="2.0.0"))
    flip_byte(artifact / "graphs" / "step_b1_greedy.json")
    with pytest.warns(ArtifactMismatchWarning), pytest.raises(ArtifactError, match="has another sha256"):
        load_artifact(artifact, allow_mismatch=True)


# --------------------------------------------------------------------------------------------------
# Refusals: machine, software, model config
# --------------------------------------------------------------------------------------------------


def test_refuses_other_sm_and_allow_mismatch_loads_with_a_warning(compiled, tmp_path):
    artifact = damaged(compiled, tmp_path)
    edit_manifest(artifact, lambda m: m["device"].update(sm=80))
    with pytest.raises(ArtifactError, match=r"compiled for sm_80.*recompile with `graphspec compile .*--out"):
        load_artifact(artifact)
    with pytest.warns(ArtifactMismatchWarning, match="sm_80"):
        loaded = load_artifact(artifact, allow_mismatch=True)
    assert set(loaded.graphs) == set(compiled[0].graphs)


def test_refuses_other_torch_version(compiled, tmp_path):
    artifact = damaged(compiled, tmp_path)
    edit_manifest(artifact, lambda m: m["versions"].update(torch="2.0.0+cu118"))
    here = re.escape(torch.__version__)
    with pytest.raises(ArtifactError, match=rf"compiled for torch 2\.0\.0\+cu118; this machine has torch {here}"):
        load_artifact(artifact)


def test_changed_pass_source_is_a_warning_not_a_refusal(compiled, tmp_path):
    # Stored graphs do not depend on the pass code that made them; the user still hears about it.
    artifact = damaged(compiled, tmp_path)
    edit_manifest(artifact, lambda m: m["pipeline"][1].update(sha256="0" * 64))
    with pytest.warns(ArtifactMismatchWarning, match=r"pass\(es\) mask_padding"):
        loaded = load_artifact(artifact)
    assert set(loaded.graphs) == set(compiled[0].graphs)


def test_refuses_model_config_edited_in_manifest(compiled, tmp_path):
    artifact = damaged(compiled, tmp_path)
    edit_manifest(artifact, lambda m: m["models"]["target"]["config"].update(num_hidden_layers=7))
    with pytest.raises(ArtifactError, match=r"target model config .*num_hidden_layers 7 \(manifest\) vs 2"):
        load_artifact(artifact)


def test_each_model_carries_its_resolved_config(compiled):
    """configs/<role>.json: the config as transformers resolved it, hashed like every file it reads."""
    manifest = json.loads((compiled[1] / "manifest.json").read_text())
    for role in ("target", "draft"):
        record = manifest["models"][role]["resolved_config"]
        assert record == f"configs/{role}.json" and record in manifest["files"]
        config = compiled[0].target.config if role == "target" else compiled[0].drafter.loaded.config
        assert json.loads((compiled[1] / record).read_text()) == config_record(config)


def test_refuses_an_edited_resolved_config(compiled, tmp_path):
    artifact = damaged(compiled, tmp_path)
    record = artifact / "configs" / "target.json"
    record.write_text(record.read_text().replace('"num_hidden_layers": 2', '"num_hidden_layers": 3'))
    with pytest.raises(ArtifactError, match=r"configs/target.json"):
        load_artifact(artifact)


def test_refuses_a_resolved_config_without_a_hash(compiled, tmp_path):
    artifact = damaged(compiled, tmp_path)
    edit_manifest(artifact, lambda m: m["files"].pop("configs/target.json"))
    with pytest.raises(ArtifactError, match=r"resolved_config 'configs/target.json' is not one of its files"):
        load_artifact(artifact)


def test_refuses_a_config_json_edited_after_compile(compiled, tmp_path):
    """config.json changed (and its hash with it) no longer matches the config compiled from it."""
    artifact = damaged(compiled, tmp_path)
    config = artifact / "target" / "config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "rms_norm_eps": 0.5}))
    edit_manifest(artifact, lambda m: m["files"].update({"target/config.json": digest_file(config)}))
    with pytest.raises(ArtifactError, match=r"config.json disagrees with .*configs/target.json.* on rms_norm_eps"):
        load_artifact(artifact)


def test_an_artifact_without_resolved_configs_reads_config_json(compiled, expected, tmp_path):
    """Artifacts written before configs/ existed (or configs a plain one cannot stand in for) load as before."""
    artifact = damaged(compiled, tmp_path)
    edit_manifest(artifact, lambda m: [m["models"][role].pop("resolved_config") for role in ("target", "draft")])
    runtime = Runtime(load_artifact(artifact))
    assert [r.token_ids for r in runtime.generate(PROMPTS, max_new_tokens=NEW_TOKENS)] == expected["greedy"]


# --------------------------------------------------------------------------------------------------
# Manifest values the runtime acts on must be what the graphs were compiled for (k=3, buckets 1,2,
# float32 on cpu, max_seq_len 64, not split)
# --------------------------------------------------------------------------------------------------


def set_field(dotted: str, value):
    """An edit_manifest edit: manifest[a][b]... = value, list indices as digits ("graphs.0.bucket")."""

    def edit(manifest):
        *parents, last = (int(part) if part.isdigit() else part for part in dotted.split("."))
        for part in parents:
            manifest = manifest[part]
        manifest[last] = value

    return edit


REFUSED_EDITS = {
    "k_smaller": ("config.k", 2, r"config\.k gives bucket 1 k=2 but the graphs were compiled for k=3"),
    "k_larger": ("config.k", 8, r"config\.k gives bucket 1 k=8 but the graphs were compiled for k=3"),
    "k_by_bucket": ("config.k_by_bucket", [[2, 1]], r"config\.k_by_bucket gives bucket 2 k=1 but .* for k=3"),
    "max_seq_len_larger": ("config.max_seq_len", 128, r"config\.max_seq_len is 128 but .* compiled for 64"),
    "max_seq_len_smaller": ("config.max_seq_len", 32, r"config\.max_seq_len is 32 but .* compiled for 64"),
    "dtype": ("config.dtype", "bfloat16", r"config\.dtype is 'bfloat16' but .* compiled for 'float32'"),
    "device": ("config.device", "cuda", r"config\.device is 'cuda' but .* compiled for 'cpu'"),
    "batch_sizes_more": ("config.batch_sizes", [1, 2, 4], r"config\.batch_sizes is \[1, 2, 4\] but .* \[1, 2\]"),
    "batch_sizes_fewer": ("config.batch_sizes", [1], r"config\.batch_sizes is \[1\] but .* \[1, 2\]"),
    "modes": ("modes", ["greedy"], r"modes is \['greedy'\] but .* \['greedy', 'sample'\]"),
    "capture_piecewise": ("config.capture", "piecewise", r"config\.capture is 'piecewise' but .* not split"),
    "numerics": ("config.numerics", "invariant", r"config\.numerics is 'invariant' but .* compiled for 'default'"),
    "graph_bucket": ("graphs.0.bucket", 2, r"graphs\[0\] says .* bucket 2, but graphs/step_b1_greedy.json holds"),
    "graph_mode": ("graphs.0.mode", "sample", r"graphs\[0\] says .* mode 'sample'"),
    "graph_file": ("graphs.0.graph", "graphs/step_b2_greedy.json", r"graphs\[0\] says .* holds graph 'step_b2"),
    "signature": ("signature.draft_params", [], r"signature is \["),
}


def test_numerics_are_read_from_the_matmuls_the_graphs_call() -> None:
    """Default numerics on a GPU lower a few rows' products to graphspec's GEMV rows of mm_triton (block_m <= 8),
    invariant numerics every matmul to its tensor-core rows; the rule reads block_m where graphs record it."""
    from graphspec.kernels import gemv, mm

    assert artifact.GEMV_MAX_ROWS == gemv.MAX_ROWS
    assert mm.mm_triton._schema.arguments[artifact.MM_BLOCK_M].name == "block_m"

    def doc(*block_ms: int) -> dict:
        """A graph calling mm_triton with these block_m, stored as save_artifact stores graphs."""
        graph = fx.Graph()
        x, w = graph.placeholder("x"), graph.placeholder("w")
        config = {**mm.CONFIGS[90]}
        for block_m in block_ms:
            config["block_m"] = block_m
            graph.call_function(torch.ops.graphspec.mm_triton.default, (x, w, *config.values()))
        graph.output(None)
        return {"modules": artifact.encode_graph_module(fx.GraphModule({}, graph), "step")[0]}

    assert not artifact.invariant_matmuls(doc())  # a CPU graph: cuBLAS
    assert not artifact.invariant_matmuls(doc(1, 8))  # the GEMVs at batch 1
    assert artifact.invariant_matmuls(doc(mm.CONFIGS[90]["block_m"]))
    assert artifact.invariant_matmuls(doc(8, 64))


@pytest.mark.parametrize("case", sorted(REFUSED_EDITS))
def test_refuses_a_manifest_value_the_graphs_disagree_with(compiled, tmp_path, case):
    field, value, message = REFUSED_EDITS[case]
    artifact = damaged(compiled, tmp_path)
    edit_manifest(artifact, set_field(field, value))
    with pytest.raises(ArtifactError, match=message):
        load_artifact(artifact)


def test_refuses_weights_of_other_shapes_than_the_graphs_take(compiled, checkpoint_factory, tmp_path):
    artifact = damaged(compiled, tmp_path)
    # Same architecture and parameter names, wider MLP: config.json and weights edited consistently.
    wider = checkpoint_factory("llama", 1, num_hidden_layers=1, intermediate_size=192)
    manifest = json.loads((artifact / "manifest.json").read_text())
    for name in ("config.json", "model.safetensors"):
        shutil.copy(wider / name, artifact / "draft" / name)
        manifest["files"][f"draft/{name}"] = digest_file(artifact / "draft" / name)
    manifest["models"]["draft"]["config"]["intermediate_size"] = 192
    record = artifact / "configs" / "draft.json"  # the config as compiled, edited to match
    record.write_text(json.dumps({**json.loads(record.read_text()), "intermediate_size": 192}))
    manifest["files"]["configs/draft.json"] = digest_file(record)
    (artifact / "manifest.json").write_text(json.dumps(manifest))
    message = r"models\.draft: .*gate_up_proj\.weight is \[384, 64\] float32 .* compiled for \[256, 64\]"
    with pytest.raises(ArtifactError, match=message):
        load_artifact(artifact)


HARMLESS_EDITS = (
    # Read by nobody at run time: compile-time choices, shown by inspect.
    ("config.lowering", "reference"),
    ("created", "1970-01-01T00:00:00+0000"),
    ("device.name", "another CPU"),
    ("graphs.0.nodes", 1),
    ("graphs.0.passes", []),
    # Capture on or off: replays compute what eager steps do (tests/runtime/test_graphs.py), and CPU never captures.
    ("config.capture", "none"),
)


def test_manifest_values_the_runtime_does_not_act_on_change_nothing(compiled, expected, tmp_path):
    artifact = damaged(compiled, tmp_path)
    for field, value in HARMLESS_EDITS:
        edit_manifest(artifact, set_field(field, value))
    runtime = Runtime.load(artifact)
    assert [r.token_ids for r in runtime.generate(PROMPTS, max_new_tokens=NEW_TOKENS)] == expected["greedy"]
    assert [r.token_ids for r in runtime.generate(PROMPTS, max_new_tokens=NEW_TOKENS, **SAMPLING)] == expected["sample"]


def test_the_readable_graph_code_may_be_edited_or_deleted(compiled, expected, tmp_path):
    artifact = damaged(compiled, tmp_path)
    (artifact / "graphs" / "step_b1_greedy.py").unlink()
    (artifact / "graphs" / "step_b2_greedy.py").write_text("# notes\n")
    runtime = Runtime.load(artifact)
    assert [r.token_ids for r in runtime.generate(PROMPTS, max_new_tokens=NEW_TOKENS)] == expected["greedy"]


# --------------------------------------------------------------------------------------------------
# Files on disk: permissions, interrupted compiles
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("umask", [0o022, 0o002, 0o077])
def test_artifact_permissions_follow_the_umask(compiled, tmp_path, umask):
    previous = os.umask(umask)
    try:
        out = save_artifact(compiled[0], tmp_path / "art")
    finally:
        os.umask(previous)
    assert stat.S_IMODE(out.stat().st_mode) == 0o777 & ~umask
    assert stat.S_IMODE((out / "graphs").stat().st_mode) == 0o777 & ~umask
    assert stat.S_IMODE((out / "manifest.json").stat().st_mode) == 0o666 & ~umask


KILLED_SAVE = """
import os, signal, sys
from graphspec import artifact

compiled = artifact.load_artifact(sys.argv[1])
def killed(*args, **kwargs):  # SIGKILL (the OOM killer) while copying the weights: no cleanup runs
    os.kill(os.getpid(), signal.SIGKILL)
artifact.copy_and_digest = killed
artifact.save_artifact(compiled, sys.argv[2])
"""


def test_a_killed_compile_leaves_a_partial_folder_the_next_one_removes(compiled, tmp_path):
    out = tmp_path / "art"
    killed = subprocess.run(
        [sys.executable, "-c", KILLED_SAVE, str(compiled[1]), str(out)], capture_output=True, timeout=300, env=ENV
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    partials = list(tmp_path.glob(".art.partial-*"))
    assert len(partials) == 1 and not out.exists()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a dead process's folder is removed without a word
        save_artifact(compiled[0], out)
    assert sorted(path.name for path in tmp_path.iterdir()) == ["art"]
    load_artifact(out)


def test_partial_folders_it_cannot_judge_are_reported_with_how_to_remove_them(compiled, tmp_path):
    running = tmp_path / f".art.partial-{socket.gethostname()}-{os.getpid()}-0123abcd"  # this process: alive
    other_host = tmp_path / ".art.partial-elsewhere-12345-0123abcd"
    older = tmp_path / ".art.partial-x8_kq2vb"  # tempfile's naming, before the pid was in the name
    for folder in (running, other_host, older):
        folder.mkdir()
    with pytest.warns(UserWarning, match="rm -rf") as caught:
        save_artifact(compiled[0], tmp_path / "art")
    reported = " ".join(str(warning.message) for warning in caught)
    for folder, reason in ((running, "still running"), (other_host, "from host elsewhere"), (older, "older")):
        assert folder.is_dir() and str(folder) in reported and reason in reported


# --------------------------------------------------------------------------------------------------
# Reference-weights mode
# --------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def referenced(compiled, tmp_path_factory):
    """The module's Compiled saved again with its (module-private) checkpoints referenced, not copied."""
    out = tmp_path_factory.mktemp("referenced") / "art"
    return save_artifact(compiled[0], out, copy_weights=False)


def test_reference_weights_load_and_generate(referenced, checkpoints, expected):
    assert not [p for p in referenced.rglob("*.safetensors") if p.parent.name != "graphs"]  # no weights copied
    manifest = json.loads((referenced / "manifest.json").read_text())
    assert str(checkpoints[0] / "model.safetensors") in manifest["files"]
    runtime = Runtime.load(referenced)
    assert [r.token_ids for r in runtime.generate(PROMPTS, max_new_tokens=NEW_TOKENS)] == expected["greedy"]


def test_reference_weights_refuse_a_changed_checkpoint(referenced, checkpoints):
    shard = checkpoints[1] / "model.safetensors"
    original = shard.read_bytes()
    try:
        flip_byte(shard)
        with pytest.raises(ArtifactError, match=rf"referenced file {shard} has another sha256.*restore"):
            load_artifact(referenced)
    finally:
        shard.write_bytes(original)


# --------------------------------------------------------------------------------------------------
# GPU: bf16, Triton kernels, CUDA-graph capture after loading
# --------------------------------------------------------------------------------------------------

GPU_PROCESS = """
import json, sys
from graphspec.counters import COUNTERS
from graphspec.runtime.runtime import Runtime
from graphspec.triton_binaries import RECORDER

prompts, new_tokens = json.loads(sys.argv[2])
runtime = Runtime.load(sys.argv[1])
tokens = [r.token_ids for r in runtime.generate(prompts, max_new_tokens=new_tokens)]
print(json.dumps({"tokens": tokens, "traces": COUNTERS.traces, "pipeline_runs": COUNTERS.pipeline_runs,
                  "captures": COUNTERS.captures, "kernels_built": RECORDER.built,
                  "kernels_loaded": len(RECORDER.folders), "dynamo": "torch._dynamo" in sys.modules,
                  "kernel_modules": sorted(m for m in sys.modules if m.startswith("graphspec.kernels.")),
                  "warm_up": sorted(runtime.warm_up_seconds), "capture_phases": runtime.capture_phase_seconds}))
"""


def run_fresh_process(artifact: Path, **env: str) -> dict:
    """GPU_PROCESS on `artifact` in a new interpreter (environment additions `env`): what it reports."""
    process = subprocess.run(
        [sys.executable, "-c", GPU_PROCESS, str(artifact), json.dumps([PROMPTS, NEW_TOKENS])],
        capture_output=True,
        text=True,
        timeout=600,
        env={**ENV, **env},
    )
    assert process.returncode == 0, process.stderr
    return json.loads(process.stdout.strip().splitlines()[-1])


@pytest.mark.gpu
def test_gpu_artifact_from_the_cli_carries_its_kernels_so_an_empty_triton_cache_builds_none(
    checkpoint_factory, tmp_path
):
    """`graphspec compile` warms a Runtime up before saving, so the artifact carries every Triton kernel; a
    fresh process whose Triton cache is empty then loads all of them from there and builds none."""
    dims = dict(hidden_size=256, intermediate_size=512, num_attention_heads=4, num_key_value_heads=2)
    target = checkpoint_factory("llama", 0, **dims)
    draft = checkpoint_factory("llama", 1, num_hidden_layers=1, **dims)
    env = {**ENV, "TRITON_CACHE_DIR": str(tmp_path / "compiling-cache")}
    command = [sys.executable, "-m", "graphspec", "compile", str(target), "--draft", str(draft), "-k", "3",
               "--batch-sizes", "1,2", "--dtype", "bfloat16", "--device", "cuda", "--max-seq-len", "128",
               "--out", str(tmp_path / "art")]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stderr
    carried = json.loads((tmp_path / "art" / "manifest.json").read_text())["triton_cache"]
    assert len(carried) > 5, carried
    fresh = run_fresh_process(tmp_path / "art", TRITON_CACHE_DIR=str(tmp_path / "empty-cache"))
    assert fresh["kernels_built"] == 0 and fresh["kernels_loaded"] > 5, fresh
    assert fresh["captures"] > 0 and (fresh["traces"], fresh["pipeline_runs"]) == (0, 0)


@pytest.mark.gpu
@pytest.mark.parametrize("capture", ["full", "piecewise"])
def test_gpu_artifact_with_kernels_replays_the_same_tokens_in_a_fresh_process(checkpoint_factory, tmp_path, capture):
    dims = dict(hidden_size=256, intermediate_size=512, num_attention_heads=4, num_key_value_heads=2)  # head dim 64
    target = checkpoint_factory("llama", 0, **dims)
    draft = checkpoint_factory("llama", 1, num_hidden_layers=1, **dims)
    result = graphspec.compile(
        target, draft, k=3, batch_sizes=(1, 2), dtype="bfloat16", device="cuda", max_seq_len=128,
        capture=capture, modes=("greedy",), out=tmp_path / "art",
    )  # fmt: skip
    kernels = json.loads((tmp_path / "art" / "kernels.json").read_text())
    assert all(kernels.values()), kernels  # lower_kernels chose Triton kernels for every graph
    expected = [r.token_ids for r in Runtime(result).generate(PROMPTS, max_new_tokens=NEW_TOKENS)]
    fresh = run_fresh_process(tmp_path / "art")
    assert (fresh["traces"], fresh["pipeline_runs"]) == (0, 0)
    assert fresh["captures"] > 0
    assert not fresh["dynamo"]  # seconds of a cold start: no graphspec op imports it (graphspec/library.py)
    # Only the kernels its graphs call: a Llama pair imports none of the Gated DeltaNet ones.
    assert "graphspec.kernels.rms_norm" in fresh["kernel_modules"]
    assert not [m for m in fresh["kernel_modules"] if "gated_delta" in m or "gdn" in m], fresh["kernel_modules"]
    assert fresh["warm_up"] == ["first_requests", "prefill_programs", "steps"]  # where warm_up_and_capture went
    phases = fresh["capture_phases"]  # and by phase: every capture warmed up, recorded and instantiated
    assert sorted(phases) == ["instantiate", "record", "warm_up_runs"] and all(s > 0 for s in phases.values()), phases
    assert fresh["tokens"] == expected


def test_loaded_prefill_programs_run_as_their_parts_and_never_generate_whole_code(compiled):
    # Half of rebuilding a graph is fx generating its Python: a loaded prefill program is built lazily and
    # only its two parts (runtime/prefill_split.py) ever run, in the warm-up as in requests.
    loaded = load_artifact(compiled[1])
    runtime = Runtime(loaded)
    for program in runtime.prefiller.programs.values():
        program.warm_up()
    runtime.generate(PROMPTS, max_new_tokens=4)
    for key, gm in loaded.prefill_graphs.items():
        assert isinstance(gm, LazyGraphModule) and gm._needs_recompile(), key
    for key, program in runtime.prefiller.programs.items():  # on the CPU, the lowered copy it splits
        assert program.gm._needs_recompile(), key
    assert LazyGraphModule is not torch.fx.GraphModule  # this torch has fx's lazy GraphModule


def test_a_loaded_artifact_saved_again_loads_and_generates_the_same(compiled, expected, tmp_path):
    # A loaded artifact's models are built from plain configs (configs/<role>.json); saving it again must
    # record their families, not the base class's empty model_type (it used to, and the copy was refused).
    loaded = load_artifact(compiled[1])
    save_artifact(loaded, tmp_path / "again")
    manifest = json.loads((tmp_path / "again" / "manifest.json").read_text())
    assert {role: model["model_type"] for role, model in manifest["models"].items()} == {
        "target": "llama",
        "draft": "llama",
    }
    again = Runtime.load(tmp_path / "again")
    assert [r.token_ids for r in again.generate(PROMPTS, max_new_tokens=NEW_TOKENS)] == expected["greedy"]
