"""Train the demo pair's MTP and EAGLE-3 heads again, against its unchanged target, for longer than the
pair's run left them (each had 80 s there and was still improving), and record the run in the pair's
metadata.json: heads.<name> and the new files' sha256 and bytes. Everything but the budget is the pair's
recorded setting (metadata.json's args: batch, unroll, lr, seeds, the target-greedy sequences, EAGLE-3's
draft vocabulary and layers), on the pair's corpus: the same stdlib and extra-corpus packages must be at
hand (by default the recorded directories; the corpus fingerprint is compared and recorded).

The retrained heads' acceptance entries are dropped from the metadata: measure them with
tools/measure_acceptance.py --metadata, then rewrite the README with tools/demo_pair_readme.py.

    # on the GPU machine (carry build/corpus_stdlib; see train_demo_pair.py for packing it)
    PYTHONPATH=. python3 tools/retrain_demo_heads.py --stdlib /tmp/stdlib --seconds 210
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

import torch
from transformers import LlamaForCausalLM, PreTrainedTokenizerFast

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tools"))

from demo_training import record_files  # noqa: E402
from measure_acceptance import load_examples_module  # noqa: E402
from train_demo_heads import train_heads  # noqa: E402
from train_demo_pair import corpus_files, generate_greedy, head_metadata, token_stream  # noqa: E402

HEADS = ("mtp", "eagle3")


def parse_args(argv: list[str] | None, examples) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pair", type=Path, default=examples.DEMO_PAIR_DIR, help="the demo pair to update")
    parser.add_argument("--heads", default=",".join(HEADS), help="comma-separated: mtp, eagle3")
    parser.add_argument("--seconds", type=float, default=210.0, help="training budget of each head")
    parser.add_argument("--stdlib", type=Path, default=None, help="stdlib root (default: this interpreter's)")
    parser.add_argument(
        "--extra-corpus", type=Path, action="append", default=None, metavar="DIR",
        help="extra training packages (repeatable; default: the directories the pair's run recorded)",
    )  # fmt: skip
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--smoke", action="store_true", help="a slice of the corpus, tiny batches (CPU test)")
    args = parser.parse_args(argv)
    names = [name for name in args.heads.split(",") if name]
    if not names or set(names) - set(HEADS):
        parser.error(f"--heads {args.heads!r}: choose from {', '.join(HEADS)}")
    if not (args.pair / "metadata.json").is_file() or not (args.pair / "target" / "config.json").is_file():
        parser.error(f"--pair {args.pair}: no metadata.json or target/ (a demo pair directory)")
    if args.seconds <= 0:
        parser.error("--seconds must be positive")
    args.heads = names
    return args


def training_settings(recorded: dict, ours: argparse.Namespace) -> argparse.Namespace:
    """The pair run's arguments with this run's budget and device (the step count is the budget's)."""
    settings = argparse.Namespace(**recorded)
    settings.device, settings.head_seconds, settings.head_steps = ours.device, ours.seconds, 1_000_000
    if ours.smoke:
        settings.seq_len, settings.head_batch_size, settings.head_steps, settings.eval_every = 32, 2, 2, 1
        settings.gen_sequences, settings.gen_prompt, settings.gen_new, settings.gen_batch = 4, 8, 8, 4
    return settings


def main(argv: list[str] | None = None) -> dict:
    examples = load_examples_module()
    ours = parse_args(argv, examples)
    began = time.time()
    torch.backends.cuda.matmul.allow_tf32 = True
    metadata_path = ours.pair / "metadata.json"
    metadata = json.loads(metadata_path.read_text())
    settings = training_settings(metadata["args"], ours)

    root = ours.stdlib or examples.stdlib_root()
    extra = [Path(d) for d in (ours.extra_corpus if ours.extra_corpus is not None else settings.extra_corpus)]
    missing = [str(directory) for directory in extra if not directory.is_dir()]
    if missing:
        raise SystemExit(f"extra corpus directories not found: {', '.join(missing)} (give --extra-corpus)")
    train_files, heldout_files, _ = corpus_files(examples, root, extra, ours.smoke)
    fingerprint = examples.corpus_fingerprint(train_files)
    if fingerprint != metadata["corpus"]["train_fingerprint"]:
        print(f"note: the training corpus ({len(train_files)} files) is not the pair's (fingerprint differs)")

    tokenizer = PreTrainedTokenizerFast.from_pretrained(ours.pair / "target")
    train_stream = token_stream(tokenizer, [text for _, text in train_files]).to(ours.device)
    heldout_stream = token_stream(tokenizer, [text for _, text in heldout_files]).to(ours.device)
    target = LlamaForCausalLM.from_pretrained(ours.pair / "target", dtype=torch.float32).to(ours.device)
    target.eval().requires_grad_(False)
    generated = generate_greedy(target, train_stream, settings)
    print(f"corpus and {tuple(generated.shape)} target-greedy tokens in {time.time() - began:.1f}s", flush=True)

    heads = train_heads(ours.heads, target, train_stream, heldout_stream, generated, settings, ours.seconds)
    command = "PYTHONPATH=. python3 tools/retrain_demo_heads.py " + " ".join(sys.argv[1:] if argv is None else argv)
    for name, (head, result) in heads.items():
        directory = ours.pair / name
        if directory.exists():
            shutil.rmtree(directory)
        head.save(directory)
        earlier = {key: value for key, value in metadata["heads"][name].items() if key not in ("log", "retrained_over")}
        result.update(command=command, train_corpus_fingerprint=fingerprint, retrained_over=earlier)
        metadata["heads"][name] = head_metadata(name, head, result)
        record_files(metadata, ours.pair, name, examples.file_sha256)
        for measured in metadata["acceptance"]["by_new_tokens"].values():
            measured.pop(name, None)  # stale: measure_acceptance.py --metadata fills it in again
        final = result["final"]["heldout_top1_agreement_by_draft"]
        print(f"{name}: {result['steps_done']} steps in {result['seconds']:.0f}s, held-out agreement {final}")
    metadata_path.write_text(json.dumps(metadata, indent=2, default=str) + "\n")
    print(f"saved {', '.join(heads)} into {ours.pair} in {time.time() - began:.1f}s")
    return metadata


if __name__ == "__main__":
    main()
