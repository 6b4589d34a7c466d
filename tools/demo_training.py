"""What the demo pair's and heads' training share (tools/train_demo_pair.py, tools/train_demo_heads.py):
batches of corpus windows, the optimizer, the LR schedule, the per-phase step cap, bf16 autocast."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from pathlib import Path

import torch


def windows(stream: torch.Tensor, starts: torch.Tensor, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    index = starts[:, None] + torch.arange(length + 1, device=stream.device)  # [B, T+1]
    chunk = stream[index]
    return chunk[:, :-1], chunk[:, 1:]


def lr_at(step: int, steps: int, peak: float) -> float:
    """Linear warmup over the first 100 steps (a tenth of a short run), then cosine decay to 10% of peak."""
    warmup = max(1, min(100, steps // 10))
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, steps - warmup))
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


class StepCap:
    """A phase's step count, capped to fit its time budget on the machine at hand: after PROBE steps
    (the first WARM ones excluded: allocator and kernel warm-up) the measured time per step fixes how
    many steps fit, with a tenth of the budget left for evaluations. The LR schedule then runs to
    that count, so a slower GPU trains fewer steps with a complete schedule instead of a cut one."""

    WARM, PROBE = 5, 25

    def __init__(self, steps: int, budget: float) -> None:
        self.requested, self.steps, self.budget, self.capped = steps, steps, budget, False
        self.began, self.warm_at = time.time(), None
        self.per_step: float | None = None
        self.evaluations_fitted = False

    def after_step(self, step: int) -> None:
        if step == self.WARM:
            self.warm_at = time.time()
        elif step == self.PROBE and self.warm_at is not None:
            self.per_step = (time.time() - self.warm_at) / (self.PROBE - self.WARM)
            self.fit(step, self.per_step, 0.9 * self.budget, "")

    def after_evaluation(self, step: int, seconds: float, every: int) -> None:
        """Once, after the first periodic evaluation: fit again with the evaluations' cost (`seconds`
        every `every` steps) spread over the steps. The tenth of the budget left for them fell short
        where evaluations were slow: an H200 draft phase ran 484 s of a 440 s budget."""
        if self.per_step is None or self.evaluations_fitted:
            return
        self.evaluations_fitted = True
        self.fit(step, self.per_step + seconds / every, self.budget, f" with an evaluation every {every}")

    def fit(self, step: int, per_step: float, budget: float, what: str) -> None:
        """Lower the step count to what fits `budget` from here at `per_step` seconds a step."""
        fit = step + int((budget - self.elapsed()) / per_step)
        if fit < self.steps:
            self.steps, self.capped = max(step, fit), True
            print(f"  {per_step * 1e3:.1f} ms/step{what}: {self.steps} steps fit the {self.budget:.0f}s budget")

    def elapsed(self) -> float:
        return time.time() - self.began


def make_optimizer(model: torch.nn.Module, lr: float, device: str) -> torch.optim.Optimizer:
    decay = [p for p in model.parameters() if p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    groups = [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95), fused=device.startswith("cuda"))


def autocast(device: str):
    if device.startswith("cuda"):
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return torch.autocast("cpu", enabled=False)


def record_files(metadata: dict, pair: Path, part: str, sha256: Callable[[Path], str]) -> None:
    """A demo pair's metadata sha256 and bytes of the files in pair/part, in place of what they held for part
    (the pair's test checks every shipped file against them); both tables kept sorted by name."""
    for table in (metadata["sha256"], metadata["bytes"]):
        for name in [name for name in table if name.startswith(f"{part}/")]:
            del table[name]
    for path in sorted(p for p in (pair / part).iterdir() if p.is_file()):
        metadata["sha256"][f"{part}/{path.name}"] = sha256(path)
        metadata["bytes"][f"{part}/{path.name}"] = path.stat().st_size
    metadata["sha256"], metadata["bytes"] = (dict(sorted(metadata[key].items())) for key in ("sha256", "bytes"))
