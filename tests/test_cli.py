"""The `graphspec` command line, run as a user runs it: `python -m graphspec ...` in a subprocess.

Every process costs a torch import, so the module starts them all together from one fixture (those that
need the compiled artifact once it exists) and the tests read their results. Variants of a command
whose process wiring is already covered call main() in this process.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from graphspec.cli import build_parser, main
from graphspec.pipeline import describe
from graphspec.runtime.runtime import Runtime

REPO = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
TIMEOUT = 300
COMPILE_FLAGS = ["--dtype", "float32", "--device", "cpu", "--max-seq-len", "64"]

# name -> (arguments, a fragment the one-line error must contain). {target} etc. are filled in below.
USER_ERRORS = {
    "unknown_flag": (["compile", "{target}", "--draft", "{draft}", "--bogus"], "unrecognized arguments: --bogus"),
    "k_zero": (["compile", "{target}", "--draft", "{draft}", "-k", "0", "--out", "{tmp}/a"], "argument -k"),
    "batch_size_zero": (["compile", "{target}", "--draft", "{draft}", "--batch-sizes", "0,2"], "'0,2'"),
    "batch_size_words": (["compile", "{target}", "--draft", "{draft}", "--batch-sizes", "a,b"], "'a,b'"),
    "fold_norms_word": (["compile", "{target}", "--draft", "{draft}", "--fold-norms", "yes"], "argument --fold-norms"),
    "missing_target": (["compile", "{tmp}/no_target", "--draft", "{draft}", "--out", "{tmp}/a"], "no_target"),
    "missing_artifact": (["generate", "{tmp}/no_art", "--prompt-ids", "1,2"], "no_art does not exist"),
}
# Bad flag values that fail in the same argparse step as unknown_flag, whose process (exit status 2, one
# stderr line, nothing printed at import) covers their wiring: they call main() here instead of paying a
# torch import each (about 4.5 CPU-seconds a process).
USER_ERRORS_IN_PROCESS = {"k_zero", "batch_size_zero", "batch_size_words", "fold_norms_word"}


def command(*args: object) -> list[str]:
    return [sys.executable, "-m", "graphspec", *map(str, args)]


def start(*args: object) -> subprocess.Popen:
    return subprocess.Popen(command(*args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)


def finish(process: subprocess.Popen) -> subprocess.CompletedProcess:
    stdout, stderr = process.communicate(timeout=TIMEOUT)
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


def add_word_tokenizer(directory: Path) -> None:
    """A tokenizer whose words are w0..w127 (id i <-> "wi"), so text in and out is predictable."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.WordLevel({f"w{i}": i for i in range(128)}, unk_token="w0"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="w0", bos_token="w1", eos_token="w2")
    fast.save_pretrained(directory)


@pytest.fixture(scope="module")
def checkpoints(checkpoint_factory, tmp_path_factory):
    root = tmp_path_factory.mktemp("cli_checkpoints")
    target = Path(shutil.copytree(checkpoint_factory("llama", 0), root / "target"))
    add_word_tokenizer(target)
    return target, checkpoint_factory("llama", 1, num_hidden_layers=1)


