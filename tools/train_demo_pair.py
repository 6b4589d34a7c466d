"""Train the built-in demo pair (a small Llama target and a much smaller Llama draft, on Python source)
and two heads for the target (MTP and EAGLE-3), in one run.

Corpus: the .py files of the running interpreter's standard library; the split into train and held-out
files is defined in graphspec/examples/__init__.py (by top-level package) and recorded in the metadata.
Steps, in one process:
  1. a byte-level BPE tokenizer (tokenizers library, one special token <|endoftext|> used as BOS, EOS and
     pad) trained on the training files only, saved as a transformers PreTrainedTokenizerFast;
  2. the target (transformers LlamaForCausalLM), next-token cross-entropy on random windows of the
     training token stream (each file is preceded by <|endoftext|>);
  3. the draft, distilled from the finished target: KL(target || draft) over the full vocabulary at
     every position, on corpus windows and on the target's own greedy continuations;
  4. the MTP and EAGLE-3 heads for the frozen target (train_demo_heads.py: KL to the target, unrolled
     over chained drafts), on the same mix;
  5. held-out loss of target and draft, the draft's and heads' top-1 agreement with the target;
  6. everything saved in float16 (target/ and draft/ with save_pretrained and the tokenizer, mtp/ and
     eagle3/ as head directories), then, from the saved files: greedy acceptance of every drafter on
     held-out prompts (measure_acceptance.py's replay), the target's greedy completions of the
     quickstart prompts, and metadata.json (command, corpus, split, steps, losses, timings, versions,
     acceptance, samples, sha256 of every file).
Each training phase has a time budget (--target-seconds, --draft-seconds, --head-seconds): its step count
is capped to what fits, measured after a few steps, and the LR schedule (warmup, cosine to 10%) runs to
that count. Seeds are fixed and the data order is deterministic; GPU kernels (attention backward,
embedding gradients) are not bitwise deterministic, so a rerun on a GPU matches closely, not bit for bit.

GPU (bf16 autocast):  PYTHONPATH=. python3 tools/train_demo_pair.py --out graphspec/examples/demo_pair
CPU smoke test:       PYTHONPATH=. python3 tools/train_demo_pair.py --smoke --out /tmp/demo_pair_smoke
More training code (--extra-corpus DIR, one per package; its name and installed version are recorded): the
shipped pair read 22 packages from the GPU machine's own site-packages (no upload needed; list and versions
in the pair's README), selected there with
  python3 -c "import importlib, os; [print('--extra-corpus', os.path.dirname(importlib.import_module(n).__file__))
              for n in ('torch', 'sympy', 'numpy', 'networkx', 'pip', 'setuptools', 'jinja2')]"   # ... and so on
Another Python's stdlib as the corpus (how the shipped pair was trained on CPython 3.11.7's library):
  here:  python3 tools/train_demo_pair.py --pack-corpus build/corpus_stdlib/stdlib.tar.gz
  there: mkdir -p /tmp/stdlib && tar xzf build/corpus_stdlib/stdlib.tar.gz -C /tmp/stdlib &&
         PYTHONPATH=. python3 tools/train_demo_pair.py --stdlib /tmp/stdlib --stdlib-version 3.11.7 --out ...
  The device tool copies the working tree and the carried paths, 64 MiB at most; the tree holds about 65 MB
  (the demo pair's files are 60), so with the 5.9 MB corpus carried it is refused: for the call, move the demo
  pair's weights the run does not read out of the tree (2026-11-28: the draft's and the DFlash drafter's while
  tools/retrain_demo_heads.py ran) and put them back after.
A target phase longer than one device call (10 minutes) allows: --stop-after-target --out A in one call,
then --target-from A --out B in the next (B gets A's target and tokenizer unchanged and its phase record).
--target-from graphspec/examples/demo_pair retrains the shipped pair's draft and heads against its target.
Files come back from the device in pieces of at most 16 MiB: tar the output and split it.
"""

from __future__ import annotations

import argparse
import functools
import importlib.metadata
import importlib.util
import json
import platform
import shutil
import sys
import time
from dataclasses import asdict
from pathlib import Path

import tokenizers
import torch
import torch.nn.functional as F
import transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tools"))  # demo_heads, train_demo_heads, measure_acceptance (also by file path)
from demo_training import StepCap, autocast, lr_at, make_optimizer, windows  # noqa: E402
from measure_acceptance import cache_argument, kv_cache  # noqa: E402
from train_demo_heads import train_heads  # noqa: E402

