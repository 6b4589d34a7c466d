"""Cold start of an artifact: `Runtime.load` to ready in fresh processes, with the artifact's resolved
configs (configs/<role>.json: models and tokenizers built without their transformers config class) and
without them (how artifacts written before them load: transformers parses config.json with the family's
config class, whose imports take seconds). Both variants are the same artifact, loaded alternately.

    python benchmarks/bench_load.py                               # the demo pair, compiled for the CPU
    python benchmarks/bench_load.py --artifact artifacts/demo --runs 5

Each run is a new Python process: `import graphspec`, then Runtime.load timed with its phases
(runtime.startup_seconds). On a GPU, benchmarks/bench_prefill.py's cold start measures the same on an 8B/1B
artifact with an empty Triton cache.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEMO = REPO / "graphspec" / "examples" / "demo_pair"
VARIANTS = ("resolved configs", "config.json")

FRESH_PROCESS = """
import json, sys, time
began = time.perf_counter()
import graphspec
imported = time.perf_counter()
runtime = graphspec.Runtime.load(sys.argv[1])
ready = time.perf_counter()
print(json.dumps({"import_s": imported - began, "load_s": ready - imported, "phases": runtime.startup_seconds,
                  "config_class_imported": "transformers.models.llama.configuration_llama" in sys.modules}))
"""


def without_resolved_configs(artifact: Path, out: Path) -> Path:
    """A copy of the artifact whose manifest names no resolved config (the loader then reads config.json)."""
    shutil.copytree(artifact, out)
    manifest = json.loads((out / "manifest.json").read_text())
    for model in manifest["models"].values():
        model.pop("resolved_config", None)
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2))
    return out


def load_once(artifact: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    result = subprocess.run(
        [sys.executable, "-c", FRESH_PROCESS, str(artifact)], capture_output=True, text=True, timeout=600, env=env
    )
    if result.returncode != 0:
        raise RuntimeError(f"loading {artifact} failed:\n{result.stderr}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--artifact", default=None, help="an artifact with resolved configs (default: compile the demo pair)"
    )
    parser.add_argument("--runs", type=int, default=3, help="fresh processes per variant")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as workdir:
        if args.artifact is None:
            import graphspec

            artifact = Path(workdir) / "demo"
            graphspec.compile(
                DEMO / "target", DEMO / "draft", out=artifact, k=4, batch_sizes=(1,), dtype="float32",
                device="cpu", max_seq_len=512,
            )  # fmt: skip
        else:
            artifact = Path(args.artifact)
        manifest = json.loads((artifact / "manifest.json").read_text())
        if not any("resolved_config" in model for model in manifest["models"].values()):
            parser.error(f"{artifact} has no resolved configs (compiled before them): nothing to compare")
        paths = {VARIANTS[0]: artifact, VARIANTS[1]: without_resolved_configs(artifact, Path(workdir) / "plain")}
        runs: dict[str, list[dict]] = {variant: [] for variant in VARIANTS}
        for _ in range(args.runs):  # alternated, so a machine's drift hits both alike
            for variant, path in paths.items():
                runs[variant].append(load_once(path))
    rows = []
    for variant in VARIANTS:
        loads = [run["load_s"] for run in runs[variant]]
        phases = {
            name: statistics.median(run["phases"][name] for run in runs[variant]) for name in runs[variant][0]["phases"]
        }
        rows.append({
            "variant": variant, "load_s": loads, "median_load_s": statistics.median(loads),
            "median_import_s": statistics.median(run["import_s"] for run in runs[variant]),
            "median_phases_s": phases, "config_class_imported": runs[variant][0]["config_class_imported"],
        })  # fmt: skip
    source = args.artifact or "the demo pair (CPU, float32)"
    print(f"Runtime.load to ready, {source}, {args.runs} fresh processes each")
    print("| configs from | load, median (s) | runs (s) | import graphspec (s) | checks (s) | weights (s) "
          "| config class imported |")  # fmt: skip
    print("| --- | ---: | --- | ---: | ---: | ---: | --- |")
    for row in rows:
        phases = row["median_phases_s"]
        runs_text = ", ".join(f"{seconds:.2f}" for seconds in row["load_s"])
        print(
            f"| {row['variant']} | {row['median_load_s']:.2f} | {runs_text} | {row['median_import_s']:.2f} | "
            f"{phases.get('checks', 0):.2f} | {phases.get('weights', 0):.2f} | {row['config_class_imported']} |"
        )
    if args.json:
        if str(REPO) not in sys.path:  # run as a script
            sys.path.insert(0, str(REPO))
        from benchmarks import common

        common.write_json(args.json, {"runs": args.runs, "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
