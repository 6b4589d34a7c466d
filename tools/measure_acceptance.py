"""Measure greedy chain-drafting acceptance of a target/draft pair, without the graphspec runtime.

For greedy decoding the outcome of a speculation step is fixed by the two models alone: from the
committed prefix, the draft proposes its K greedy tokens d1..dK; the target's greedy continuation of
the same prefix is t1..tK+1; the step accepts n = the number of leading i with d_i == t_i (0..K) and
commits n + 1 tokens (the accepted drafts plus the target's token after them). This script computes
the target's greedy continuation of each prompt once, then replays the steps: committed length c,
draft chain from prompt + continuation[:c], n = leading matches against continuation[c:c+K],
c += n + 1, until c reaches --new-tokens (or the target's EOS). The same replay measures every drafter
(--drafters): the draft model, the demo target's MTP and EAGLE-3 heads (tools/demo_heads.py, one
teacher-forced unroll per sequence gives every chain, exact while the chain's earlier drafts match), the
DFlash drafter (tools/demo_dflash.py: one masked pass per sequence gives the block of every committed
length; tests/tools/test_demo_dflash.py checks it equal to graphspec's DFlash drafter on the same
weights) and n-gram prompt lookup (graphspec's rule, ngram 1..3; fewer than K proposals never accept filler).

Reported: mean accepted drafts per step (0..K, the issue's "accepted length"), mean tokens per step
(accepted + 1), the acceptance rate at each draft position (fraction of steps with n >= i), the
histogram of n, and the mean over the steps outside loops (a step whose first target token completes
a 4-gram already in the text is in a loop, where any drafter that reads the context does well).
Prompts are --prompt-tokens tokens from held-out stdlib files (the split recorded in
graphspec/examples), starting at a line chosen from a hash of the file path, so runs are repeatable.

    PYTHONPATH=. python3 tools/measure_acceptance.py                      # the shipped demo pair
    PYTHONPATH=. python3 tools/measure_acceptance.py --target T --draft D --prompts 20 --new-tokens 128 -k 4
    PYTHONPATH=. python3 tools/measure_acceptance.py --drafters draft,mtp,eagle3,dflash,ngram   # every demo drafter
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import inspect
import json
import platform
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tools"))  # demo_heads, when loaded by file path


def load_examples_module():
    """graphspec/examples/__init__.py by file path (standard library only; see train_demo_pair.py)."""
    spec = importlib.util.spec_from_file_location("graphspec_examples", REPO / "graphspec" / "examples" / "__init__.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(spec.name, module)
    spec.loader.exec_module(module)
    return sys.modules[spec.name]


@dataclass
class Result:
    k: int
    prompts: int
    steps: int
    mean_accepted: float  # accepted draft tokens per step, 0..K
    mean_tokens_per_step: float  # accepted + 1
    position_acceptance: list[float]  # fraction of steps with n >= i, i = 1..K
    histogram: list[int]  # steps with n == 0..K
    per_prompt_mean_accepted: list[float]
    distinct_4gram_ratio: float  # mean over prompts of distinct/total 4-grams in the target's continuation
    sources: list[str]
    # The steps outside loops (in_loop): how many, and their mean accepted drafts. Inside a loop any drafter
    # that reads the context predicts well, so this is the fairer number between targets that loop unequally.
    steps_outside_loops: int
    mean_accepted_outside_loops: float


def heldout_prompts(tokenizer, count: int, length: int, stdlib: Path | None = None) -> list[tuple[str, list[int]]]:
    """`count` prompts of `length` tokens from held-out files, spread evenly over the sorted file list."""
    examples = load_examples_module()
    eligible = []
    for name, text in examples.stdlib_files("heldout", stdlib):
        lines = text.splitlines(keepends=True)
        # Start at a line picked by a hash of the path, in the first 3/4 of the file, when enough follows.
        seed = int(hashlib.sha256(name.encode()).hexdigest(), 16)
        for first in (seed % max(1, (3 * len(lines)) // 4), 0):
            # Only a bounded slice of text is encoded; the margin keeps its cut end out of the prompt.
            text = "".join(lines[first:])[: 64 * length]
            ids = tokenizer.backend_tokenizer.encode(text, add_special_tokens=False).ids
            if len(ids) >= length + 16:
                eligible.append((f"{name}:{first + 1}", ids[:length]))
                break
    if len(eligible) < count:
        raise SystemExit(f"only {len(eligible)} held-out files have {length} tokens; asked for {count} prompts")
    return [eligible[(i * len(eligible)) // count] for i in range(count)]


def kv_cache(out) -> object:
    """A transformers forward's KV cache: the output's `cache` from transformers 5.24 on (`past_key_values`
    is deprecated there and goes in 5.40), `past_key_values` before."""
    return out["cache"] if "cache" in out else out["past_key_values"]


def cache_argument(model) -> str:
    """The name `model`'s forward takes the KV cache by: `cache` from transformers 5.24 on, `past_key_values`
    before (read once per loop: inspecting the signature costs more than a tiny model's decode step)."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


@torch.no_grad()
def greedy(model, ids: list[int], count: int) -> list[int]:
    """`count` greedy tokens after `ids` (no stopping at EOS), with the model's KV cache."""
    device = model.device
    out = model(input_ids=torch.tensor([ids], device=device), use_cache=True)
    tokens = [int(out.logits[0, -1].argmax())]
    cache = cache_argument(model)
    for _ in range(count - 1):
        out = model(input_ids=torch.tensor([[tokens[-1]]], device=device), **{cache: kv_cache(out)})
        tokens.append(int(out.logits[0, -1].argmax()))
    return tokens


class DraftModel:
    """A draft model's chain: its K greedy tokens after the committed prefix."""

    name = "draft model"

    def __init__(self, model) -> None:
        self.model = model

    def proposer(self, full: list[int], k: int) -> Callable[[int], list[int]]:
        return lambda length: greedy(self.model, full[:length], k)


class NGram:
    """Prompt lookup, graphspec's n-gram drafter's rule (graphspec/drafters/ngram.py): the longest suffix
    n-gram (ngram_max down to ngram_min) at its earliest earlier occurrence in the committed text, and the
    up to K committed tokens that followed it (fewer when the text ends first; none without a match)."""

    name = "n-gram"

    def __init__(self, ngram_min: int = 1, ngram_max: int = 3) -> None:
        self.ngram_min, self.ngram_max = ngram_min, ngram_max

    def proposer(self, full: list[int], k: int) -> Callable[[int], list[int]]:
        def propose(length: int) -> list[int]:
            for n in range(self.ngram_max, self.ngram_min - 1, -1):
                if n > length:
                    continue
                suffix = full[length - n : length]
                for start in range(length - n):  # start + n < length: something committed follows
                    if full[start : start + n] == suffix:
                        return full[start + n : min(start + n + k, length)]
            return []

        return propose


class Head:
    """An MTP or EAGLE-3 head (tools/demo_heads.py) over the target's features. Every chain of a sequence
    comes from one teacher-forced unroll (see demo_heads): the step at committed length L reads the pair
    at s = L - 2 (token L - 1, the target's feature at L - 2) and proposes tokens L .. L + K - 1."""

    def __init__(self, name: str, target, head) -> None:
        self.name, self.target, self.head = name, target, head

    @torch.no_grad()
    def proposer(self, full: list[int], k: int) -> Callable[[int], list[int]]:
        from demo_heads import target_features

        tokens = torch.tensor([full], device=self.target.device)
        features, _ = target_features(self.target, tokens, self.head)
        logits = self.head.unroll(self.target, tokens, features, k)
        drafts = torch.stack([self.head.to_target_ids(x[0].argmax(-1)) for x in logits]).T.tolist()  # [T-1, K]
        return lambda length: drafts[length - 2]


class DFlashReplay:
    """A DFlash drafter (tools/demo_dflash.py) over the target's features. The step at committed length L
    drafts the block at anchor L - 1 (context rows 0..L-2, block [x_{L-1}, MASK x K]); its K drafts do
    not depend on earlier drafts, so one pass over the sequence with every anchor gives every step's."""

    name = "DFlash"

    def __init__(self, target, drafter) -> None:
        self.target, self.drafter = target, drafter

    @torch.no_grad()
    def proposer(self, full: list[int], k: int) -> Callable[[int], list[int]]:
        from demo_dflash import target_features

        block = self.drafter.block_size
        if k > block - 1:
            raise SystemExit(f"the DFlash drafter's block_size {block} drafts at most {block - 1} tokens, not k={k}")
        tokens = torch.tensor([full], device=self.target.device)
        features, _ = target_features(self.target, tokens, self.drafter.target_layer_ids)
        anchors = torch.arange(1, len(full), device=tokens.device)[None]
        # A k below block_size - 1 drafts from the shorter block [x, MASK x k], as the runtime does.
        drafts = self.drafter(self.target, features, tokens, anchors, block=k + 1)[0].argmax(-1).tolist()  # [T-1, K]
        return lambda length: drafts[length - 2]


def replay(propose: Callable[[int], list[int]], full: list[int], prompt_length: int, length: int, k: int) -> list[int]:
    """Accepted counts of the greedy steps over the target's continuation full[prompt_length:] (of
    `length` committed tokens): n = leading proposals equal to the target's tokens, commit n + 1."""
    accepted, committed = [], 0
    while committed < length:
        at = prompt_length + committed
        proposal = propose(at)[:k]
        n = 0
        while n < len(proposal) and proposal[n] == full[at + n]:
            n += 1
        accepted.append(n)
        committed += n + 1
    return accepted


# (id of the target, prompt) -> its longest greedy continuation so far: drafters measured one after the
# other on the same prompts share one target run.
CONTINUATIONS: dict[tuple[int, tuple[int, ...]], list[int]] = {}


def continuation(target, prompt: list[int], k: int, new_tokens: int, eos: set[int]) -> tuple[list[int], int]:
    """The target's greedy continuation (new_tokens + k tokens, so every step can be checked) and how
    many of them generation commits (up to and including the first EOS)."""
    key = (id(target), tuple(prompt))
    if len(CONTINUATIONS.get(key, ())) < new_tokens + k:  # a shorter greedy run is a prefix of a longer one
        CONTINUATIONS[key] = greedy(target, prompt, new_tokens + k)
    tokens = CONTINUATIONS[key][: new_tokens + k]
    for index, token in enumerate(tokens[:new_tokens]):
        if token in eos:  # generation stops once EOS is committed
            return tokens, index + 1
    return tokens, new_tokens


def in_loop(full: list[int], at: int) -> bool:
    """Whether full[at] completes a 4-gram that already occurred in full[:at] (the step starting there
    continues a loop of the text so far)."""
    if at < 3:
        return False
    gram = tuple(full[at - 3 : at + 1])
    return any(tuple(full[i - 3 : i + 1]) == gram for i in range(3, at))


def simulate(
    target, draft, prompt: list[int], k: int, new_tokens: int, eos: set[int]
) -> tuple[list[int], float, list[int]]:
    """Accepted count of every speculation step while greedily generating `new_tokens` from `prompt`,
    the distinct-4-gram ratio of the target's continuation (low when greedy decoding loops), and the
    accepted counts of the steps outside loops (in_loop)."""
    drafter = draft if hasattr(draft, "proposer") else DraftModel(draft)
    tokens, length = continuation(target, prompt, k, new_tokens, eos)
    full = prompt + tokens
    accepted = replay(drafter.proposer(full, k), full, len(prompt), length, k)
    grams = [tuple(tokens[i : i + 4]) for i in range(max(1, length - 3))]
    outside, at = [], len(prompt)
    for n in accepted:
        if not in_loop(full, at):
            outside.append(n)
        at += n + 1
    return accepted, len(set(grams)) / len(grams), outside


def measure(target, draft, prompts: list[tuple[str, list[int]]], k: int, new_tokens: int, eos: set[int]) -> Result:
    """`draft`: a draft model, or a drafter of this module (DraftModel, NGram, Head)."""
    runs = [simulate(target, draft, ids, k, new_tokens, eos) for _, ids in prompts]
    per_prompt = [accepted for accepted, _, _ in runs]
    steps = [n for run in per_prompt for n in run]
    outside = [n for _, _, run in runs for n in run]
    return Result(
        k=k,
        prompts=len(prompts),
        steps=len(steps),
        mean_accepted=sum(steps) / len(steps),
        mean_tokens_per_step=sum(steps) / len(steps) + 1,
        position_acceptance=[sum(n >= i for n in steps) / len(steps) for i in range(1, k + 1)],
        histogram=[sum(n == i for n in steps) for i in range(k + 1)],
        per_prompt_mean_accepted=[sum(run) / len(run) for run in per_prompt],
        distinct_4gram_ratio=sum(ratio for _, ratio, _ in runs) / len(runs),
        sources=[name for name, _ in prompts],
        steps_outside_loops=len(outside),
        mean_accepted_outside_loops=sum(outside) / len(outside) if outside else 0.0,
    )


def load_pair(target_dir: Path, draft_dir: Path, device: str):
    target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).to(device).eval()
    draft = AutoModelForCausalLM.from_pretrained(draft_dir, dtype=torch.float32).to(device).eval()
    tokenizer = AutoTokenizer.from_pretrained(target_dir)
    eos = target.generation_config.eos_token_id
    eos = set(eos if isinstance(eos, list) else [eos]) if eos is not None else set()
    return target, draft, tokenizer, eos