SPECIAL = "<|endoftext|>"  # id 0: BOS, EOS and pad
# Greedy completions of these (the quickstart's and bench_cpu.py's prompts) are recorded in the metadata.
# The first is the quickstart's: a toy target writes recognizable code after it, while "def fibonacci(n):"
# (last) draws a math docstring from sympy's sources.
SAMPLE_PROMPTS = (
    "def read_lines(path):\n    with open(path) as f:",
    "class Stack:\n    def __init__(self):",
    "import os\n\n\ndef list_files(path):",
    "def fibonacci(n):",
)
SAMPLE_NEW_TOKENS = 96
TARGET_PHASE = "target_phase.json"  # --stop-after-target's record, read back by --target-from


def load_examples_module():
    """graphspec/examples/__init__.py by file path: it holds the corpus split and needs only the
    standard library, while importing the graphspec package would load the whole compiler."""
    spec = importlib.util.spec_from_file_location("graphspec_examples", REPO / "graphspec" / "examples" / "__init__.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(spec.name, module)
    spec.loader.exec_module(module)
    return sys.modules[spec.name]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, help="output dir: target/, draft/, metadata.json")
    parser.add_argument(
        "--pack-corpus",
        type=Path,
        default=None,
        help="only write the corpus files of --stdlib to this .tar.gz and exit",
    )
    parser.add_argument("--smoke", action="store_true", help="tiny corpus, models and step counts (CPU test)")
    parser.add_argument("--stdlib", type=Path, default=None, help="stdlib root (default: this interpreter's)")
    parser.add_argument(
        "--extra-corpus",
        type=Path,
        action="append",
        default=[],
        metavar="DIR",
        help="a package directory whose .py files join the TRAINING split (repeatable; the held-out split stays "
        "the stdlib's). The stdlib alone is about 8M tokens, which a 14M-parameter target memorizes.",
    )
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--vocab-size", type=int, default=4096)
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--target-steps", type=int, default=2400)
    parser.add_argument("--draft-steps", type=int, default=3000)
    parser.add_argument("--target-lr", type=float, default=1.5e-3)
    parser.add_argument("--draft-lr", type=float, default=3e-3)
    parser.add_argument("--target-shape", default="384,8,1024,6,2", help="hidden,layers,intermediate,heads,kv_heads")
    parser.add_argument(
        "--draft-shape", default=None, help="hidden,layers,intermediate,heads,kv_heads (default 256,3,704,4,4)"
    )
    parser.add_argument("--target-seconds", type=float, default=200.0, help="target phase budget (caps its steps)")
    parser.add_argument("--draft-seconds", type=float, default=110.0, help="draft phase budget (caps its steps)")
    parser.add_argument("--gen-sequences", type=int, default=16384, help="target-greedy sequences for the draft")
    parser.add_argument("--gen-prompt", type=int, default=64, help="prompt tokens of each generated sequence")
    parser.add_argument("--gen-new", type=int, default=192, help="greedy tokens of each generated sequence")
    parser.add_argument("--gen-batch", type=int, default=2048)
    parser.add_argument("--heads", default="mtp,eagle3", help="heads to train for the target ('' for none)")
    parser.add_argument("--head-steps", type=int, default=2000)
    parser.add_argument("--head-lr", type=float, default=1e-3)
    parser.add_argument(
        "--head-batch-size",
        type=int,
        default=16,
        help="a head step trains on this many windows of tokens: half corpus windows, half generated rows",
    )
    parser.add_argument("--head-unroll", type=int, default=4, help="chained drafts per training position")
    parser.add_argument("--head-seconds", type=float, default=45.0, help="budget of each head (caps its steps)")
    parser.add_argument("--eagle3-draft-vocab", type=int, default=2048, help="EAGLE-3's reduced draft vocabulary")
    parser.add_argument("--eagle3-layers", default=None, help="aux layer ids (default vLLM's: 2, L/2, L-3)")
    parser.add_argument("--accept-prompts", type=int, default=20, help="held-out prompts for the acceptance")
    parser.add_argument("--accept-new-tokens", default="128,32", help="new tokens per prompt, per measurement")
    parser.add_argument("--stdlib-version", default=None, help="Python version of --stdlib (recorded only)")
    parser.add_argument("--eval-every", type=int, default=250)
    parser.add_argument("--time-budget", type=float, default=470.0, help="seconds; training stops outright past it")
    parser.add_argument(
        "--stop-after-target",
        action="store_true",
        help="save the tokenizer and target to OUT/target and the target phase to OUT/target_phase.json, then exit "
        "(a longer target phase than one device call leaves room for; finish with --target-from OUT)",
    )
    parser.add_argument(
        "--target-from",
        type=Path,
        default=None,
        metavar="DIR",
        help="take the tokenizer, target and target phase a --stop-after-target run saved in DIR instead of "
        "training them",
    )
    parser.add_argument(
        "--draft-from",
        type=Path,
        default=None,
        metavar="DIR",
        help="start the draft from DIR/draft (an earlier run's --out, or a whole pair) and train it further; its "
        "shape is that config's, and DIR/metadata.json's draft record is kept as the run it continues",
    )
    args = parser.parse_args(argv)
    if args.out is None and args.pack_corpus is None:
        parser.error("--out is required")
    names = [directory.name for directory in args.extra_corpus]
    if len(set(names)) != len(names):
        parser.error(f"--extra-corpus: two directories share a name ({', '.join(names)}); packages are keyed by name")
    if args.target_from is not None:
        record = [n for n in (TARGET_PHASE, "metadata.json") if (args.target_from / n).is_file()]
        missing = [n for n in ("target/config.json",) if not (args.target_from / n).is_file()]
        if missing or not record:
            parser.error(
                f"--target-from {args.target_from}: no {', '.join(missing + ([] if record else [TARGET_PHASE]))} "
                "(a --stop-after-target output, or a whole pair with its metadata.json)"
            )
        if args.stop_after_target:
            parser.error("--target-from and --stop-after-target exclude each other")
    if args.draft_from is not None and args.draft_shape is not None:
        parser.error("--draft-from and --draft-shape exclude each other: the draft keeps its checkpoint's shape")
    args.draft_shape = args.draft_shape or "256,3,704,4,4"
    # Refused here, before the minutes of training they would otherwise end.
    unknown = set(filter(None, args.heads.split(","))) - {"mtp", "eagle3"}
    if unknown:
        parser.error(f"--heads: unknown head(s) {', '.join(sorted(unknown))}; choose from mtp, eagle3")
    for flag in ("target_shape", "draft_shape"):
        parts = getattr(args, flag).split(",")
        if len(parts) != 5 or not all(part.isdigit() and int(part) > 0 for part in parts):
            parser.error(
                f"--{flag.replace('_', '-')} must be 5 positive ints hidden,layers,intermediate,heads,kv_heads"
            )
    if not all(part.isdigit() and int(part) > 0 for part in args.accept_new_tokens.split(",")):
        parser.error(f"--accept-new-tokens must be positive ints separated by commas, got {args.accept_new_tokens!r}")
    if not 1 <= args.eagle3_draft_vocab <= args.vocab_size:
        parser.error(f"--eagle3-draft-vocab must be between 1 and --vocab-size ({args.vocab_size})")
    if args.smoke:
        args.vocab_size, args.seq_len, args.batch_size = 512, 64, 4
        args.target_steps, args.draft_steps, args.head_steps, args.eval_every = 3, 3, 3, 2
        args.gen_sequences, args.gen_prompt, args.gen_new, args.gen_batch = 8, 16, 16, 4
        args.target_shape, args.draft_shape = "64,4,128,4,2", "32,1,64,2,2"
        args.head_batch_size, args.eagle3_draft_vocab, args.accept_prompts = 2, 256, 2
        args.accept_new_tokens = "8"
    if args.draft_from is not None:
        missing = [n for n in ("draft/config.json", "metadata.json") if not (args.draft_from / n).is_file()]
        if missing:
            parser.error(f"--draft-from {args.draft_from}: no {', '.join(missing)} (an earlier run's --out)")
        config = json.loads((args.draft_from / "draft" / "config.json").read_text())
        keys = ("hidden_size", "num_hidden_layers", "intermediate_size", "num_attention_heads", "num_key_value_heads")
        if any(key not in config for key in (*keys, "vocab_size")):
            parser.error(f"--draft-from {args.draft_from}: draft/config.json is not a Llama config")
        args.draft_shape = ",".join(str(config[key]) for key in keys)
        # The vocabulary the draft will be trained on: the saved target's, or the one this run trains.
        source = args.target_from / "target" / "config.json" if args.target_from is not None else None
        vocab = json.loads(source.read_text())["vocab_size"] if source is not None else args.vocab_size
        if config["vocab_size"] != vocab:
            parser.error(f"--draft-from {args.draft_from}: the draft's vocabulary is {config['vocab_size']}, the "
                         f"target's {vocab}")  # fmt: skip
    return args