@pytest.fixture(scope="module")
def runs(checkpoints, tmp_path_factory):
    """Every CLI process of this module: name -> CompletedProcess, plus the paths they wrote."""
    tmp = tmp_path_factory.mktemp("cli")
    target, draft = checkpoints
    artifact, dumps, bisect = tmp / "art", tmp / "dumps", tmp / "bisect"
    values = {"target": target, "draft": draft, "tmp": tmp}
    # Independent of the artifact: start right away, next to the compile.
    started = {
        "compile": start(
            "compile", target, "--draft", draft, "-k", "3", "--batch-sizes", "1,2", *COMPILE_FLAGS,
            "--out", artifact, "--dump-dir", dumps,
        ),
        "bisect": start(
            "compile", target, "--draft", draft, "-k", "2", "--batch-sizes", "1", "--modes", "greedy", *COMPILE_FLAGS,
            "--dump-dir", bisect, "--skip", "mask_padding", "--stop-after", "defunctionalize_kv", "--fold-norms", "on",
        ),
        **{
            name: start(*(arg.format(**values) for arg in args))
            for name, (args, _) in USER_ERRORS.items()
            if name not in USER_ERRORS_IN_PROCESS
        },
    }  # fmt: skip
    results = {"compile": finish(started.pop("compile"))}
    assert results["compile"].returncode == 0, results["compile"].stderr
    # These need the artifact.
    started["generate_stream"] = start(
        "generate", artifact, "--prompt-ids", "3,4,5", "--ids", "--max-new-tokens", "10", "--stream"
    )
    started["inspect"] = start("inspect", artifact)
    # `inspect --json | head`: the reader is gone before graphspec writes a byte.
    read_end, write_end = os.pipe()
    os.close(read_end)
    started["inspect_json_closed_pipe"] = subprocess.Popen(
        command("inspect", artifact, "--json"), stdout=write_end, stderr=subprocess.PIPE, text=True, env=ENV
    )
    os.close(write_end)
    results.update({name: finish(process) for name, process in started.items()})
    return {"results": results, "artifact": artifact, "dumps": dumps, "bisect": bisect, "values": values}


@pytest.fixture(scope="module")
def artifact(runs) -> Path:
    return runs["artifact"]


@pytest.fixture(scope="module")
def runtime(artifact):
    """The same artifact loaded in this process: the reference for what the CLI prints."""
    return Runtime.load(artifact)


def assert_user_error(result: subprocess.CompletedProcess, *fragments: str) -> None:
    """Non-zero exit, exactly one `error: ...` line on stderr, no traceback."""
    assert result.returncode != 0, result
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])


# --------------------------------------------------------------------------------------------------
# compile
# --------------------------------------------------------------------------------------------------


def test_compile_writes_the_artifact_and_says_where(runs):
    result, artifact, dumps = runs["results"]["compile"], runs["artifact"], runs["dumps"]
    assert (artifact / "manifest.json").is_file()
    assert (artifact / "target" / "tokenizer.json").is_file()  # tokenizer files travel with the weights
    assert f"artifact: {artifact}" in result.stdout
    assert re.search(r"\(4 step graphs, [1-9]\d* prefill programs, ", result.stdout), result.stdout
    assert f"dumps:    {dumps}" in result.stdout
    assert str(dumps / "step_b2_sample" / "summary.md") in result.stdout
    assert (dumps / "step_b2_sample" / "summary.md").is_file()


def test_compile_shows_progress_on_stderr(runs):
    stderr = runs["results"]["compile"].stderr
    for line in (
        "loading target",
        "loading draft",
        "tracing step_b1_greedy (graph 1/",
        "step_b2_sample: mask_padding",
        "tracing prefill_b2_c",
        ": fuse_prefill_attention",
    ):
        assert line in stderr, line
    assert stderr.strip().splitlines()[-1].endswith(f"writing artifact {runs['artifact']}")


def test_list_passes_prints_the_pipeline_without_a_target(capsys):
    # In this process: the compile command's process wiring is the compile run's, and its stdout holds
    # nothing but what main() prints (test_generate_streams_prompt_ids compares a whole stdout).
    assert main(["compile", "--list-passes"]) == 0
    captured = capsys.readouterr()
    assert (captured.out, captured.err) == (describe() + "\n", "")


def test_stop_after_and_skip_bisect_the_pipeline(runs):
    result = runs["results"]["bisect"]
    assert result.returncode == 0, result.stderr
    dumps = runs["bisect"] / "step_b1_greedy"
    written = sorted(p.name for p in dumps.glob("*.py"))
    assert written == [
        "00_traced.py", "01_insert_verify.py", "02_mask_padding.py", "03_fold_constants.py", "04_defunctionalize_kv.py"
    ]  # fmt: skip
    assert "SKIPPED" in (dumps / "02_mask_padding.py").read_text()
    assert "partial pipeline (stopped after defunctionalize_kv; skipped mask_padding)" in result.stderr
    # --fold-norms on (auto would not fold on the CPU): the traced step has the folded layers' SwiGLU.
    assert "graphspec.scaled_silu_mul" in (dumps / "00_traced.py").read_text()


