"""Train the demo target's MTP and EAGLE-3 heads (tools/demo_heads.py) against the finished, frozen target.

Objective, per head: forward KL(target || head) of every draft of every chain, unrolled over `--head-unroll`
drafts ("training-time test": draft j feeds the head's own output for draft j-1), weighted 0.8^j as
SafeAILab's EAGLE-3 does. The target's distribution at the token a draft predicts is the label: greedy
acceptance asks the head to agree with the target's argmax, and the full distribution teaches more per
token than the argmax alone. EAGLE-3's label is the target's distribution restricted to the draft
vocabulary (the most frequent target tokens of the training stream, its d2t map). Batches mix corpus
windows and target-greedy sequences half and half, as the draft model's distillation does.

Called by train_demo_pair.py after the pair is trained (its --head-* flags), which saves the heads and
measures their acceptance next to the draft model's.
"""

from __future__ import annotations

import time
from argparse import Namespace

import torch
import torch.nn.functional as F
from demo_heads import (
    Eagle3Head,
    MtpHead,
    Unrolled,
    default_aux_layers,
    eagle3_config,
    frequent_tokens_d2t,
    target_features,
)
from demo_training import StepCap, autocast, lr_at, make_optimizer, windows
from transformers import LlamaConfig, LlamaForCausalLM

LOSS_DECAY = 0.8  # draft j's weight is LOSS_DECAY ** j (SafeAILab EAGLE-3)


def make_heads(target: LlamaForCausalLM, train_stream: torch.Tensor, args: Namespace) -> dict[str, Unrolled]:
    """Fresh MTP and EAGLE-3 heads for `target` (EAGLE-3's draft vocabulary from training-stream counts)."""
    config = target.config
    torch.manual_seed(args.seed + 3)
    mtp = MtpHead(config)
    counts = torch.bincount(train_stream.cpu(), minlength=config.vocab_size)
    d2t = frequent_tokens_d2t(counts, min(args.eagle3_draft_vocab, config.vocab_size))
    torch.manual_seed(args.seed + 4)
    eagle3 = Eagle3Head(eagle3_config(config), config.hidden_size, parse_layers(args, config), d2t)
    heads = {"mtp": mtp, "eagle3": eagle3}
    for head in heads.values():
        init_like_target(head, config.initializer_range)
    # EAGLE-3's own lm_head starts as the target's rows for its draft vocabulary, so it begins by reading
    # its hidden state the way the target does (CPU check on the previous 5.5M demo target, 100 steps of
    # 4 x 256 tokens: held-out draft-1 agreement 0.19 from a random lm_head, 0.24 from these rows).
    with torch.no_grad():
        eagle3.lm_head.weight.copy_(target.lm_head.weight[torch.arange(len(d2t)) + d2t].cpu())
    # The target's embedding and lm_head are shared and frozen; the heads own everything else.
    return {name: head.to(args.device) for name, head in heads.items()}


def parse_layers(args: Namespace, config: LlamaConfig) -> list[int]:
    if args.eagle3_layers:
        return [int(x) for x in args.eagle3_layers.split(",")]
    return default_aux_layers(config.num_hidden_layers)


def init_like_target(head: torch.nn.Module, std: float) -> None:
    """Llama's init: normal(0, initializer_range) matrices, unit norms (transformers' _init_weights)."""
    for module in head.modules():
        if isinstance(module, torch.nn.Linear):
            torch.nn.init.normal_(module.weight, std=std)


