"""Write the demo pair's README from what the training run recorded (metadata.json, the config files), so
every number in it is the shipped files' own: sizes, parameters, losses, acceptance of each drafter,
greedy samples, hashes.

    python3 tools/demo_pair_readme.py                                   # graphspec/examples/demo_pair
    python3 tools/demo_pair_readme.py --pair /tmp/run/demo_pair --stdout
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# In table order.
DRAFTER_LABELS = {
    "draft": "draft model",
    "mtp": "MTP head",
    "eagle3": "EAGLE-3 head",
    "dflash": "DFlash drafter",
    "ngram": "n-gram (1..3)",
}
# Pairs shipped before, measured the same way (K=4, 20 held-out prompts of 64 tokens, fp32): the commit that
# shipped each, its target's size and held-out loss, the distinct 4-gram ratio of its target's 128-token
# continuations, and mean accepted drafts per step at 128 and 32 new tokens per drafter.
EARLIER_PAIRS = (
    {
        "commit": "0b43f31", "target_parameters": "5.5M", "heldout_loss": 2.706, "distinct_128": 0.177,
        "accepted": {"draft": (3.583, 2.965)}, "draft_outside_loops": (2.706, 2.544),
    },
    {
        "commit": "e0b1ff6", "target_parameters": "14.2M", "heldout_loss": 2.326, "distinct_128": 0.324,
        "accepted": {
            "draft": (2.965, 2.150), "mtp": (1.916, 1.219), "eagle3": (1.663, 1.105), "dflash": (0.286, 0.259),
            "ngram": (1.614, 0.721),
        },
        "draft_outside_loops": (1.985, 1.840),
    },
    {
        "commit": "8bda340", "target_parameters": "14.2M", "heldout_loss": 2.190, "distinct_128": 0.363,
        "accepted": {
            "draft": (2.968, 2.107), "mtp": (2.224, 1.538), "eagle3": (2.142, 1.449), "dflash": (0.611, 0.636),
            "ngram": (1.734, 0.904),
        },
        "draft_outside_loops": (1.892, 1.711),
    },
    {
        "commit": "b8d7501", "target_parameters": "14.2M", "heldout_loss": 2.190, "distinct_128": 0.363,
        "accepted": {
            "draft": (3.066, 2.289), "mtp": (2.224, 1.538), "eagle3": (2.142, 1.449), "dflash": (0.611, 0.636),
            "ngram": (1.734, 0.904),
        },
        "draft_outside_loops": (2.012, 1.885),
    },
)  # fmt: skip


def shape_of(config: dict) -> str:
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    return (
        f"Llama, hidden {config['hidden_size']}, {config['num_hidden_layers']} layers, MLP "
        f"{config['intermediate_size']}, {config['num_attention_heads']} query / {config['num_key_value_heads']} "
        f"KV heads (head dim {head_dim})"
    )


def windows_of(batch: dict, run: dict) -> str:
    """A DFlash training batch: its windows, and where they came from when target-greedy sequences are mixed in."""
    generated = batch.get("generated_rows", 0)
    windows = f"{batch['corpus_rows'] + generated} windows of {batch['seq_len']} tokens"
    if not generated:
        return windows
    sequences = run["generated_sequences"]
    return f"{windows}, {batch['corpus_rows']} from the corpus and {generated} from {sequences} target-greedy sequences"


def training_runs(metadata: dict) -> list[tuple[str, str]]:
    """[(what it produced, command)] per training run, in order: each part of the pair records the command that
    trained it (a part recorded before that defaults to the pair's command), and parts trained by one command
    share its entry."""
    draft, heads = metadata["draft"], metadata.get("heads", {})
    parts = [(f"the tokenizer and the target ({metadata['target']['seconds']:.0f} s)",
              metadata["target"].get("command"))]  # fmt: skip
    earlier = draft.get("continued_from")
    if earlier:
        parts.append((f"the draft's first {earlier['steps_done']} steps ({earlier['seconds']:.0f} s)",
                      earlier.get("command")))  # fmt: skip
    what = "the draft's next" if earlier else "the draft's"
    parts.append((f"{what} {draft['steps_done']} steps ({draft['seconds']:.0f} s)", draft.get("command")))
    parts += [(f"the {DRAFTER_LABELS[name]} ({head_steps(head)})", head.get("command")) for name, head in
              heads.items()]  # fmt: skip
    runs: dict[str, list[str]] = {}
    for produced, command in parts:
        runs.setdefault(command or metadata["command"], []).append(produced)
    return [("; ".join(produced), command) for command, produced in runs.items()]


def head_steps(head: dict) -> str:
    """A head's training steps; a retrained head's (tools/retrain_demo_heads.py) with the run it replaced."""
    earlier = head.get("retrained_over")
    if earlier is None:
        return f"{head['steps_done']} steps"
    return (
        f"{head['steps_done']} steps, with the pair's recorded settings; the pair's run gave it {earlier['steps_done']}"
    )


def part_bytes(metadata: dict, part: str) -> int:
    return sum(size for name, size in metadata["bytes"].items() if name.startswith(part + "/"))


def acceptance_table(results: dict) -> list[str]:
    # Measurements recorded before measure_acceptance reported steps outside loops have no such column.
    outside = all("steps_outside_loops" in result for result in results.values())
    lines = [
        "| drafter | steps | mean accepted drafts (0..4) | mean tokens per step | acceptance at draft position "
        "1 / 2 / 3 / 4 | accepted 0/1/2/3/4 (steps) |" + (" outside loops: mean accepted (steps) |" if outside else ""),
        "| --- | --- | --- | --- | --- | --- |" + (" --- |" if outside else ""),
    ]
    order = list(DRAFTER_LABELS)
    for name, result in sorted(results.items(), key=lambda item: order.index(item[0]) if item[0] in order else 99):
        positions = " / ".join(f"{rate:.3f}" for rate in result["position_acceptance"])
        histogram = " / ".join(str(count) for count in result["histogram"])
        lines.append(
            f"| {DRAFTER_LABELS.get(name, name)} | {result['steps']} | **{result['mean_accepted']:.3f}** | "
            f"{result['mean_tokens_per_step']:.3f} | {positions} | {histogram} |"
            + (f" {result['mean_accepted_outside_loops']:.3f} ({result['steps_outside_loops']}) |" if outside else "")
        )
    return lines


def render(pair: Path) -> str:
    metadata = json.loads((pair / "metadata.json").read_text())
    target_config = json.loads((pair / "target" / "config.json").read_text())
    draft_config = json.loads((pair / "draft" / "config.json").read_text())
    target, draft, corpus = metadata["target"], metadata["draft"], metadata["corpus"]
    heads = metadata.get("heads", {})
    acceptance = metadata["acceptance"]
    out: list[str] = []
    add = out.append
    dflash = "dflash" in metadata  # trained by its own run (tools/train_demo_dflash.py), after the pair's
    drafters = "MTP head, EAGLE-3 head and DFlash drafter" if dflash else "MTP and EAGLE-3 heads"
    heads_text = "`mtp/` and `eagle3/` are head directories" + (", `dflash/` a DFlash block drafter," if dflash else "")
    names = ["DEMO_DRAFT", "DEMO_MTP", "DEMO_EAGLE3"] + (["DEMO_DFLASH"] if dflash else [])
    paths = ", ".join(f"`{name}`" for name in names[:-1]) + f" and `{names[-1]}`"
    add(f"# Demo pair: a small trained target and draft for Python source code, and the target's {drafters}\n")
    add(
        "`target/` and `draft/` are standard Hugging Face checkpoint directories (`config.json`, `model.safetensors` "
        "in float16, `generation_config.json`, tokenizer files) for two `LlamaForCausalLM` models trained on Python "
        "source (the standard library and, in the shipped pair, a few permissively licensed packages). They "
        f"share one tokenizer, so the pair works for speculative decoding on any machine, CPU included. {heads_text} "
        "trained for the target: they read its hidden states and use its embedding (and, for MTP"
        f"{' and DFlash' if dflash else ''}, its lm_head). No model hub is needed. In Python the paths are "
        f"`graphspec.examples.DEMO_TARGET`, {paths}; pass the target as TARGET and any of the others as DRAFT.\n"
    )
    loss = round(target["final"]["heldout_loss"], 3)
    previous = next(pair["heldout_loss"] for pair in reversed(EARLIER_PAIRS) if pair["heldout_loss"] != loss)
    add(
        f"These are toy models (held-out loss {loss:.3f} nats/token; the previous demo "
        f"target's was {previous:.3f}). Use them to show and test the speculation machinery; "
        "they say nothing about how fast real models run. This README is written by `tools/demo_pair_readme.py` from "
        "`metadata.json`.\n"
    )
    add("| | target | draft |\n| --- | --- | --- |")
    add(f"| architecture | {shape_of(target_config)} | {shape_of(draft_config)} |")
    add(f"| parameters | {target['parameters']:,} | {draft['parameters']:,} |")
    add(f"| `model.safetensors` | {metadata['bytes']['target/model.safetensors']:,} bytes | "
        f"{metadata['bytes']['draft/model.safetensors']:,} bytes |")  # fmt: skip
    add(f"| whole directory | {part_bytes(metadata, 'target'):,} bytes | {part_bytes(metadata, 'draft'):,} bytes |\n")
    if heads:
        add("| head | layout | parameters (own) | directory | training steps | teacher-forced top-1 agreement "
            "with the target on held-out text, drafts 1..4 |")  # fmt: skip
        add("| --- | --- | --- | --- | --- | --- |")
        for name, head in heads.items():
            agreement = (head.get("final") or {}).get("heldout_top1_agreement_by_draft", [])
            add(
                f"| `{name}/` | {head['layout']} | {head['parameters']:,} | {part_bytes(metadata, name):,} bytes | "
                f"{head['steps_done']} | {' / '.join(f'{x:.3f}' for x in agreement)} |"
            )
        if "eagle3" in heads:
            add(
                f"\nThe EAGLE-3 head drafts over the {heads['eagle3']['draft_vocab_size']} most frequent training "
                f"tokens (`d2t`, `t2d`) and reads the inputs of target layers "
                f"{heads['eagle3']['aux_hidden_state_layer_ids']} (transformers' `hidden_states[i]`)."
            )
        add("")
    if "dflash" in metadata:
        out.extend(dflash_section(metadata))
    add(
        f"Shared settings: vocabulary {metadata['tokenizer']['vocab_size']} byte-level BPE tokens; one special "
        "token, `<|endoftext|>` (id 0), is BOS, EOS and pad, and the tokenizer puts it before every encoded prompt "
        "as training put it before every file. `max_position_embeddings` is "
        f"{target_config['max_position_embeddings']}, the training window. Both checkpoints tie their embeddings. "
        "The target and draft directories are "
        f"{(part_bytes(metadata, 'target') + part_bytes(metadata, 'draft')) / 1e6:.2f} MB together.\n"
    )
    add("## Corpus and held-out split")
    add(
        f"- **Corpus:** every `.py` file of the CPython **{corpus['python_version']}** standard library, its test "
        f"suite included, except path parts {', '.join(corpus['excluded_parts'])} and top-level packages "
        f"{', '.join(corpus['excluded_top_level'])}; files that are not UTF-8 are skipped."
    )
    extra = corpus.get("extra_train_packages") or {}
    if extra:
        listed = ", ".join(
            f"{name} {info.get('version') or ''} ({info['files']:,} files, {info['bytes']:,} bytes)".replace("  ", " ")
            for name, info in extra.items()
        )
        where = {str(Path(info["directory"]).parent) for info in extra.values() if "directory" in info}
        add(
            "- **More training code** (`--extra-corpus`, training split only, all under permissive licenses"
            + (f"; read from `{where.pop()}`" if len(where) == 1 else "")
            + f"): the `.py` files of {listed}. The standard library alone is about 8M tokens, which a "
            "14M-parameter target memorizes."
        )
    add(
        f"- **Held-out split** (`graphspec/examples/__init__.py`, `split_of`): top-level packages or modules "
        f"{', '.join(corpus['heldout_top_level'])}: {len(corpus['heldout_files'])} files, "
        f"{corpus['heldout_bytes']:,} bytes, {corpus['heldout_tokens']:,} tokens. Their tests are in neither split."
    )
    add(f"- **Training split:** {corpus['train_files']:,} files, {corpus['train_bytes']:,} bytes, "
        f"{corpus['train_tokens']:,} tokens.")  # fmt: skip
    add(f"- **Fingerprints:** train `{corpus['train_fingerprint']}`, held-out `{corpus['heldout_fingerprint']}`.\n")
    add("## Training")
    versions = metadata["versions"]
    runs = training_runs(metadata)
    add(
        f"{'One run' if len(runs) == 1 else f'{len(runs)} runs'} of `tools/train_demo_pair.py`; the last on "
        f"{metadata['device']} (torch {versions['torch']}, transformers "
        f"{versions['transformers']}, Python {versions['python']}). A run after the first starts from the files an "
        "earlier one saved (`--target-from`, `--draft-from`). The exact commands, each with what it produced that "
        "ships here:\n"
    )
    for produced, command in runs:
        add(f"- {produced}:\n  ```\n  {command}\n  ```")
    add("")
    if draft.get("record_rebuilt_from_log"):
        add(f"The draft's last run: {draft['record_rebuilt_from_log']}.\n")
    add(
        "Each phase has a time budget; its step count is capped to what fits (measured after 25 steps) and its LR "
        "schedule (linear warmup, cosine decay to 10%) runs to that count. bf16 autocast, AdamW (betas 0.9/0.95, "
        "weight decay 0.1 on matrices), gradient clipping at 1.0. The target trains on next-token cross-entropy; "
        "the draft and both heads learn KL(target || drafter) over the vocabulary, half of each batch on corpus "
        "windows and half on the target's own greedy continuations. The heads unroll "
        f"{heads.get('mtp', heads.get('eagle3', {})).get('unroll', 0)} chained drafts per position, draft j feeding "
        "the head's own output for draft j-1 (weights 0.8^j)."
        + (" The DFlash drafter was trained separately (above)." if "dflash" in metadata else "")
        + "\n"
    )
    add("| | steps (requested) | peak lr | last training batch | held-out loss (CE) | held-out top-1 agreement |")
    add("| --- | --- | --- | --- | --- | --- |")
    for name, phase in (("target", target), ("draft", draft)):
        final = phase["final"]
        agree = final.get("heldout_top1_agreement_with_target")
        add(
            f"| {name} | {phase['steps_done']} ({phase['steps_requested']}) | {phase['peak_lr']} | CE "
            f"{final['train_ce']:.3f} | {final['heldout_loss']:.3f} | {'n/a' if agree is None else f'{agree:.3f}'} |"
        )
    add("\nHeld-out loss of the target during training: " + ", ".join(
        f"{entry['heldout_loss']:.3f} (step {entry['step']})" for entry in target["log"]) + ".\n")  # fmt: skip
    add("## Acceptance")
    add(
        "Mean accepted draft tokens per speculation step (0..K) under greedy chain drafting at K = "
        f"{acceptance['k']}, measured by `tools/measure_acceptance.py`'s replay on the saved files in fp32: "
        f"{acceptance['prompts']} prompts of {acceptance['prompt_tokens']} tokens from held-out files; a step "
        "accepts the leading drafts equal to the target's greedy continuation. Tokens per step is that plus 1.\n"
    )
    measured = [name for name in DRAFTER_LABELS if any(name in r for r in acceptance["by_new_tokens"].values())]
    command = f"PYTHONPATH=. python3 tools/measure_acceptance.py --threads 1 --drafters {','.join(measured)}"
    add(f"```\n{command}\n{command} --new-tokens 32\n```\n")
    for new_tokens, results in acceptance["by_new_tokens"].items():
        ratio = next(iter(results.values()))["distinct_4gram_ratio"]
        add(
            f"**{new_tokens} new tokens per prompt** (distinct 4-gram ratio of the target's continuations {ratio:.3f}):"
        )
        add("")
        out.extend(acceptance_table(results))
        add("")
    add(
        "Loops inflate these numbers: inside a loop every drafter predicts nearly every token, so compare drafters "
        "on the 32-token rows or outside loops, and read the distinct 4-gram ratio next to any number. The pairs "
        "shipped before, measured the same way (mean accepted drafts at 128 / 32 new tokens; the draft model's "
        "outside loops by docs/results/2026-11-27-demo-draft/novel_steps.py, the same classification):\n"
    )
    add("| commit | target | held-out loss | distinct 4-grams (128) | " + " | ".join(DRAFTER_LABELS.values())
        + " | draft model outside loops |")  # fmt: skip
    add("| --- | --- | --- | --- | " + " | ".join("---" for _ in DRAFTER_LABELS) + " | --- |")
    for pair in EARLIER_PAIRS:
        cells = [" / ".join(f"{x:.3f}" for x in pair["accepted"][name]) if name in pair["accepted"] else "-"
                 for name in DRAFTER_LABELS]  # fmt: skip
        cells.append(" / ".join(f"{x:.3f}" for x in pair["draft_outside_loops"]))
        add(f"| {pair['commit']} | {pair['target_parameters']} | {pair['heldout_loss']:.3f} | "
            f"{pair['distinct_128']:.3f} | " + " | ".join(cells) + " |")  # fmt: skip
    add("")
    add("## Greedy completions of the quickstart's prompts (target alone, fp32)\n")
    for sample in metadata.get("samples", []):
        add(f"```python\n{sample['prompt']}{sample['greedy']}\n```\n")
    add("## Files and sha256")
    add("| file | bytes | sha256 |\n| --- | --- | --- |")
    for name, digest in metadata["sha256"].items():
        add(f"| `{name}` | {metadata['bytes'][name]:,} | `{digest}` |")
    add(
        "\n`tests/e2e/test_demo_pair.py` checks these hashes, that both models load in transformers and graphspec "
        "with equal logits and greedy output, and that the draft model"
        + (", both heads and the DFlash drafter" if "dflash" in metadata else " and both heads")
        + " still get drafts accepted on held-out prompts."
    )
    return "\n".join(out) + "\n"


def dflash_section(metadata: dict) -> list[str]:
    """The DFlash drafter's paragraph: what it is, how it was trained (tools/train_demo_dflash.py on CPU)."""
    run = metadata["dflash"]
    training, corpus = run["training"], run["corpus"]
    agreement = (training.get("final") or {}).get("heldout_top1_agreement_by_slot", [])
    mask = run["mask_token"]
    return [
        f"`dflash/` is a DFlash block drafter (z-lab layout: a Qwen3 config with architectures "
        f'`["DFlashDraftModel"]`, `block_size` {run["block_size"]}, `dflash_config` {{`target_layer_ids` '
        f"{run['target_layer_ids']}, `mask_token_id` {mask['id']}}}): {run['layers']} non-causal decoder layer(s) "
        f"at the target's hidden size, {run['parameters']:,} parameters of its own (fc, hidden_norm, layers, norm; "
        f"the embedding and lm_head are the target's), {part_bytes(metadata, 'dflash'):,} bytes. One forward "
        f"drafts all K = {run['block_size'] - 1} tokens from the block [last token, `{mask['token']}` x "
        f"{run['block_size'] - 1}] (the mask token is the tokenizer's only special token, which otherwise only "
        "starts a file), attending to the target's layer outputs of the committed positions before the block.",
        "",
        "It was trained by `tools/train_demo_dflash.py` on "
        + ("the GPU" if run.get("device", "cpu").startswith("cuda") else f"a {run['threads']}-thread CPU")
        + " against the frozen "
        f"target, after the rest of the pair, in {run['total_seconds']:.0f} s ({training['steps_done']} steps of "
        f"{windows_of(training['batch'], run)}, with "
        f"{run['anchors_per_window']} random anchors each; peak lr {run['peak_lr']}, cosine over the time budget): "
        f"{run['objective']}, on {corpus['train_files_used']} train-split files of the CPython stdlib at "
        f"`{corpus['stdlib']}` ({corpus['train_tokens']:,} tokens, train fingerprint "
        f"`{corpus['train_fingerprint'][:16]}...`; held-out files only evaluated). Held-out top-1 agreement with "
        f"the target per mask slot 1..{len(agreement)}: {' / '.join(f'{x:.3f}' for x in agreement)}. The command:",
        "",
        f"```\nPYTHONPATH=. {run['command']}\n```",
        "",
    ]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pair", type=Path, default=REPO / "graphspec" / "examples" / "demo_pair")
    parser.add_argument("--stdout", action="store_true", help="print instead of writing PAIR/README.md")
    args = parser.parse_args(argv)
    text = render(args.pair)
    if args.stdout:
        print(text, end="")
    else:
        (args.pair / "README.md").write_text(text)


if __name__ == "__main__":
    main()
