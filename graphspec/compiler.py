"""compile(): checkpoints -> one traced, pass-processed step graph per (sampling mode, batch bucket)."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

import torch

from graphspec import checks, trace, trace_prefill
from graphspec.artifact import check_out, save_artifact
from graphspec.compiled import Compiled, device_sm, prefill_graph_name
from graphspec.config import DEFAULT_PREFILL_TOKENS, SAMPLING_MODES, PassContext, SpecConfig, default_fold_norms
from graphspec.context import default_max_seq_len
from graphspec.counters import COUNTERS
from graphspec.cublas import use_no_workspace
from graphspec.drafters import Drafter, check_context, check_drafter, drafter_kind, open_drafter
from graphspec.errors import InputError
from graphspec.models.loading import LoadedModel, load_config, load_model, parse_dtype
from graphspec.models.spec import ModelSpec
from graphspec.pipeline import PREFILL_PIPELINE, run_pipeline, validate_names
from graphspec.triton_binaries import RECORDER as TRITON_KERNELS

log = logging.getLogger("graphspec")


def check_tokenizers(target: LoadedModel, drafter: Drafter) -> None:
    draft = drafter.loaded
    if draft is not None and target.tokenizer is not None and draft.tokenizer is not None:
        if target.tokenizer.get_vocab() != draft.tokenizer.get_vocab():
            raise InputError(
                f"draft tokenizer ({draft.path}) maps tokens differently from the target's ({target.path})"
            )


def resolve_device(device: str) -> str:
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise InputError(f"device {device!r} requested but CUDA is not available; compile for device 'cpu'")
    return device


def check_dump_dir(dump_dir: str | Path) -> None:
    """Refuse a --dump-dir that cannot hold folders (it or a parent is a file) before any work."""
    path = Path(dump_dir).expanduser().absolute()
    blocking = next((p for p in (path, *path.parents) if p.exists() and not p.is_dir()), None)
    if blocking is not None:
        raise InputError(f"dump_dir {path}: {blocking} is a file, not a directory; choose another path")


def compile(
    target: str | Path,
    draft: str | Path,
    k: int = 4,
    batch_sizes: Iterable[int] = (1,),
    dtype: str = "bfloat16",
    device: str = "cuda",
    out: str | Path | None = None,
    dump_dir: str | Path | None = None,
    max_seq_len: int | None = None,
    prefill_tokens: int = DEFAULT_PREFILL_TOKENS,
    capture: str = "auto",
    lowering: str = "auto",
    numerics: str = "default",
    stop_after: str | None = None,
    skip: Iterable[str] = (),
    copy_weights: bool = True,
    modes: Iterable[str] = SAMPLING_MODES,
    k_by_bucket: Mapping[int, int] | Iterable[tuple[int, int]] | None = None,
    fold_norms: bool | None = None,
    on_progress: Callable[[str], None] | None = None,
    drafter: str | None = None,
    **drafter_options: object,
) -> Compiled:
    """Load the target and the drafter, trace the step for every batch bucket and sampling mode, run
    the pass pipeline, and (with `out`) write a serving artifact. Every argument is validated, and
    every config read, before any weight is.

    draft: a draft-model checkpoint directory, a head directory (EAGLE-3, or MTP in the NextN convention;
    the kind is read from its config's architectures), "mtp" (the target checkpoint's own MTP head), or
    "ngram" (no model; options ngram_min, ngram_max). MTP, EAGLE-3 and DFlash take token_map: a token-map file
    (graphspec/drafters/token_map.py) that restricts its drafts to those target ids (a reduced lm_head).
    drafter: the drafter kind when `draft` alone does not say it (see graphspec.drafters.KINDS).
    max_seq_len None: the models' max_position_embeddings capped by a memory budget (graphspec/context.py).
    k_by_bucket: drafts per step of chosen buckets, below k (e.g. {64: 1} or [(64, 1)]: fewer drafts where a
    large batch makes the verify compute-bound); the other buckets draft k.
    fold_norms: fold each decoder layer's norm weights into the projections they feed (post-attention into gate/up,
    input into q/k/v) where the models allow (models/fold_norms.py; None: config.default_fold_norms, on CUDA under
    default numerics).
    numerics "invariant": row-invariant kernels in the steps and prefill programs (greedy only;
    lowering/registry.py), so a draft equal to the target accepts every draft and speculation changes no
    token of the target's own output."""
    config = SpecConfig(
        k=k,
        batch_sizes=tuple(batch_sizes),
        dtype=dtype,
        device=device,
        max_seq_len=1024 if max_seq_len is None else max_seq_len,
        prefill_tokens=prefill_tokens,
        capture=capture,
        lowering=lowering,
        numerics=numerics,
        k_by_bucket=() if k_by_bucket is None else k_by_bucket,  # type: ignore[arg-type]: SpecConfig normalizes it
        fold_norms=default_fold_norms(device, numerics) if fold_norms is None else fold_norms,
    )
    validate_names(stop_after, skip)
    modes = tuple(modes)
    if not modes or any(mode not in SAMPLING_MODES for mode in modes):
        raise InputError(f"modes must be a non-empty subset of {SAMPLING_MODES}, got {modes!r}")
    if numerics == "invariant" and modes != ("greedy",):
        raise InputError(
            "numerics='invariant' compiles greedy steps only: give modes=('greedy',) (--modes greedy); the "
            "sampling kernels split their vocabulary statistics by the batch"
        )
    use_no_workspace()  # before the models start CUDA (graphspec/cublas.py)
    device = resolve_device(device)
    if out is not None:
        check_out(out)
    if dump_dir is not None:
        check_dump_dir(dump_dir)
    if device.startswith("cuda"):
        TRITON_KERNELS.install()  # from the first kernel on: a saved artifact carries what Triton built
    progress = on_progress or (lambda message: log.info(message))
    # Configs first: every mismatch a config can show is refused before minutes of weight loading.
    kind = drafter_kind(draft, drafter)
    target_config = load_config(target)
    target_spec = ModelSpec.from_config(target_config)
    if max_seq_len is None:
        specs = [target_spec]
        if kind == "draft_model":  # a draft model keeps a KV cache as long as the target's
            specs.append(ModelSpec.from_config(load_config(draft)))
        slots = max(config.batch_sizes) + 1
        max_seq_len = default_max_seq_len(specs, slots, parse_dtype(dtype), device)
        config = dataclasses.replace(config, max_seq_len=max_seq_len)
    check_context(target, target_spec, max_seq_len)
    checked = check_drafter(draft, kind, target, target_config, max_seq_len, dict(drafter_options), k)
    progress(f"loading target {target}")
    target_model = load_model(target, dtype, device, fold_norms=config.fold_norms)
    if checked is None:  # the drafter has weights of its own
        progress(f"loading draft {draft}")
    drafter_model = open_drafter(
        draft, kind, target_model, dtype, device, checked, dict(drafter_options), fold_norms=config.fold_norms
    )
    check_tokenizers(target_model, drafter_model)
    sm = device_sm(device)
    slots = max(config.batch_sizes) + 1
    graphs, records = {}, {}
    signature = None
    for bucket in config.batch_sizes:
        # Real (uninitialized) tensors on the real device: the graph records devices of constants.
        inputs = trace.example_step_inputs(
            target_model.model, drafter_model, k, bucket, slots, max_seq_len, parse_dtype(dtype), device
        )
        bucket_k = config.k_for(bucket)  # the states above are laid out for k, the largest
        for mode in modes:
            name = f"step_b{bucket}_{mode}"
            progress(f"tracing {name}")
            gm, signature = trace.trace_step(target_model.model, drafter_model, bucket_k, mode, inputs)
            COUNTERS.traces += 1
            ctx = PassContext(
                k=bucket_k,
                batch=bucket,
                mode=mode,
                sm=sm,
                device=device,
                dtype=dtype,
                capture=capture,
                lowering=lowering,
                numerics=numerics,
                scratch_slot=slots - 1,
            )
            result = run_pipeline(
                gm,
                ctx,
                dump_dir=Path(dump_dir) / name if dump_dir else None,
                stop_after=stop_after,
                skip=skip,
                title=f"{name}: drafter={drafter_model.kind}, k={bucket_k}, bucket={bucket}, mode={mode}, sm={sm}, "
                f"numerics={numerics}",
                on_pass=lambda p, n=name: progress(f"{n}: {p}"),
            )
            COUNTERS.pipeline_runs += 1
            graphs[(mode, bucket)] = result.gm
            records[name] = result.records
    prefill_graphs = {}
    for bucket in config.batch_sizes:
        for chunk in trace_prefill.chunk_sizes(bucket, max_seq_len, config.prefill_tokens, device):
            name = prefill_graph_name(bucket, chunk)
            progress(f"tracing {name}")
            inputs = trace_prefill.example_prefill_inputs(
                target_model.model, drafter_model, k, bucket, chunk, slots, max_seq_len, parse_dtype(dtype), device
            )
            gm, _ = trace_prefill.trace_prefill(target_model.model, drafter_model, k, inputs)
            COUNTERS.traces += 1
            ctx = PassContext(
                k=k, batch=bucket, mode="prefill", sm=sm, device=device, dtype=dtype, capture=capture,
                lowering=lowering, numerics=numerics, scratch_slot=slots - 1,
            )  # fmt: skip
            result = run_pipeline(
                gm,
                ctx,
                dump_dir=Path(dump_dir) / name if dump_dir else None,
                skip=[p for p in skip if p in {module.NAME for module in PREFILL_PIPELINE}],
                title=f"{name}: drafter={drafter_model.kind}, chunk={chunk}, bucket={bucket}, sm={sm}, "
                f"numerics={numerics}",
                on_pass=lambda p, n=name: progress(f"{n}: {p}"),
                passes=PREFILL_PIPELINE,
                phase_checks=checks.PREFILL_PHASE_CHECKS,
            )
            COUNTERS.pipeline_runs += 1
            prefill_graphs[(bucket, chunk)] = result.gm
            records[name] = result.records
    compiled = Compiled(config, target_model, drafter_model, graphs, signature, sm, records, prefill_graphs)
    if out is not None:
        progress(f"writing artifact {out}")
        save_artifact(compiled, out, copy_weights=copy_weights)
    return compiled
