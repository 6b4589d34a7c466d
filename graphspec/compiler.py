"""compile(): checkpoints -> one traced, pass-processed step graph per (sampling mode, batch bucket)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.fx as fx

from graphspec import trace
from graphspec.config import SAMPLING_MODES, PassContext, SpecConfig
from graphspec.counters import COUNTERS
from graphspec.dump import PassRecord
from graphspec.errors import InputError
from graphspec.models.loading import LoadedModel, load_model, parse_dtype
from graphspec.pipeline import run_pipeline, validate_names

log = logging.getLogger("graphspec")


@dataclass
class Compiled:
    """An in-memory artifact: models, config and the compiled step graph per (mode, bucket)."""

    config: SpecConfig
    target: LoadedModel
    draft: LoadedModel
    graphs: dict[tuple[str, int], fx.GraphModule]
    signature: trace.StepSignature
    sm: int | None
    records: dict[str, list[PassRecord]] = field(default_factory=dict)

    @property
    def slots(self) -> int:
        """Cache slots: one per row of the largest bucket plus the spare slot padded rows write to."""
        return max(self.config.batch_sizes) + 1


def device_sm(device: str) -> int | None:
    if not device.startswith("cuda"):
        return None
    major, minor = torch.cuda.get_device_capability(torch.device(device))
    return major * 10 + minor


def check_pair(target: LoadedModel, draft: LoadedModel) -> None:
    t, d = target.model.spec, draft.model.spec
    if t.vocab_size != d.vocab_size:
        raise InputError(
            f"draft and target vocabularies differ: target {target.path} has vocab_size {t.vocab_size}, "
            f"draft {draft.path} has {d.vocab_size}; speculative decoding needs a shared vocabulary"
        )
    if target.tokenizer is not None and draft.tokenizer is not None:
        if target.tokenizer.get_vocab() != draft.tokenizer.get_vocab():
            raise InputError(
                f"draft tokenizer ({draft.path}) maps tokens differently from the target's ({target.path})"
            )


def resolve_device(device: str) -> str:
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise InputError(f"device {device!r} requested but CUDA is not available; use --device cpu")
    return device


def compile(
    target: str | Path,
    draft: str | Path,
    k: int = 4,
    batch_sizes: Iterable[int] = (1,),
    dtype: str = "bfloat16",
    device: str = "cuda",
    out: str | Path | None = None,
    dump_dir: str | Path | None = None,
    max_seq_len: int = 1024,
    capture: str = "auto",
    lowering: str = "auto",
    stop_after: str | None = None,
    skip: Iterable[str] = (),
    copy_weights: bool = True,
    modes: Iterable[str] = SAMPLING_MODES,
    on_progress: Callable[[str], None] | None = None,
) -> Compiled:
    """Load both checkpoints, trace the step for every batch bucket and sampling mode, run the pass
    pipeline, and (with `out`) write a serving artifact. Every argument is validated first."""
    config = SpecConfig(
        k=k,
        batch_sizes=tuple(batch_sizes),
        dtype=dtype,
        device=device,
        max_seq_len=max_seq_len,
        capture=capture,
        lowering=lowering,
    )
    validate_names(stop_after, skip)
    modes = tuple(modes)
    if not modes or any(mode not in SAMPLING_MODES for mode in modes):
        raise InputError(f"modes must be a non-empty subset of {SAMPLING_MODES}, got {modes!r}")
    device = resolve_device(device)
    progress = on_progress or (lambda message: log.info(message))
    progress(f"loading target {target}")
    target_model = load_model(target, dtype, device)
    progress(f"loading draft {draft}")
    draft_model = load_model(draft, dtype, device)
    check_pair(target_model, draft_model)
    for loaded in (target_model, draft_model):
        limit = loaded.model.spec.max_position_embeddings
        if max_seq_len > limit:
            raise InputError(f"max_seq_len={max_seq_len} exceeds {loaded.path}'s max_position_embeddings={limit}")
        window = loaded.model.spec.sliding_window
        if window is not None and max_seq_len > window:
            raise InputError(f"max_seq_len={max_seq_len} exceeds {loaded.path}'s sliding_window={window}")
    sm = device_sm(device)
    slots = max(config.batch_sizes) + 1
    graphs, records = {}, {}
    signature = None
    for bucket in config.batch_sizes:
        # Real (uninitialized) tensors on the real device: the graph records devices of constants.
        inputs = trace.example_step_inputs(
            target_model.model, draft_model.model, bucket, slots, max_seq_len, parse_dtype(dtype), device
        )
        for mode in modes:
            name = f"step_b{bucket}_{mode}"
            progress(f"tracing {name}")
            gm, signature = trace.trace_step(target_model.model, draft_model.model, k, mode, inputs)
            COUNTERS.traces += 1
            ctx = PassContext(
                k=k,
                batch=bucket,
                mode=mode,
                sm=sm,
                device=device,
                dtype=dtype,
                capture=capture,
                lowering=lowering,
                scratch_slot=slots - 1,
            )
            result = run_pipeline(
                gm,
                ctx,
                dump_dir=Path(dump_dir) / name if dump_dir else None,
                stop_after=stop_after,
                skip=skip,
                title=f"{name}: k={k}, bucket={bucket}, mode={mode}, sm={sm}",
                on_pass=lambda p, n=name: progress(f"{n}: {p}"),
            )
            COUNTERS.pipeline_runs += 1
            graphs[(mode, bucket)] = result.gm
            records[name] = result.records
    compiled = Compiled(config, target_model, draft_model, graphs, signature, sm, records)
    if out is not None:
        from graphspec.artifact import save_artifact

        progress(f"writing artifact {out}")
        save_artifact(compiled, out, copy_weights=copy_weights)
    return compiled