def model_config(shape: str, vocab_size: int, max_positions: int) -> LlamaConfig:
    hidden, layers, intermediate, heads, kv_heads = (int(x) for x in shape.split(","))
    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=max_positions,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
        bos_token_id=0,
        eos_token_id=0,
        pad_token_id=0,
    )


def train_tokenizer(texts: list[str], vocab_size: int, max_length: int) -> PreTrainedTokenizerFast:
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=[SPECIAL],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(texts, trainer=trainer, length=len(texts))
    assert backend.token_to_id(SPECIAL) == 0
    # Encoding a prompt prepends <|endoftext|> as BOS, as every training file is preceded by it.
    backend.post_processor = processors.TemplateProcessing(
        single=f"{SPECIAL} $A", pair=f"{SPECIAL} $A {SPECIAL} $B", special_tokens=[(SPECIAL, 0)]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token=SPECIAL, eos_token=SPECIAL, pad_token=SPECIAL, model_max_length=max_length
    )


def token_stream(tokenizer: PreTrainedTokenizerFast, texts: list[str]) -> torch.Tensor:
    """All files as one int64 stream, each file preceded by <|endoftext|> (id 0)."""
    encoded = tokenizer.backend_tokenizer.encode_batch(texts, add_special_tokens=False)
    ids: list[int] = []
    for item in encoded:
        ids.append(0)
        ids.extend(item.ids)
    return torch.tensor(ids, dtype=torch.int64)