# --------------------------------------------------------------------------------------------------
# generate and inspect
# --------------------------------------------------------------------------------------------------


def test_generate_streams_prompt_ids(runs, runtime):
    result = runs["results"]["generate_stream"]
    assert result.returncode == 0, result.stderr
    expected = runtime.generate([[3, 4, 5]], max_new_tokens=10)[0].token_ids
    assert result.stdout == ",".join(map(str, expected)) + "\n"
    stats = result.stderr.strip().splitlines()[-1]
    assert stats.startswith(f"stats: {len(expected)} tokens in ")
    assert "tokens/s" in stats and "mean accepted" in stats and "acceptance by draft position" in stats


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_generate_prints_text_when_there_is_a_tokenizer(artifact, runtime, capsys, stream):
    args = ["generate", str(artifact), "--prompt", "w3 w4 w5", "--max-new-tokens", "10"]
    assert main(args + (["--stream"] if stream else [])) == 0
    expected = runtime.generate(["w3 w4 w5"], max_new_tokens=10)[0]
    assert expected.text.startswith("w")
    assert capsys.readouterr().out == expected.text + "\n"


def test_generate_batch_with_sampling_prints_ids_per_prompt(artifact, runtime, capsys):
    args = ["generate", str(artifact), "--prompt-ids", "3,4,5", "--prompt-ids", "7,8", "--ids"]
    args += ["--max-new-tokens", "8", "--temperature", "0.8", "--top-k", "40", "--top-p", "0.9", "--seed", "5"]
    assert main(args) == 0
    expected = runtime.generate([[3, 4, 5], [7, 8]], max_new_tokens=8, temperature=0.8, top_k=40, top_p=0.9, seed=5)
    lines = capsys.readouterr().out.splitlines()
    assert lines == [f"[{i}] " + ",".join(map(str, r.token_ids)) for i, r in enumerate(expected)]


def test_inspect_summarizes_the_manifest(runs):
    result = runs["results"]["inspect"]
    assert result.returncode == 0, result.stderr
    for fragment in (
        "k=3  buckets 1,2  modes greedy,sample  dtype float32",
        "target     llama  2 layers  hidden 64",
        "draft      llama  1 layers",
        "vocab 128",
        "[01] insert_verify",
        "step_b2_sample",
        "prefill programs (one per bucket and chunk size",
        "prefill_b2_c",
        "graphs/step_b1_greedy.json",
        "target/model.safetensors",
        "numerics default  fold_norms False",
        "this machine: matches",
        "recompile  graphspec compile",
    ):
        assert fragment in result.stdout, fragment