def head_loss(
    head: Unrolled, target: LlamaForCausalLM, tokens: torch.Tensor, drafts: int, device: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """(weighted KL summed over drafts, per-draft teacher-forced top-1 agreement with the target's argmax
    over its whole vocabulary, the head's draft mapped to a target id)."""
    with torch.no_grad(), autocast(device):
        features, target_logits = target_features(target, tokens, head)
    target_logp = F.log_softmax(target_logits.float(), dim=-1)  # [B, T, V]
    target_argmax = target_logp.argmax(-1)  # [B, T]
    if isinstance(head, Eagle3Head):  # the label restricted to the draft vocabulary, renormalized
        draft_ids = torch.arange(len(head.d2t), device=tokens.device) + head.d2t
        target_logp = F.log_softmax(target_logp[..., draft_ids], dim=-1)
    with autocast(device):
        all_logits = head.unroll(target, tokens, features, drafts)
    length = tokens.shape[1] - 1
    total, agreement = 0.0, []
    for draft, logits in enumerate(all_logits):
        valid = length - 1 - draft  # pairs s with s + 2 + draft <= T - 1
        # Draft j at pair s predicts token s + 2 + j, whose target distribution sits at position s + 1 + j.
        label = target_logp[:, 1 + draft : 1 + draft + valid]
        logp = F.log_softmax(logits[:, :valid].float(), dim=-1)
        kl = F.kl_div(logp.flatten(0, 1), label.flatten(0, 1), log_target=True, reduction="batchmean")
        total = total + (LOSS_DECAY**draft) * kl
        drafted = head.to_target_ids(logp.argmax(-1).detach())
        agreement.append((drafted == target_argmax[:, 1 + draft : 1 + draft + valid]).float().mean())
    return total, torch.stack(agreement)


def train_head(
    name: str,
    head: Unrolled,
    target: LlamaForCausalLM,
    stream: torch.Tensor,
    heldout: torch.Tensor,
    generated: torch.Tensor | None,
    args: Namespace,
    budget: float,
) -> dict:
    """AdamW with warmup + cosine; the step count is capped to fit `budget` seconds (see train_demo_pair)."""
    generator = torch.Generator(device="cpu").manual_seed(args.seed + 5)
    optimizer = make_optimizer(head, args.head_lr, args.device)
    rows = max(1, args.head_batch_size // 2) if generated is not None else args.head_batch_size
    generated_rows = 0 if generated is None else max(1, rows * args.seq_len // (generated.shape[1] - 1))
    cap = StepCap(args.head_steps, budget)
    head.train()
    log, step = [], 0
    while step < cap.steps:
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, cap.steps, args.head_lr)
        starts = torch.randint(0, len(stream) - args.seq_len - 1, (rows,), generator=generator)
        inputs, _ = windows(stream, starts.to(stream.device), args.seq_len)
        loss, agree = head_loss(head, target, inputs, args.head_unroll, args.device)
        if generated is not None:
            pick = torch.randint(0, generated.shape[0], (generated_rows,), generator=generator)
            generated_loss, _ = head_loss(
                head, target, generated[pick.to(generated.device)], args.head_unroll, args.device
            )
            loss = 0.5 * (loss + generated_loss)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(head.parameters(), 1.0)
        optimizer.step()
        step += 1
        cap.after_step(step)
        if step % args.eval_every == 0 or step == cap.steps:
            entry = {"step": step, "train_loss": loss.item(), "seconds": cap.elapsed()}
            entry["train_top1_agreement_by_draft"] = [round(x, 4) for x in agree.tolist()]
            entry["heldout_top1_agreement_by_draft"] = evaluate_head(head, target, heldout, args)
            log.append(entry)
            print(f"[{name}] {entry}", flush=True)
    head.eval().requires_grad_(False)
    return {
        "steps_requested": args.head_steps,
        "steps_done": step,
        "steps_capped_by_budget": cap.capped,
        "budget_seconds": budget,
        "seconds": cap.elapsed(),
        "peak_lr": args.head_lr,
        "unroll": args.head_unroll,
        "loss_decay": LOSS_DECAY,
        "batch": {"corpus_rows": rows, "corpus_seq_len": args.seq_len, "generated_rows": generated_rows},
        "parameters": sum(p.numel() for p in head.parameters()),
        "log": log,
        "final": log[-1] if log else None,
    }


@torch.no_grad()
def evaluate_head(head: Unrolled, target: LlamaForCausalLM, stream: torch.Tensor, args: Namespace) -> list[float]:
    """Teacher-forced top-1 agreement with the target per chain draft on held-out windows."""
    head.eval()
    count = min((len(stream) - 1) // args.seq_len, 64)
    starts = torch.arange(count, device=stream.device) * args.seq_len
    total = torch.zeros(args.head_unroll, device=stream.device)
    batches = 0
    for batch in starts.split(args.head_batch_size):
        inputs, _ = windows(stream, batch, args.seq_len)
        _, agree = head_loss(head, target, inputs, args.head_unroll, args.device)
        total += agree
        batches += 1
    head.train()
    return [round(x, 4) for x in (total / max(1, batches)).tolist()]


def train_heads(
    names: list[str],
    target: LlamaForCausalLM,
    train_stream: torch.Tensor,
    heldout_stream: torch.Tensor,
    generated: torch.Tensor | None,
    args: Namespace,
    budget: float,
) -> dict[str, tuple[Unrolled, dict]]:
    """The heads `names` (of mtp, eagle3), trained one after the other, `budget` seconds each:
    {name: (head, result)}."""
    began = time.time()
    heads = make_heads(target, train_stream, args)
    results = {}
    for name in names:
        head = heads[name]
        result = train_head(name, head, target, train_stream, heldout_stream, generated, args, budget)
        results[name] = (head, result)
    print(f"heads trained in {time.time() - began:.1f}s", flush=True)
    return results