def load_drafters(names: list[str], target, draft, heads_dir: Path, device: str) -> dict[str, object]:
    """name -> drafter for `names` among draft, mtp, eagle3, dflash, ngram (heads from heads_dir/mtp,
    /eagle3, /dflash)."""
    from demo_dflash import DFlashDrafter
    from demo_heads import Eagle3Head, MtpHead

    made = {}
    for name in names:
        if name == "draft":
            made[name] = DraftModel(draft)
        elif name == "ngram":
            made[name] = NGram()
        elif name in ("mtp", "eagle3"):
            kind = MtpHead if name == "mtp" else Eagle3Head
            made[name] = Head(name, target, kind.load(heads_dir / name).to(device).eval())
        elif name == "dflash":
            made[name] = DFlashReplay(target, DFlashDrafter.load(heads_dir / name).to(device))
        else:
            raise SystemExit(f"unknown drafter {name!r}; choose from draft, mtp, eagle3, dflash, ngram")
    return made


def report(name: str, result: Result, prompts, args) -> None:
    print(f"\n== {name}: K={args.k}, {args.new_tokens} new tokens per prompt")
    for (source, _), mean in zip(prompts, result.per_prompt_mean_accepted, strict=True):
        print(f"  {source:48s} mean accepted {mean:.2f}")
    print(f"speculation steps: {result.steps}")
    print(f"histogram of accepted drafts n=0..{args.k}: {result.histogram}")
    print(
        "acceptance by draft position (steps with n >= i): "
        + ", ".join(f"{i + 1}: {rate:.3f}" for i, rate in enumerate(result.position_acceptance))
    )
    print(f"mean accepted draft tokens per step (0..{args.k}): {result.mean_accepted:.3f}")
    print(f"mean tokens per step (accepted + 1):          {result.mean_tokens_per_step:.3f}")
    print(f"distinct 4-gram ratio of the target's greedy continuations: {result.distinct_4gram_ratio:.3f}")
    print(
        f"mean accepted outside loops: {result.mean_accepted_outside_loops:.3f} over {result.steps_outside_loops} "
        f"of {result.steps} steps (a step is in a loop when its first target token completes a 4-gram seen before)"
    )