@torch.no_grad()
def evaluate(model, stream, args, teacher=None) -> dict[str, float]:
    """Mean next-token loss over non-overlapping held-out windows (and top-1 agreement with teacher)."""
    model.eval()
    count = min((len(stream) - 1) // args.seq_len, 256)
    starts = torch.arange(count, device=stream.device) * args.seq_len
    total_loss, total_agree, total = 0.0, 0.0, 0
    for batch in starts.split(args.batch_size):
        inputs, labels = windows(stream, batch, args.seq_len)
        with autocast(args.device):
            logits = model(input_ids=inputs).logits.float()
        total_loss += F.cross_entropy(logits.flatten(0, 1), labels.flatten(), reduction="sum").item()
        if teacher is not None:
            with autocast(args.device):
                teacher_logits = teacher(input_ids=inputs).logits.float()
            total_agree += (logits.argmax(-1) == teacher_logits.argmax(-1)).sum().item()
        total += labels.numel()
    model.train()
    result = {"heldout_loss": total_loss / total, "heldout_tokens": total}
    if teacher is not None:
        result["heldout_top1_agreement_with_target"] = total_agree / total
    return result


def batch_loss(model, inputs, labels, device, teacher=None) -> tuple[torch.Tensor, torch.Tensor]:
    """(loss, cross-entropy): the loss is cross-entropy, or KL(teacher || model) when distilling."""
    with autocast(device):
        logits = model(input_ids=inputs).logits.float()
        ce = F.cross_entropy(logits.flatten(0, 1), labels.flatten())
        if teacher is None:
            return ce, ce
        with torch.no_grad():
            teacher_logp = F.log_softmax(teacher(input_ids=inputs).logits.float(), dim=-1)
        logp = F.log_softmax(logits, dim=-1)
        kl = F.kl_div(logp.flatten(0, 1), teacher_logp.flatten(0, 1), log_target=True, reduction="batchmean")
    return kl, ce


@torch.no_grad()
def generate_greedy(model, stream, args) -> torch.Tensor:
    """Target-greedy sequences [N, prompt + new]: prompts are random training windows, continuations
    the model's own greedy tokens (no stopping at EOS), batched with the KV cache."""
    generator = torch.Generator(device="cpu").manual_seed(args.seed + 2)
    sequences = []
    for first in range(0, args.gen_sequences, args.gen_batch):
        rows = min(args.gen_batch, args.gen_sequences - first)
        starts = torch.randint(0, len(stream) - args.gen_prompt, (rows,), generator=generator).to(stream.device)
        tokens = stream[starts[:, None] + torch.arange(args.gen_prompt, device=stream.device)]
        with autocast(args.device):
            out = model(input_ids=tokens, use_cache=True)
            pieces = [tokens, out.logits[:, -1].argmax(-1, keepdim=True)]
            cache = cache_argument(model)
            for _ in range(args.gen_new - 1):
                out = model(input_ids=pieces[-1], **{cache: kv_cache(out)}, use_cache=True)
                pieces.append(out.logits[:, -1].argmax(-1, keepdim=True))
        sequences.append(torch.cat(pieces, dim=1))
    return torch.cat(sequences)


def train(name, model, stream, heldout, args, steps, lr, budget, deadline, teacher=None, generated=None) -> dict:
    """Cross-entropy training on random corpus windows; with `teacher`, distillation (forward KL over
    the vocabulary) instead, and with `generated` too, half of every batch's tokens are rows of
    `generated` (the teacher's own greedy sequences) and half corpus windows. `steps` is capped to fit
    `budget` seconds (StepCap); `deadline` (the whole run's) stops it outright, a last resort."""
    device = args.device
    generator = torch.Generator(device="cpu").manual_seed(args.seed + (1 if teacher is not None else 0))
    optimizer = make_optimizer(model, lr, device)
    corpus_rows = args.batch_size if generated is None else max(1, args.batch_size // 2)
    generated_rows = 0 if generated is None else max(1, corpus_rows * args.seq_len // (generated.shape[1] - 1))
    model.train()
    cap = StepCap(steps, budget)
    log, done, stopped_early = [], 0, False
    while done < cap.steps:
        if time.time() > deadline:
            stopped_early = True
            break
        for group in optimizer.param_groups:
            group["lr"] = lr_at(done, cap.steps, lr)
        starts = torch.randint(0, len(stream) - args.seq_len - 1, (corpus_rows,), generator=generator)
        inputs, labels = windows(stream, starts.to(stream.device), args.seq_len)
        loss, ce = batch_loss(model, inputs, labels, device, teacher)
        entry_extra = {}
        if generated is not None:
            rows = torch.randint(0, generated.shape[0], (generated_rows,), generator=generator).to(generated.device)
            chunk = generated[rows]
            generated_loss, _ = batch_loss(model, chunk[:, :-1], chunk[:, 1:], device, teacher)
            entry_extra = {"train_loss_generated": generated_loss}
            loss = 0.5 * (loss + generated_loss)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        done += 1
        cap.after_step(done)
        if done % args.eval_every == 0 or done == cap.steps:
            entry = {"step": done, "train_ce": ce.item(), "train_loss": loss.item(), "seconds": cap.elapsed()}
            entry.update({k: v.item() for k, v in entry_extra.items()})
            evaluating = time.time()
            entry.update(evaluate(model, heldout, args, teacher))
            cap.after_evaluation(done, time.time() - evaluating, args.eval_every)
            log.append(entry)
            fields = (f"{k}={v:.4f}" if isinstance(v, float) else f"{k}={v}" for k, v in entry.items())
            print(f"[{name}] " + " ".join(fields), flush=True)
    if not log or log[-1]["step"] != done:
        entry = {"step": done, "train_ce": ce.item(), "train_loss": loss.item(), "seconds": cap.elapsed()}
        entry.update(evaluate(model, heldout, args, teacher))
        log.append(entry)
    return {
        "steps_requested": steps,
        "steps_done": done,
        "steps_capped_by_budget": cap.capped,
        "budget_seconds": budget,
        "stopped_early_by_deadline": stopped_early,
        "seconds": cap.elapsed(),
        "peak_lr": lr,
        "batch": {"corpus_rows": corpus_rows, "corpus_seq_len": args.seq_len, "generated_rows": generated_rows},
        "log": log,
        "final": log[-1],
    }


def save(model: LlamaForCausalLM, tokenizer: PreTrainedTokenizerFast, directory: Path) -> None:
    if directory.exists():
        shutil.rmtree(directory)
    model = model.to(device="cpu", dtype=torch.float16).eval()
    model.config.dtype = "float16"
    model.generation_config = GenerationConfig(bos_token_id=0, eos_token_id=0, pad_token_id=0)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)


def measure_saved(out: Path, drafters: list[str], stdlib: Path, args) -> tuple[dict, list[dict]]:
    """Greedy acceptance of every drafter on held-out prompts (tools/measure_acceptance.py's replay, K=4,
    fp32) and the target's greedy completions of SAMPLE_PROMPTS, all from the saved files."""
    import measure_acceptance

    target, draft, tokenizer, eos = measure_acceptance.load_pair(out / "target", out / "draft", args.device)
    made = measure_acceptance.load_drafters(drafters, target, draft, out, args.device)
    prompts = measure_acceptance.heldout_prompts(tokenizer, args.accept_prompts, 64, stdlib)
    acceptance = {"k": 4, "prompts": args.accept_prompts, "prompt_tokens": 64, "dtype": "float32", "by_new_tokens": {}}
    for new_tokens in (int(x) for x in args.accept_new_tokens.split(",")):
        results = {}
        for name, drafter in made.items():
            result = measure_acceptance.measure(target, drafter, prompts, 4, new_tokens, eos)
            results[name] = asdict(result)
            print(f"acceptance {name} @ {new_tokens} new tokens: {result.mean_accepted:.3f} accepted/step", flush=True)
        acceptance["by_new_tokens"][str(new_tokens)] = results
    return acceptance, greedy_samples(target, tokenizer, eos)


def greedy_samples(target, tokenizer, eos: set[int]) -> list[dict]:
    """The target's greedy completions of SAMPLE_PROMPTS (cut at EOS) and their distinct 4-gram ratios."""
    import measure_acceptance

    samples = []
    for prompt in SAMPLE_PROMPTS:
        ids = tokenizer(prompt)["input_ids"]
        tokens = measure_acceptance.greedy(target, ids, SAMPLE_NEW_TOKENS)
        text = tokenizer.decode(cut_at(tokens, eos), skip_special_tokens=True)
        grams = [tuple(tokens[i : i + 4]) for i in range(len(tokens) - 3)]
        samples.append({"prompt": prompt, "greedy": text, "distinct_4gram_ratio": len(set(grams)) / len(grams)})
        print(f"--- greedy completion of {prompt!r}:\n{prompt}{text}\n---", flush=True)
    return samples


def target_phase(directory: Path) -> dict:
    """The target phase a --stop-after-target run recorded in DIR, or the one in a whole pair's metadata.json
    (to retrain the draft and heads of a shipped pair against its target)."""
    if (directory / TARGET_PHASE).is_file():
        return json.loads((directory / TARGET_PHASE).read_text())
    metadata = json.loads((directory / "metadata.json").read_text())
    target = {k: v for k, v in metadata["target"].items() if k not in ("shape", "parameters")}
    target.setdefault("command", metadata["command"])
    return {"shape": metadata["target"]["shape"], "target": target}


def command_line(argv: list[str] | None) -> str:
    return "PYTHONPATH=. python3 tools/train_demo_pair.py " + " ".join(sys.argv[1:] if argv is None else argv)


def cut_at(tokens: list[int], eos: set[int]) -> list[int]:
    for index, token in enumerate(tokens):
        if token in eos:
            return tokens[:index]
    return tokens


def head_metadata(name: str, head, result: dict) -> dict:
    layout = {
        "mtp": "SGLang standalone NextN (LlamaForCausalLMNextN): model.layers.0.{enorm, hnorm, eh_proj, "
        "shared_head.norm, one Llama decoder layer}; embedding and lm_head are the target's",
        "eagle3": "EAGLE-3 (LlamaForCausalLMEagle3): fc, midlayer.*, norm, lm_head over the draft vocabulary, "
        "d2t, t2d; embedding is the target's",
    }[name]
    extra = {}
    if name == "eagle3":
        extra = {"draft_vocab_size": len(head.d2t), "aux_hidden_state_layer_ids": head.aux_layer_ids}
    return {"layout": layout, **extra, **result}


def package_files(directory: Path) -> list[tuple[str, str]]:
    """(path under the package's name, text) of a package directory's UTF-8 .py files, sorted (caches skipped)."""
    if not directory.is_dir():
        raise SystemExit(f"--extra-corpus {directory}: not a directory")
    found = []
    for path in sorted(directory.rglob("*.py")):
        if "__pycache__" in path.parts or not path.is_file():
            continue
        try:
            found.append((f"{directory.name}/{path.relative_to(directory).as_posix()}", path.read_text("utf-8")))
        except UnicodeDecodeError:
            continue
    return found


def installed_version(package: str) -> str | None:
    """The installed distribution version of a top-level package name (`_pytest` -> pytest's), if any."""
    distributions = installed_distributions().get(package, [])
    return importlib.metadata.version(distributions[0]) if distributions else None


@functools.cache
def installed_distributions() -> dict[str, list[str]]:
    """Top-level package -> distributions: one scan of every installed distribution serves all packages."""
    return importlib.metadata.packages_distributions()


def corpus_files(
    examples, root: Path, extra_corpus: list[Path], smoke: bool
) -> tuple[list[tuple[str, str]], list[tuple[str, str]], dict[str, list[tuple[str, str]]]]:
    """(train files, held-out files, {package name: its files}): the stdlib at root's splits, the extra packages
    joining the train split; with smoke, a slice of both. A root without the held-out modules is refused."""
    train_files = examples.stdlib_files("train", root)
    heldout_files = examples.stdlib_files("heldout", root)
    if not heldout_files:  # else evaluation fails minutes later, after tokenizing and generating
        held = ", ".join(examples.HELDOUT_TOP_LEVEL)
        raise SystemExit(f"{root}: none of the held-out modules ({held}): is it a Python standard library?")
    extra_files = {directory.name: package_files(directory) for directory in extra_corpus}
    train_files += [file for files in extra_files.values() for file in files]
    if smoke:  # a slice of the corpus keeps tokenizer training and encoding to seconds on a CPU
        train_files, heldout_files = train_files[::50], heldout_files[::10]
    return train_files, heldout_files, extra_files


def pack_corpus(examples, root: Path, destination: Path) -> None:
    """Tar the corpus files (both splits) of a stdlib, to train on another machine's Python with --stdlib."""
    import tarfile

    names = sorted(p.relative_to(root).as_posix() for p in root.rglob("*.py") if p.is_file())
    names = [name for name in names if examples.split_of(name) is not None]
    destination.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(destination, "w:gz") as tar:
        for name in names:
            tar.add(root / name, arcname=name, recursive=False)
    print(f"{destination}: {len(names)} files of {root}")


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.pack_corpus is not None:
        examples = load_examples_module()
        pack_corpus(examples, args.stdlib or examples.stdlib_root(), args.pack_corpus)
        return
    began = time.time()
    deadline = began + args.time_budget
    torch.manual_seed(args.seed)
    torch.backends.cuda.matmul.allow_tf32 = True
    examples = load_examples_module()
    root = args.stdlib or examples.stdlib_root()

    train_files, heldout_files, extra_files = corpus_files(examples, root, args.extra_corpus, args.smoke)
    print(f"corpus {root}: {len(train_files)} train files, {len(heldout_files)} held-out files")

    if args.target_from is None:
        tokenizer = train_tokenizer([text for _, text in train_files], args.vocab_size, args.seq_len)
    else:
        tokenizer = PreTrainedTokenizerFast.from_pretrained(args.target_from / "target")
    train_stream = token_stream(tokenizer, [text for _, text in train_files]).to(args.device)
    heldout_stream = token_stream(tokenizer, [text for _, text in heldout_files]).to(args.device)
    tokenizer_seconds = time.time() - began
    print(
        f"tokenizer+encode {tokenizer_seconds:.1f}s: {len(train_stream)} train, {len(heldout_stream)} held-out tokens"
    )

    if args.target_from is None:
        torch.manual_seed(args.seed)
        target_config = model_config(args.target_shape, len(tokenizer), args.seq_len)
        target = LlamaForCausalLM(target_config).to(args.device)
        target_result = train(
            "target", target, train_stream, heldout_stream, args, args.target_steps, args.target_lr,
            args.target_seconds, deadline,
        )  # fmt: skip
        target_result["command"] = command_line(argv)
    else:  # the saved (float16) target, read back in fp32: the draft and heads learn the shipped weights
        target = LlamaForCausalLM.from_pretrained(args.target_from / "target", dtype=torch.float32).to(args.device)
        phase = target_phase(args.target_from)
        target_result, args.target_shape = phase["target"], phase["shape"]
        print(f"target from {args.target_from}: {target_result['steps_done']} steps, {target_result['final']}")
    target.eval().requires_grad_(False)
    if args.stop_after_target:
        args.out.mkdir(parents=True, exist_ok=True)
        save(target, tokenizer, args.out / "target")
        phase = {"shape": args.target_shape, "tokenizer_seconds": tokenizer_seconds, "target": target_result}
        (args.out / TARGET_PHASE).write_text(json.dumps(phase, indent=2, default=str) + "\n")
        print(f"target saved to {args.out / 'target'} in {time.time() - began:.1f}s; finish with --target-from")
        return

    torch.manual_seed(args.seed + 1)
    if args.draft_from is None:
        draft = LlamaForCausalLM(model_config(args.draft_shape, len(tokenizer), args.seq_len)).to(args.device)
        continued = {}
    else:
        draft = LlamaForCausalLM.from_pretrained(args.draft_from / "draft", dtype=torch.float32).to(args.device)
        earlier = json.loads((args.draft_from / "metadata.json").read_text())["draft"]
        continued = {"continued_from": {k: v for k, v in earlier.items() if k not in ("log", "generated")}}
    generation_began = time.time()
    generated = generate_greedy(target, train_stream, args)
    generation_seconds = time.time() - generation_began
    print(f"generated {tuple(generated.shape)} target-greedy tokens in {generation_seconds:.1f}s", flush=True)
    draft_result = train(
        "draft", draft, train_stream, heldout_stream, args, args.draft_steps, args.draft_lr, args.draft_seconds,
        deadline, teacher=target, generated=generated,
    )  # fmt: skip
    draft_result.update(command=command_line(argv), **continued)

    heads_began = time.time()
    heads = {}
    if args.heads:
        names = args.heads.split(",")
        # Each head gets its budget, or its share of what is left before the run's deadline if that is less.
        budget = max(10.0, min(args.head_seconds, (deadline - time.time()) / len(names)))
        heads = train_heads(names, target, train_stream, heldout_stream, generated, args, budget)
        for _, result in heads.values():
            result["command"] = command_line(argv)
    heads_seconds = time.time() - heads_began

    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    save(target, tokenizer, out / "target")
    save(draft, tokenizer, out / "draft")
    for name, (head, _) in heads.items():
        if (out / name).exists():
            shutil.rmtree(out / name)
        head.save(out / name)
    # Measured on the files as saved (float16, read back in fp32), as tools/measure_acceptance.py does;
    # TF32 off so the GPU's fp32 matches a CPU's run of that script.
    torch.backends.cuda.matmul.allow_tf32 = False
    acceptance_began = time.time()
    acceptance, samples = measure_saved(out, ["draft", *heads, "ngram"], root, args)
    acceptance_seconds = time.time() - acceptance_began
    files = sorted(p for sub in ("target", "draft", *heads) for p in (out / sub).iterdir() if p.is_file())
    metadata = {
        "command": command_line(argv),
        "smoke": args.smoke,
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "corpus": {
            "description": "the .py files of a Python standard library (sysconfig's stdlib path, or --stdlib), "
            "its test suite included, excluding path parts "
            + ", ".join(examples.EXCLUDED_PARTS)
            + " and top-level packages "
            + ", ".join(examples.EXCLUDED_TOP_LEVEL)
            + "; files that are not UTF-8 skipped",
            "python_version": args.stdlib_version or (platform.python_version() if args.stdlib is None else "unknown"),
            "stdlib_root": str(root),
            "excluded_parts": list(examples.EXCLUDED_PARTS),
            "excluded_top_level": list(examples.EXCLUDED_TOP_LEVEL),
            "heldout_rule": "a file is held out when its top-level package or module is in heldout_top_level; "
            "files with a path part test_<held-out name>* (their tests) are in neither split",
            "heldout_top_level": list(examples.HELDOUT_TOP_LEVEL),
            "train_files": len(train_files),
            "train_bytes": sum(len(t.encode()) for _, t in train_files),
            "train_tokens": len(train_stream),
            "heldout_files": [name for name, _ in heldout_files],
            "heldout_bytes": sum(len(t.encode()) for _, t in heldout_files),
            "heldout_tokens": len(heldout_stream),
            "extra_train_packages": {
                name: {
                    "files": len(files),
                    "bytes": sum(len(t.encode()) for _, t in files),
                    "fingerprint": examples.corpus_fingerprint(files),
                    "version": installed_version(name),
                    "directory": str(directory),
                }
                for directory, (name, files) in zip(args.extra_corpus, extra_files.items(), strict=True)
            },
            "train_fingerprint": examples.corpus_fingerprint(train_files),
            "heldout_fingerprint": examples.corpus_fingerprint(heldout_files),
            "fingerprint_rule": "sha256 over 'path\\0sha256(text)\\n' of each file, sorted by path",
        },
        "tokenizer": {
            "type": "byte-level BPE (tokenizers)",
            "vocab_size": len(tokenizer),
            "special": SPECIAL,
            "special_id": 0,
            "roles": "bos, eos, pad; prepended to every file and, by the tokenizer's "
            "post-processor, to every encoded prompt",
        },
        "target": {
            "shape": args.target_shape,
            "parameters": sum(p.numel() for p in target.parameters()),
            **target_result,
        },
        "draft": {
            "shape": args.draft_shape,
            "parameters": sum(p.numel() for p in draft.parameters()),
            "objective": "KL(target || draft) over the vocabulary, from the finished target; each batch is half "
            "corpus windows and half target-greedy sequences (random training-window prompts + greedy tokens)",
            "generated": {
                "sequences": args.gen_sequences,
                "prompt_tokens": args.gen_prompt,
                "new_tokens": args.gen_new,
                "seconds": generation_seconds,
            },
            **draft_result,
        },
        "heads": {name: head_metadata(name, head, result) for name, (head, result) in heads.items()},
        "acceptance": acceptance,
        "samples": samples,
        "timing_seconds": {
            "tokenizer_and_encoding": tokenizer_seconds,
            "target_training": target_result["seconds"],
            "target_generation": generation_seconds,
            "draft_training": draft_result["seconds"],
            "heads_training": heads_seconds,
            "acceptance_and_samples": acceptance_seconds,
            "total_before_metadata": time.time() - began,
        },
        "saved_dtype": "float16",
        "versions": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "tokenizers": tokenizers.__version__,
        },
        "device": torch.cuda.get_device_name() if args.device.startswith("cuda") else platform.processor() or "cpu",
        "sha256": {p.relative_to(out).as_posix(): examples.file_sha256(p) for p in files},
        "bytes": {p.relative_to(out).as_posix(): p.stat().st_size for p in files},
    }
    (out / "metadata.json").write_text(json.dumps(metadata, indent=2, default=str) + "\n")  # Paths as str
    print(f"target {metadata['target']['parameters']} params, final {target_result['final']}")
    print(f"draft {metadata['draft']['parameters']} params, final {draft_result['final']}")
    print(f"saved to {out} ({sum(metadata['bytes'].values()) / 1e6:.2f} MB) in {time.time() - began:.1f}s")


if __name__ == "__main__":
    main()