def test_inspect_json_prints_the_manifest(artifact, capsys):
    assert main(["inspect", str(artifact), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == json.loads((artifact / "manifest.json").read_text())


def test_inspect_json_into_a_closed_pipe_stops_quietly(runs):
    result = runs["results"]["inspect_json_closed_pipe"]
    assert (result.returncode, result.stderr) == (141, "")  # what a tool killed by SIGPIPE reports


def test_generate_help_shows_the_max_new_tokens_default(capsys):
    assert main(["generate", "--help"]) == 0
    assert "--max-new-tokens N tokens to generate per prompt at most (default: 64)" in " ".join(
        capsys.readouterr().out.split()
    )


def test_help_and_usage_errors_import_neither_torch_nor_transformers():
    # A fresh interpreter (this one imported torch long ago). Which modules got imported, not how long it
    # took: torch and transformers are the seconds `graphspec --help` used to wait for.
    parser = build_parser()
    (commands,) = [action for action in parser._actions if isinstance(action, argparse._SubParsersAction)]
    command_lines = [["--help"], *([name, "--help"] for name in commands.choices), ["compile", "--bogus"]]
    command_lines.append(["generate", "ART", "--prompt-ids", "1", "--max-new-tokens", "0"])
    script = textwrap.dedent("""
        import contextlib, io, json, sys
        from graphspec.cli import main
        statuses = []
        for argv in json.loads(sys.argv[1]):
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                statuses.append(main(argv))
        heavy = sorted(name for name in sys.modules if name.split(".")[0] in ("torch", "transformers"))
        print(json.dumps({"statuses": statuses, "heavy": heavy}))
    """)
    arguments = [sys.executable, "-c", script, json.dumps(command_lines)]
    result = subprocess.run(arguments, capture_output=True, text=True, env=ENV, timeout=TIMEOUT)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["statuses"] == [0] * (len(command_lines) - 2) + [2, 2]  # --help: 0; a refused flag: 2
    assert report["heavy"] == []


def test_stop_ids_none_turns_stop_tokens_off(artifact, runtime, capsys):
    args = ["generate", str(artifact), "--prompt-ids", "3,4,5", "--ids", "--max-new-tokens", "12"]
    assert main([*args, "--stop-ids", "none"]) == 0
    expected = runtime.generate([[3, 4, 5]], max_new_tokens=12, stop_token_ids=[])[0].token_ids
    assert len(expected) == 12
    assert capsys.readouterr().out == ",".join(map(str, expected)) + "\n"


def test_allow_mismatch_turns_an_sm_mismatch_into_a_warning(artifact, tmp_path, capsys):
    copy = Path(shutil.copytree(artifact, tmp_path / "art"))
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["device"]["sm"] = 80
    (copy / "manifest.json").write_text(json.dumps(manifest))
    args = ["generate", str(copy), "--prompt-ids", "3,4", "--max-new-tokens", "2", "--ids"]
    assert main(args) == 1
    error = capsys.readouterr().err
    assert error.startswith("error: ") and "sm_80" in error and "--allow-mismatch" in error
    assert main([*args, "--allow-mismatch"]) == 0
    captured = capsys.readouterr()
    assert captured.err.startswith("warning: ") and "sm_80" in captured.err
    assert len(captured.out.strip().split(",")) == 2


# --------------------------------------------------------------------------------------------------
# User errors: one line, no traceback
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("case", sorted(USER_ERRORS))
def test_user_errors_exit_with_one_line_and_no_traceback(runs, case, capsys):
    args, fragment = USER_ERRORS[case]
    if case in USER_ERRORS_IN_PROCESS:
        argv = [arg.format(**runs["values"]) for arg in args]
        status = main(argv)
        captured = capsys.readouterr()
        result = subprocess.CompletedProcess(argv, status, captured.out, captured.err)
        assert status == 2, result  # a bad flag: argparse's status, as unknown_flag's process exits
    else:
        result = runs["results"][case]
    assert_user_error(result, fragment)


IN_PROCESS_ERRORS = {
    "no_command": ([], "required: COMMAND"),
    "nothing_to_write": (["compile", "{target}", "--draft", "{draft}"], "nothing to write"),
    "no_draft": (["compile", "{target}", "--out", "{tmp}/a"], "--draft"),
    "unknown_pass": (["compile", "{target}", "--draft", "{draft}", "--stop-after", "nope"], "unknown pass 'nope'"),
    "unknown_skip": (["compile", "{target}", "--draft", "{draft}", "--skip", "mask_padding,nope"], "nope"),
    "bad_device": (["compile", "{target}", "--draft", "{draft}", "--device", "tpu"], "'tpu'"),
    "bad_prompt_ids": (["generate", "{art}", "--prompt-ids", "1,x"], "'1,x'"),
    "no_prompt": (["generate", "{art}"], "--prompt"),
    "top_p_above_one": (["generate", "{art}", "--prompt-ids", "1", "--top-p", "2"], "(0, 1]"),
    "stream_two_prompts": (["generate", "{art}", "--prompt-ids", "1", "--prompt-ids", "2", "--stream"], "one prompt"),
    "prompt_too_long": (["generate", "{art}", "--prompt-ids", "3", "--max-new-tokens", "100"], "max_seq_len 64"),
    "prompt_ids_outside_vocab": (["generate", "{art}", "--prompt-ids", "500"], "outside [0, 128)"),
    "stop_ids_outside_vocab": (
        ["generate", "{art}", "--prompt-ids", "3", "--max-new-tokens", "4", "--stop-ids", "500"],
        "outside the vocab",
    ),
    "stop_ids_words": (["generate", "{art}", "--prompt-ids", "3", "--stop-ids", "eos"], "or none, got 'eos'"),
    "inspect_missing": (["inspect", "{tmp}/no_art"], "no_art does not exist"),
    "generate_from_a_checkpoint": (["generate", "{target}", "--prompt-ids", "3"], "is a model checkpoint, not"),
    "compile_from_an_artifact": (
        ["compile", "{art}", "--draft", "ngram", "--device", "cpu", "--out", "{tmp}/a"],
        "is a graphspec artifact, not a model checkpoint",
    ),
    "serve_port_out_of_range": (["serve", "{art}", "--port", "99999"], "between 1 and 65535"),
    "k_by_bucket_form": (["compile", "{target}", "--draft", "ngram", "--k-by-bucket", "4-1"], "BUCKET:K pairs"),
    "k_by_bucket_not_a_bucket": (
        ["compile", "{target}", "--draft", "ngram", "--device", "cpu", "--k-by-bucket", "4:1", "--out", "{tmp}/a"],
        "k_by_bucket names bucket 4, not one of batch_sizes (1,)",
    ),
    "k_by_bucket_bucket_twice": (  # a dict of the pairs would keep 1:2 silently
        ["compile", "{target}", "--draft", "ngram", "--device", "cpu", "--k-by-bucket", "1:1,1:2", "--out", "{tmp}/a"],
        "k_by_bucket names a bucket twice",
    ),
    "dump_dir_is_a_file": (
        [
            "compile",
            "{target}",
            "--draft",
            "{draft}",
            "--device",
            "cpu",
            "--out",
            "{tmp}/a",
            "--dump-dir",
            "{target}/config.json/x",
        ],
        "is a file, not a directory",
    ),
    "token_map_out_in_no_directory": (
        ["token-map", "{target}", "{tmp}/no_corpus", "--size", "8", "--out", "{tmp}/no/map.safetensors"],
        "no directory",
    ),
    "token_map_out_is_a_directory": (
        ["token-map", "{target}", "{tmp}/no_corpus", "--size", "8", "--out", "{tmp}"],
        "is a directory",
    ),
}


@pytest.mark.parametrize("case", sorted(IN_PROCESS_ERRORS))
def test_main_reports_user_errors_in_one_line(case, checkpoints, artifact, tmp_path, capsys):
    values = {"target": checkpoints[0], "draft": checkpoints[1], "art": artifact, "tmp": tmp_path}
    args, fragment = IN_PROCESS_ERRORS[case]
    status = main([arg.format(**values) for arg in args])
    captured = capsys.readouterr()
    assert_user_error(subprocess.CompletedProcess(args, status, captured.out, captured.err), fragment)


def test_compile_with_a_bucket_k_and_inspect_it(checkpoints, tmp_path, capsys):
    target, _ = checkpoints
    out = tmp_path / "art"
    args = ["compile", str(target), "--draft", "ngram", "-k", "3", "--batch-sizes", "1,2", "--k-by-bucket", "2:1"]
    assert main([*args, *COMPILE_FLAGS, "--modes", "greedy", "--out", str(out)]) == 0
    assert main(["inspect", str(out)]) == 0
    assert "step       k=3 (bucket 2: k=1)  buckets 1,2" in capsys.readouterr().out
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["config"]["k_by_bucket"] == [[2, 1]] and "--k-by-bucket 2:1" in manifest["command"]


def test_compile_with_the_ngram_drafter_and_inspect_it(checkpoints, tmp_path, capsys):
    target, _ = checkpoints
    out = tmp_path / "ngram_art"
    args = ["compile", str(target), "--draft", "ngram", "--ngram-max", "2", "-k", "2", "--batch-sizes", "1"]
    assert main([*args, *COMPILE_FLAGS, "--modes", "greedy", "--out", str(out)]) == 0
    assert main(["inspect", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "drafter    ngram  ngram_min 1  ngram_max 2" in printed
    assert "\ndraft " not in printed  # no draft checkpoint in the artifact
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["drafter"] == {"kind": "ngram", "ngram_min": 1, "ngram_max": 2}
    assert "--draft ngram" in manifest["command"] and "--ngram-max 2" in manifest["command"]
    assert Runtime.load(out).generate([[5, 6, 5, 6, 5]], max_new_tokens=4, stop_token_ids=[])[0].token_ids


def test_compile_without_max_seq_len_sizes_the_context_from_the_model(checkpoints, tmp_path, capsys):
    target, _ = checkpoints
    out = tmp_path / "sized"
    args = ["compile", str(target), "--draft", "ngram", "-k", "2", "--batch-sizes", "1", "--modes", "greedy"]
    assert main([*args, "--dtype", "float32", "--device", "cpu", "--out", str(out)]) == 0
    assert "(graph 1)" in capsys.readouterr().err  # progress without a total
    manifest = json.loads((out / "manifest.json").read_text())
    positions = json.loads((target / "config.json").read_text())["max_position_embeddings"]
    assert 0 < manifest["config"]["max_seq_len"] <= positions


def test_compile_with_an_eagle3_head_directory_and_inspect_it(checkpoints, tmp_path, capsys):
    from tests.eagle3_oracle import make_eagle3_head

    target, _ = checkpoints
    head = make_eagle3_head(tmp_path / "head", target, seed=2, draft_vocab=40, aux_layers=[0, 1, 1])
    out = tmp_path / "eagle3_art"
    args = ["compile", str(target), "--draft", str(head), "-k", "2", "--batch-sizes", "1"]
    assert main([*args, *COMPILE_FLAGS, "--modes", "greedy", "--out", str(out)]) == 0
    assert main(["inspect", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "drafter    eagle3  aux_layers [0, 1, 1]  draft_vocab_size 40" in printed
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["drafter"] == {"kind": "eagle3", "aux_layers": [0, 1, 1], "draft_vocab_size": 40}
    assert f"--draft {head.absolute()}" in manifest["command"]
    assert Runtime.load(out).generate([[5, 6, 5, 6, 5]], max_new_tokens=4, stop_token_ids=[])[0].token_ids


def test_compile_with_a_dflash_directory_and_inspect_it(checkpoints, tmp_path, capsys):
    from tests.dflash_oracle import make_dflash_drafter

    target, _ = checkpoints
    drafter = make_dflash_drafter(tmp_path / "dflash", target, seed=2, block_size=3, layer_ids=(0, 1), mask_token_id=4)
    out = tmp_path / "dflash_art"
    args = ["compile", str(target), "--draft", str(drafter), "-k", "2", "--batch-sizes", "1"]
    assert main([*args, *COMPILE_FLAGS, "--modes", "greedy", "--out", str(out)]) == 0
    assert main(["inspect", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "drafter    dflash  block_size 3  target_layer_ids [0, 1]  mask_token_id 4" in printed
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["drafter"] == {"kind": "dflash", "block_size": 3, "target_layer_ids": [0, 1], "mask_token_id": 4}
    assert f"--draft {drafter.absolute()}" in manifest["command"]
    assert Runtime.load(out).generate([[5, 6, 5, 6, 5]], max_new_tokens=4, stop_token_ids=[])[0].token_ids


def test_compile_mtp_with_a_token_map_and_inspect_it(tmp_path, capsys):
    from graphspec.drafters.token_map import write_token_map
    from tests.checkpoints import make_mtp_checkpoint

    target = make_mtp_checkpoint(tmp_path / "target", "deepseek_v3", seed=2)
    hot = write_token_map(tmp_path / "hot.safetensors", [9, 4, 100, 2])
    out = tmp_path / "mtp_art"
    args = ["compile", str(target), "--draft", "mtp", "--token-map", str(hot), "-k", "2", "--batch-sizes", "1"]
    assert main([*args, *COMPILE_FLAGS, "--modes", "greedy", "--out", str(out)]) == 0
    assert main(["inspect", str(out)]) == 0
    printed = capsys.readouterr().out
    assert (
        "drafter    mtp  layers 1  layout deepseek_v3  draft_vocab_size 4  token_map drafter/token_map.safetensors"
        in printed
    )
    assert f"--token-map {hot}" in json.loads((out / "manifest.json").read_text())["command"]
    assert Runtime.load(out).generate([[5, 6, 5, 6, 5]], max_new_tokens=4, stop_token_ids=[])[0].token_ids
