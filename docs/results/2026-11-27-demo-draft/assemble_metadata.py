# ruff: noqa  (the script as run, kept with its results)
"""The shipped demo pair's metadata.json after the 6-layer draft (session 19).

The draft was trained on the H200 in two runs of tools/train_demo_pair.py: run e (a fresh 256,6,576,4,4
draft, 4574 steps; its own metadata is metadata_e.json) and run f (--draft-from e, 6250 more steps). Run f
was stopped by the device call's time limit (`timeout 575`) after it had saved both models and before its
own acceptance measurement and metadata.json, so its draft record is rebuilt here from its log
(train_f.log: every [draft] line is one evaluation, the last the final one) and its command line, and the
acceptance of every drafter and the target's greedy samples are measured here, on the CPU, from the
shipped files (the functions the training script uses: tools/measure_acceptance.py's replay, fp32).
Corpus, tokenizer and target records are run e's (same corpus, same tokenizer and target files); the
MTP, EAGLE-3 and DFlash records are the earlier pair's (2972c61; their files are unchanged).

    PYTHONPATH=. python3 docs/results/2026-11-27-demo-draft/assemble_metadata.py
"""

import json
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO / "tools"))
import train_demo_pair  # noqa: E402
from graphspec import examples  # noqa: E402

HERE = Path(__file__).resolve().parent
PAIR = REPO / "graphspec" / "examples" / "demo_pair"
SP = "/opt/torch/.venv/lib/python3.12/site-packages"
PACKAGES = (
    "torch sympy numpy networkx pip setuptools jinja2 huggingface_hub triton _pytest filelock fsspec packaging "
    "mpmath requests urllib3 yaml tqdm markupsafe click rich pygments"
).split()
COMMAND = (
    "PYTHONPATH=. python3 tools/train_demo_pair.py --stdlib /tmp/stdlib --stdlib-version 3.11.7 "
    + " ".join(f"--extra-corpus {SP}/{p}" for p in PACKAGES)
    + " --target-from graphspec/examples/demo_pair --draft-from graphspec/examples/demo_pair --heads '' "
    "--draft-lr 0.001 --draft-steps 30000 --draft-seconds 440 --time-budget 530 --out build/dp/f"
)

earlier_pair = json.loads(
    subprocess.run(
        ["git", "show", "2972c61:graphspec/examples/demo_pair/metadata.json"],
        capture_output=True,
        text=True,
        cwd=REPO,
        check=True,
    ).stdout
)
run_e = json.loads((HERE / "metadata_e.json").read_text())
argv = shlex.split(COMMAND)[3:]
args = train_demo_pair.parse_args(argv)

log_text = (HERE / "train_f.log").read_text()
entries = []
for line in log_text.splitlines():
    if line.startswith("[draft] "):
        entry = {}
        for key, value in re.findall(r"(\w+)=(\S+)", line):
            entry[key] = int(value) if key in ("step", "heldout_tokens") else float(value)
        entries.append(entry)
capped = int(re.search(r"(\d+) steps fit the", log_text).group(1))
generation_seconds = float(re.search(r"target-greedy tokens in ([\d.]+)s", log_text).group(1))
final = entries[-1]
draft_record = {
    "shape": run_e["draft"]["shape"],
    "parameters": run_e["draft"]["parameters"],
    "objective": run_e["draft"]["objective"],
    "generated": {
        "sequences": args.gen_sequences,
        "prompt_tokens": args.gen_prompt,
        "new_tokens": args.gen_new,
        "seconds": generation_seconds,
    },
    "steps_requested": args.draft_steps,
    "steps_done": final["step"],
    "steps_capped_by_budget": capped,
    "budget_seconds": args.draft_seconds,
    "stopped_early_by_deadline": final["step"] < capped,
    "seconds": final["seconds"],
    "peak_lr": args.draft_lr,
    "batch": run_e["draft"]["batch"],
    "log": entries,
    "final": final,
    "command": COMMAND,
    "continued_from": {k: v for k, v in run_e["draft"].items() if k not in ("log", "generated")},
    "record_rebuilt_from_log": "the run was stopped by its device call's time limit after saving the models, before "
    "writing its metadata; this record is rebuilt from its log (docs/results/2026-11-27-demo-draft/)",
}

began = time.time()
torch.set_num_threads(1)  # as measure_acceptance.py --threads 1
acceptance, samples = train_demo_pair.measure_saved(
    PAIR, ["draft", "mtp", "eagle3", "dflash", "ngram"], examples.stdlib_root(), args
)
args.device = "cuda"  # the training run's, as recorded
acceptance["measured_on"] = "CPU, from the shipped files (docs/results/2026-11-27-demo-draft/assemble_metadata.py)"
files = sorted(
    p for sub in ("target", "draft", "mtp", "eagle3", "dflash") for p in (PAIR / sub).iterdir() if p.is_file()
)
metadata = {
    "command": COMMAND,
    "smoke": False,
    "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
    "corpus": run_e["corpus"],
    "tokenizer": run_e["tokenizer"],
    "target": run_e["target"],
    "draft": draft_record,
    "heads": earlier_pair["heads"],
    "dflash": earlier_pair["dflash"],
    "acceptance": acceptance,
    "samples": samples,
    "timing_seconds": {
        "target_training": run_e["target"]["seconds"],
        "target_generation": generation_seconds,
        "draft_training": final["seconds"],
        "acceptance_and_samples_on_cpu": time.time() - began,
    },
    "saved_dtype": "float16",
    "versions": run_e["versions"],
    "device": run_e["device"],
    "sha256": {p.relative_to(PAIR).as_posix(): examples.file_sha256(p) for p in files},
    "bytes": {p.relative_to(PAIR).as_posix(): p.stat().st_size for p in files},
}
(PAIR / "metadata.json").write_text(json.dumps(metadata, indent=2, default=str) + "\n")
print("written", PAIR / "metadata.json")
