"""Train a DFlash drafter (tools/demo_dflash.py, z-lab layout) for the frozen demo target, on CPU, in minutes.

Recipe (z-lab / SpecForge DFlash): windows of tokens, the target's layer outputs computed once per
window with no grad (hidden_states[i + 1] for i in target_layer_ids), several random anchors a per
window; the block at a..a+K is [x_a, MASK x K] and sees the context rows of positions < a (graphspec's
convention, tests/tools/test_demo_dflash.py). Loss: KL(target || drafter) at each mask slot j against
the target's distribution for token a + j (its logits at position a + j - 1), weighted LOSS_DECAY ** (j - 1).
With --gen-sequences, batches mix corpus windows and target-greedy sequences half and half, as the
draft model's distillation does; the default is corpus windows only (generating on 2 CPU threads costs
minutes of the budget: the shipped drafter was trained without).

Corpus: the train split of a Python standard library (graphspec/examples: held-out files never enter
training; they are only evaluated on). A seeded subset of train files (--corpus-mb) is tokenized: a
few minutes of CPU training reads far fewer tokens than the whole library holds.

    # writes graphspec/examples/demo_pair/dflash (the shipped drafter: this machine's CPython 3.11.7 stdlib)
    PYTHONPATH=. python3 tools/train_demo_dflash.py --threads 2 --seconds 660 \\
        --stdlib /root/.pyenv/versions/3.11.7/lib/python3.11
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM, AutoTokenizer

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tools"))

from demo_dflash import DFlashDrafter, drafter_config, target_features, zlab_target_layer_ids  # noqa: E402
from demo_training import make_optimizer, record_files, windows  # noqa: E402
from measure_acceptance import load_examples_module  # noqa: E402

LOSS_DECAY = 0.8  # mask slot j's weight is LOSS_DECAY ** (j - 1), as the other demo heads weight drafts
MASK_TOKEN = "<|endoftext|>"  # the tokenizer's only special token (id 0): it starts every file, nothing else


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    examples = load_examples_module()
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", type=Path, default=examples.DEMO_TARGET)
    parser.add_argument("--out", type=Path, default=examples.DEMO_PAIR_DIR / "dflash")
    parser.add_argument("--stdlib", type=Path, default=None, help="stdlib root (default: this interpreter's)")
    parser.add_argument("--layers", type=int, default=1, help="drafter decoder layers")
    parser.add_argument("--block-size", type=int, default=5, help="last token + K mask slots")
    parser.add_argument("--target-layer-ids", default=None, help="comma-separated (default: z-lab's spread of 3)")
    parser.add_argument("--corpus-mb", type=float, default=4.0, help="MB of train files tokenized")
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=4, help="windows per step (half generated when any)")
    parser.add_argument("--anchors", type=int, default=32, help="random anchors per window")
    parser.add_argument("--gen-sequences", type=int, default=0, help="target-greedy sequences mixed in (0: none)")
    parser.add_argument("--gen-prompt", type=int, default=64)
    parser.add_argument("--gen-batch", type=int, default=32, help="sequences per generate call (a GPU takes 256)")
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--steps", type=int, default=20000, help="at most; the run ends by --seconds")
    parser.add_argument("--seconds", type=float, default=600.0, help="training budget; the run stops by then")
    parser.add_argument("--eval-windows", type=int, default=8)
    parser.add_argument("--eval-every", type=int, default=100)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", default="cpu", help="cuda trains in fp32 with TF32 matmuls")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--metadata", type=Path, default=None,
        help="a demo pair's metadata.json: record the run under 'dflash' and the saved files' sha256 and bytes",
    )  # fmt: skip
    args = parser.parse_args(argv)
    if args.block_size < 2:
        parser.error(f"--block-size {args.block_size}: a block needs the last token and at least one mask slot")
    if args.layers < 1:
        parser.error("--layers must be at least 1")
    if args.seq_len < args.block_size + 2 or args.anchors < 1 or args.batch_size < 1 or args.gen_batch < 1:
        parser.error("--seq-len must exceed --block-size + 1; --anchors, --batch-size, --gen-batch must be positive")
    if args.target_layer_ids:
        layers = json.loads((args.target / "config.json").read_text())["num_hidden_layers"]
        ids = [int(x) for x in args.target_layer_ids.split(",")]
        bad = [i for i in ids if not 0 <= i < layers]
        if bad or len(set(ids)) != len(ids):
            parser.error(
                f"--target-layer-ids {ids}: {bad or 'a repeated layer'} (the target's layers are 0..{layers - 1})"
            )
    return args


def token_stream(tokenizer, texts: list[str]) -> torch.Tensor:
    """All files as one stream, each preceded by <|endoftext|> (id 0), as train_demo_pair.py builds it."""
    ids: list[int] = []
    for item in tokenizer.backend_tokenizer.encode_batch(texts, add_special_tokens=False):
        ids.append(0)
        ids.extend(item.ids)
    return torch.tensor(ids, dtype=torch.int64)


def corpus(examples, tokenizer, args) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """(train stream from a seeded subset of train files, held-out stream, what was read)."""
    train = examples.stdlib_files("train", args.stdlib)
    random.Random(args.seed).shuffle(train)
    chosen, size = [], 0
    for name, text in train:
        if size >= args.corpus_mb * 1e6:
            break
        chosen.append((name, text))
        size += len(text.encode())
    heldout = examples.stdlib_files("heldout", args.stdlib)
    train_stream = token_stream(tokenizer, [text for _, text in chosen])
    heldout_stream = token_stream(tokenizer, [text for _, text in heldout])
    info = {
        "stdlib": str(args.stdlib or examples.stdlib_root()),
        "train_files_used": len(chosen),
        "train_files_available": len(train),
        "train_tokens": len(train_stream),
        "heldout_files": len(heldout),
        "heldout_tokens": len(heldout_stream),
        "train_fingerprint": examples.corpus_fingerprint(sorted(chosen)),
    }
    return train_stream, heldout_stream, info


@torch.no_grad()
def generate(target, stream: torch.Tensor, args, generator: torch.Generator) -> torch.Tensor | None:
    """Target-greedy sequences of seq_len + 1 tokens: a random train window of --gen-prompt tokens, then
    the target's greedy tokens."""
    if args.gen_sequences == 0:
        return None
    out = []
    for first in range(0, args.gen_sequences, args.gen_batch):
        rows = min(args.gen_batch, args.gen_sequences - first)
        starts = torch.randint(0, len(stream) - args.gen_prompt, (rows,), generator=generator).to(stream.device)
        prompts = stream[starts[:, None] + torch.arange(args.gen_prompt, device=stream.device)]
        new = args.seq_len + 1 - args.gen_prompt
        tokens = target.generate(
            prompts, attention_mask=torch.ones_like(prompts), max_new_tokens=new, min_new_tokens=new,
            do_sample=False, pad_token_id=0,
        )  # fmt: skip
        out.append(tokens[:, : args.seq_len + 1])
    return torch.cat(out)


