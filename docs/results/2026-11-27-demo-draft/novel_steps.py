# ruff: noqa  (the script as run, kept with its results)
"""Acceptance of a demo pair's draft model on the steps that do not continue a loop.

tools/measure_acceptance.py's replay (greedy, K = 4, 20 held-out prompts of 64 tokens, fp32), each step then
classed by whether the target's first token of the step completes a 4-gram that already occurred earlier in the
prompt or the continuation (a step inside a loop, where any drafter that read the context predicts well) or not.
Mean accepted drafts per step over all steps, and over the steps outside loops, for the pairs given.

    PYTHONPATH=. python3 docs/results/2026-11-27-demo-draft/novel_steps.py PAIR_DIR [PAIR_DIR ...]
"""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tools"))
import measure_acceptance as ma

torch.set_num_threads(1)
for pair in map(Path, sys.argv[1:]):
    target, draft, tokenizer, eos = ma.load_pair(pair / "target", pair / "draft", "cpu")
    prompts = ma.heldout_prompts(tokenizer, 20, 64)
    for new_tokens in (128, 32):
        everything, novel = [], []
        for _, prompt in prompts:
            tokens, length = ma.continuation(target, prompt, 4, new_tokens, eos)
            full = prompt + tokens
            accepted = ma.replay(ma.DraftModel(draft).proposer(full, 4), full, len(prompt), length, 4)
            position = len(prompt)
            for n in accepted:
                seen = {tuple(full[i - 3 : i + 1]) for i in range(3, position)}
                everything.append(n)
                if tuple(full[position - 3 : position + 1]) not in seen:
                    novel.append(n)
                position += n + 1
        print(
            f"{pair}: {new_tokens} new tokens: all steps {sum(everything) / len(everything):.3f} ({len(everything)}), "
            f"outside loops {sum(novel) / len(novel):.3f} ({len(novel)} steps, {len(novel) / len(everything):.0%})",
            flush=True,
        )