def main(argv: list[str] | None = None) -> dict[str, Result]:
    examples = load_examples_module()
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", type=Path, default=examples.DEMO_TARGET)
    parser.add_argument("--draft", type=Path, default=examples.DEMO_DRAFT)
    parser.add_argument("--heads", type=Path, default=examples.DEMO_PAIR_DIR, help="dir holding mtp/, eagle3/, dflash/")
    parser.add_argument("--drafters", default="draft", help="comma-separated: draft, mtp, eagle3, dflash, ngram")
    parser.add_argument("-k", type=int, default=4, help="draft tokens per step")
    parser.add_argument("--prompts", type=int, default=20)
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--stdlib", type=Path, default=None, help="stdlib root (default: this interpreter's)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    parser.add_argument(
        "--metadata", type=Path, default=None,
        help="a demo pair's metadata.json: store each drafter's result under acceptance.by_new_tokens[N]",
    )  # fmt: skip
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)

    began = time.time()
    target, draft, tokenizer, eos = load_pair(args.target, args.draft, args.device)
    drafters = load_drafters(args.drafters.split(","), target, draft, args.heads, args.device)
    prompts = heldout_prompts(tokenizer, args.prompts, args.prompt_tokens, args.stdlib)
    results = {
        name: measure(target, drafter, prompts, args.k, args.new_tokens, eos) for name, drafter in drafters.items()
    }
    seconds = time.time() - began

    print(f"target {args.target}\ndraft  {args.draft}\nheads  {args.heads}")
    print(
        f"held-out prompts from the stdlib at {args.stdlib or examples.stdlib_root()} (Python "
        f"{platform.python_version() if args.stdlib is None else '?'}): {len(prompts)} x {args.prompt_tokens} "
        f"tokens, {args.new_tokens} new tokens each, greedy, K={args.k}, fp32 on {args.device}, {seconds:.1f}s"
    )
    for name, result in results.items():
        report(name, result, prompts, args)
    if args.json:
        payload = {
            "command": "python3 tools/measure_acceptance.py " + " ".join(sys.argv[1:] if argv is None else argv),
            "python": platform.python_version(),
            "stdlib": str(args.stdlib or examples.stdlib_root()),
            "seconds": seconds,
            "results": {name: asdict(result) for name, result in results.items()},
        }
        args.json.write_text(json.dumps(payload, indent=2) + "\n")
    if args.metadata:
        metadata = json.loads(args.metadata.read_text())
        table = metadata["acceptance"]["by_new_tokens"].setdefault(str(args.new_tokens), {})
        for name, result in results.items():
            table[name] = asdict(result)
        args.metadata.write_text(json.dumps(metadata, indent=2) + "\n")
    return results


if __name__ == "__main__":
    main()