def dflash_loss(drafter, target, tokens: torch.Tensor, anchors: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(KL summed over mask slots with decaying weights, per-slot top-1 agreement with the target's
    argmax) for the blocks at anchors [B, N] of windows tokens [B, T]."""
    features, last = target_features(target, tokens, drafter.target_layer_ids)
    k = drafter.block_size - 1
    # Slot j (1..K) of anchor a predicts token a + j: the target's logits at position a + j - 1.
    label_positions = anchors[:, :, None] + torch.arange(k, device=tokens.device)  # [B, N, K]
    with torch.no_grad():
        rows = last.gather(1, label_positions.flatten(1)[..., None].expand(-1, -1, last.shape[-1]))
        target_logp = F.log_softmax(target.lm_head(rows).float(), dim=-1).view(*label_positions.shape, -1)
    logp = F.log_softmax(drafter(target, features, tokens, anchors).float(), dim=-1)  # [B, N, K, V]
    total, agreement = 0.0, []
    for slot in range(k):
        kl = F.kl_div(logp[:, :, slot].flatten(0, 1), target_logp[:, :, slot].flatten(0, 1), log_target=True,
                      reduction="batchmean")  # fmt: skip
        total = total + (LOSS_DECAY**slot) * kl
        agreement.append((logp[:, :, slot].argmax(-1) == target_logp[:, :, slot].argmax(-1)).float().mean())
    return total, torch.stack(agreement)


def random_anchors(batch: int, args, generator: torch.Generator) -> torch.Tensor:
    """[B, N] anchors in 1 .. T - K (the label of the last slot, position a + K - 1, lies in the window)."""
    high = args.seq_len - (args.block_size - 1)
    return torch.randint(1, high + 1, (batch, args.anchors), generator=generator)


@torch.no_grad()
def evaluate(drafter, target, stream: torch.Tensor, args) -> list[float]:
    """Per-slot top-1 agreement with the target on held-out windows, every anchor of each window."""
    drafter.eval()
    starts = torch.arange(args.eval_windows, device=stream.device) * (
        (len(stream) - args.seq_len - 1) // args.eval_windows
    )
    tokens, _ = windows(stream, starts, args.seq_len)
    anchors = torch.arange(1, args.seq_len - args.block_size + 2, 4, device=stream.device).expand(len(starts), -1)
    total = torch.zeros(args.block_size - 1)
    for batch in range(0, len(starts), 4):
        _, agree = dflash_loss(drafter, target, tokens[batch : batch + 4], anchors[batch : batch + 4])
        total += agree.cpu() * len(tokens[batch : batch + 4])
    drafter.train()
    return [round(x, 4) for x in (total / len(starts)).tolist()]


WARMUP = 50  # steps of linear LR warmup


def lr_at(step: int, progress: float, peak: float) -> float:
    """Linear warmup, then cosine decay to 10% of peak over `progress` (0..1). Progress is the larger of
    the step and the time fractions: on a shared CPU the step rate drifts, and a time-based schedule
    still completes its decay by the deadline (demo_training's StepCap fixes the step count after a
    probe, which a busier machine later overruns)."""
    if step < WARMUP:
        return peak * (step + 1) / WARMUP
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


def train(drafter, target, stream, heldout, generated, args, began: float) -> dict:
    generator = torch.Generator().manual_seed(args.seed + 1)
    optimizer = make_optimizer(drafter, args.lr, args.device)
    corpus_rows = args.batch_size if generated is None else max(1, args.batch_size // 2)
    generated_rows = args.batch_size - corpus_rows
    started = time.time()
    # What tokenizing and generation left, less a tenth kept for evaluations and saving.
    budget = 0.9 * (args.seconds - (started - began))
    log, step, progress = [], 0, 0.0
    drafter.train()
    while step < args.steps and progress < 1.0:
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, progress, args.lr)
        starts = torch.randint(0, len(stream) - args.seq_len - 1, (corpus_rows,), generator=generator)
        tokens, _ = windows(stream, starts.to(stream.device), args.seq_len)
        if generated_rows:
            pick = torch.randint(0, generated.shape[0], (generated_rows,), generator=generator)
            tokens = torch.cat((tokens, generated[pick.to(generated.device), : args.seq_len]))
        anchors = random_anchors(len(tokens), args, generator).to(tokens.device)
        loss, agree = dflash_loss(drafter, target, tokens, anchors)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(drafter.parameters(), 1.0)
        optimizer.step()
        step += 1
        progress = max(step / args.steps, (time.time() - started) / budget)
        last = step == args.steps or progress >= 1.0
        if step % args.eval_every == 0 or last:
            entry = {"step": step, "train_loss": round(loss.item(), 4), "seconds": round(time.time() - started, 1)}
            entry["train_top1_agreement_by_slot"] = [round(x, 4) for x in agree.tolist()]
            entry["heldout_top1_agreement_by_slot"] = evaluate(drafter, target, heldout, args)
            log.append(entry)
            print(entry, flush=True)
    drafter.eval().requires_grad_(False)
    return {
        "steps_requested": args.steps,
        "steps_done": step,
        "stopped_by_budget": step < args.steps,
        "budget_seconds": round(budget, 1),
        "seconds": round(time.time() - started, 1),
        "batch": {"corpus_rows": corpus_rows, "generated_rows": generated_rows, "seq_len": args.seq_len},
        "log": log,
        "final": log[-1] if log else None,
    }


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    began = time.time()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    examples = load_examples_module()
    torch.backends.cuda.matmul.allow_tf32 = True
    target = AutoModelForCausalLM.from_pretrained(args.target, dtype=torch.float32).eval().requires_grad_(False)
    target.to(args.device)
    tokenizer = AutoTokenizer.from_pretrained(args.target)
    mask = tokenizer.convert_tokens_to_ids(MASK_TOKEN)
    layers = target.config.num_hidden_layers
    ids = [int(x) for x in args.target_layer_ids.split(",")] if args.target_layer_ids else None
    ids = ids or zlab_target_layer_ids(layers, 3)  # checked against the target in parse_args
    stream, heldout, corpus_info = corpus(examples, tokenizer, args)
    stream, heldout = stream.to(args.device), heldout.to(args.device)
    print(f"corpus {corpus_info} ({time.time() - began:.1f}s)", flush=True)
    generator = torch.Generator().manual_seed(args.seed + 2)
    generated = generate(target, stream, args, generator)
    generated_seconds = time.time() - began
    print(f"generated {0 if generated is None else len(generated)} target-greedy sequences ({generated_seconds:.1f}s)")
    drafter = DFlashDrafter(drafter_config(target, args.layers, args.block_size, ids, mask))
    for module in drafter.modules():  # Llama's init for matrices (transformers' _init_weights); norms stay 1
        if isinstance(module, torch.nn.Linear):
            torch.nn.init.normal_(module.weight, std=target.config.initializer_range)
    drafter.to(args.device)
    result = train(drafter, target, stream, heldout, generated, args, began)
    drafter.save(args.out)
    summary = {
        "command": "python3 tools/train_demo_dflash.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "mask_token": {"token": MASK_TOKEN, "id": mask},
        "target_layer_ids": ids,
        "block_size": args.block_size,
        "layers": args.layers,
        "parameters": sum(p.numel() for p in drafter.parameters()),
        "objective": f"KL(target || drafter) per mask slot, weight {LOSS_DECAY}^(j-1)",
        "generated_sequences": 0 if generated is None else len(generated),
        "corpus": corpus_info,
        "threads": args.threads,
        "device": args.device,
        "peak_lr": args.lr,
        "anchors_per_window": args.anchors,
        "generation_seconds": round(generated_seconds, 1),
        "training": result,
        "total_seconds": round(time.time() - began, 1),
        "saved_dtype": "float16",
    }
    print(json.dumps({k: v for k, v in summary.items() if k != "training"}, indent=2))
    print(f"saved {args.out} in {summary['total_seconds']}s")
    if args.metadata:
        record(args.metadata, args.out, summary, examples)
    return summary


def record(metadata_path: Path, out: Path, summary: dict, examples) -> None:
    """The run and the saved files' sha256 and sizes into a demo pair's metadata.json (the pair's
    test checks every shipped file against it)."""
    metadata = json.loads(metadata_path.read_text())
    pair = metadata_path.resolve().parent
    metadata["dflash"] = summary
    part = Path(out).resolve().relative_to(pair).as_posix()  # out must lie in the pair's directory
    record_files(metadata, pair, part, examples.file_sha256)
    metadata_path.write_text(json.dumps(metadata, indent=2) + "\n")


if __name__ == "__main__":
    main()
