"""Serving artifacts: a fresh process reproduces the in-process tokens without tracing or running passes,
and every kind of damage or mismatch is refused with a message naming the file or field."""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.fx as fx

import graphspec
from graphspec.artifact import ArtifactMismatchWarning, load_artifact, save_artifact
from graphspec.counters import COUNTERS
from graphspec.errors import ArtifactError
from graphspec.runtime.runtime import Runtime

REPO = Path(__file__).resolve().parents[1]
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
after_load = {"traces": COUNTERS.traces, "pipeline_runs": COUNTERS.pipeline_runs}
greedy = [r.token_ids for r in runtime.generate(prompts, max_new_tokens=new_tokens)]
sampled = [r.token_ids for r in runtime.generate(prompts, max_new_tokens=new_tokens, **sampling)]
print(json.dumps({"after_load": after_load, "greedy": greedy, "sample": sampled,
                  "traces": COUNTERS.traces, "pipeline_runs": COUNTERS.pipeline_runs,
                  "eager_steps": COUNTERS.eager_steps}))
"""


def test_fresh_process_generates_the_same_tokens_without_compiling(compiled, expected, tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    result = subprocess.run(
        [sys.executable, "-c", FRESH_PROCESS, str(compiled[1]), json.dumps([PROMPTS, NEW_TOKENS, SAMPLING])],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env=env,
    )
    assert result.returncode == 0, result.stderr
    fresh = json.loads(result.stdout.strip().splitlines()[-1])
    assert fresh["after_load"] == {"traces": 0, "pipeline_runs": 0}
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


def test_kernel_choices_are_saved_and_restored(compiled, tmp_path):
    result = compiled[0]
    gm = copy.deepcopy(result.graphs[("greedy", 1)])
    attention = next(n for n in gm.graph.nodes if n.op == "call_function" and "attention" in str(n.target))
    attention.meta["gs_kernel"] = "attention_sm90"
    config = dataclasses.replace(result.config, batch_sizes=(1,))
    only = dataclasses.replace(result, graphs={("greedy", 1): gm}, config=config)
    save_artifact(only, tmp_path / "art")
    assert json.loads((tmp_path / "art" / "kernels.json").read_text()) == {
        "step_b1_greedy": {attention.name: "attention_sm90"}
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
    with pytest.raises(ArtifactError, match=r"draft/model.safetensors has another sha256"):
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


# --------------------------------------------------------------------------------------------------
# Reference-weights mode
# --------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def referenced(compiled, tmp_path_factory):
    """The module's Compiled saved again with its (module-private) checkpoints referenced, not copied."""
    out = tmp_path_factory.mktemp("referenced") / "art"
    return save_artifact(compiled[0], out, copy_weights=False)


def test_reference_weights_load_and_generate(referenced, checkpoints, expected):
    assert not list(referenced.rglob("*.safetensors"))  # nothing copied
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

prompts, new_tokens = json.loads(sys.argv[2])
runtime = Runtime.load(sys.argv[1])
tokens = [r.token_ids for r in runtime.generate(prompts, max_new_tokens=new_tokens)]
print(json.dumps({"tokens": tokens, "traces": COUNTERS.traces, "pipeline_runs": COUNTERS.pipeline_runs,
                  "captures": COUNTERS.captures}))
"""


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
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    process = subprocess.run(
        [sys.executable, "-c", GPU_PROCESS, str(tmp_path / "art"), json.dumps([PROMPTS, NEW_TOKENS])],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert process.returncode == 0, process.stderr
    fresh = json.loads(process.stdout.strip().splitlines()[-1])
    assert (fresh["traces"], fresh["pipeline_runs"]) == (0, 0)
    assert fresh["captures"] > 0
    assert fresh["tokens"] == expected
