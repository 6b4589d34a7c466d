"""A real traced step of tiny models, and the eager program every pass must stay equal to (fp32).
The `step_case` fixture (tests/conftest.py) shares one per session."""

from __future__ import annotations

import torch

from graphspec import ops, pipeline, trace
from graphspec.config import PassContext
from graphspec.drafters.draft_model import DraftModel
from graphspec.models import load_model

BATCH, K, SLOTS, MAX_SEQ = 3, 2, 4, 48


class StepCase:
    def __init__(self, target_dir, draft_dir, fold_norms: bool = False, batch: int = BATCH) -> None:
        """batch <= BATCH rows: the first `batch` of the three rows below (batch 1: one valid row, whose
        draft forwards and, folded, whose products have one row)."""
        self.target = load_model(target_dir, fold_norms=fold_norms).model
        self.drafter = DraftModel(load_model(draft_dir, fold_norms=fold_norms))
        self.draft = self.drafter.model
        self.batch = batch
        generator = torch.Generator().manual_seed(0)
        inputs = trace.example_step_inputs(self.target, self.drafter, K, batch, SLOTS, MAX_SEQ, torch.float32, "cpu")
        inputs["last_tokens"] = torch.randint(0, 128, (BATCH, 2), generator=generator)[:batch]
        inputs["committed_len"] = torch.tensor([5, 17, 9])[:batch]
        inputs["row_valid"] = torch.tensor([True, True, False])[:batch]
        inputs["temperature"] = torch.tensor([0.0, 0.9, 1.3])[:batch]
        inputs["seed"] = torch.tensor([11, 12, 13])[:batch]
        inputs["target_cache"] = torch.randn(inputs["target_cache"].shape, generator=generator)
        inputs["draft_cache"] = torch.randn(inputs["draft_cache"].shape, generator=generator)
        self.inputs = inputs
        self.params = [*trace.model_inputs(self.target).values(), *self.drafter.params().values()]
        _, self.signature = trace.trace_step(self.target, self.drafter, K, "greedy", self.inputs)

    def traced(self, mode: str):
        gm, _ = trace.trace_step(self.target, self.drafter, K, mode, self.inputs)
        return gm

    def context(self, mode: str, **overrides) -> PassContext:
        return PassContext(k=K, batch=self.batch, mode=mode, sm=None, scratch_slot=SLOTS - 1, **overrides)

    def run_graph(self, gm) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        state = {name: value.clone() for name, value in self.inputs.items()}
        outputs = gm(*self.params, *(state[name] for name in self.signature.step_inputs))
        names = trace.output_nodes(gm)  # verified outputs, or the traced program's before insert_verify
        return dict(zip(names, outputs, strict=True)), state

    def eager(self, mode: str, traced: bool = True) -> dict[str, torch.Tensor]:
        """The step's meaning: speculate, then verify and commit called directly. With traced=True
        the speculate part is the traced graph (what passes must preserve bit for bit); otherwise
        plain Python on real tensors (equal up to BLAS call paths: eager F.linear vs traced mm)."""
        x = {name: value.clone() for name, value in self.inputs.items()}
        t_params, d_params = trace.model_inputs(self.target), self.drafter.params()
        if traced:
            speculated, _ = self.run_graph(self.traced(mode))
        else:
            rows = {name: x[name] for name in trace.ROW_INPUTS}
            state = {name: x[name] for name in self.signature.states}
            speculated = trace.speculate(
                self.target, self.drafter, K, mode == "greedy", t_params, d_params, rows, state
            )
        target_logits, draft_logits, draft_tokens = (speculated[n] for n in trace.SPECULATE_OUTPUTS[:3])
        t_cache, d_cache = speculated["target_cache"], speculated["draft_cache"]
        if mode == "greedy":
            tokens, accepted = ops.verify_greedy(target_logits, draft_tokens)
        else:
            tokens, accepted = ops.verify_rejection(
                target_logits,
                draft_logits,
                draft_tokens,
                x["temperature"],
                x["top_k"],
                x["top_p"],
                x["seed"],
                x["step_counter"],
            )
        next_len, next_last = ops.commit(x["committed_len"], x["last_tokens"], tokens, accepted)
        return {
            "tokens": tokens,
            "num_accepted": accepted,
            "next_committed_len": next_len,
            "next_last_tokens": next_last,
            "next_step_counter": x["step_counter"] + 1,
            "target_cache": t_cache,
            "draft_cache": d_cache,
        }

    def through(self, mode: str, last_pass: str, **ctx_overrides):
        """The traced step after the pipeline up to and including `last_pass`."""
        result = pipeline.run_pipeline(
            self.traced(mode), self.context(mode, **ctx_overrides), stop_after=last_pass, check=True
        )
        return result.gm

    def assert_matches_eager(self, gm, mode: str) -> None:
        """Real rows (row_valid) produce exactly the traced program's outputs and cache contents,
        and the plain-Python program's tokens exactly and caches to 1e-5."""
        outputs, _ = self.run_graph(gm)
        real = self.inputs["row_valid"]
        slots = self.inputs["slot_ids"][real]
        for traced, tolerance in ((True, 0.0), (False, 1e-5)):
            expected = self.eager(mode, traced=traced)
            for name in ("tokens", "num_accepted", "next_committed_len", "next_last_tokens", "next_step_counter"):
                torch.testing.assert_close(outputs[name][real], expected[name][real], rtol=0, atol=0, msg=name)
            for name in ("target_cache", "draft_cache"):
                # In-place graphs return the mutated input buffer; functional ones a new cache.
                got, want = outputs[name][:, :, slots], expected[name][:, :, slots]
                torch.testing.assert_close(got, want, rtol=tolerance, atol=tolerance, msg=name)
