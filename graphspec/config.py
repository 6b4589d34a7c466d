"""Frozen dataclasses: SpecConfig (the user's knobs) and PassContext/PassResult (what passes see)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from graphspec.errors import InputError

if TYPE_CHECKING:  # annotations only: the CLI reads this module's constants without importing torch
    import torch.fx as fx

MAX_K = 16
# Prompt tokens one prefill chunk runs over the whole bucket (trace_prefill.chunk_size): big enough that
# the chunk's GEMMs run near the matmul rate, small enough that activations stay bounded.
DEFAULT_PREFILL_TOKENS = 2048
SAMPLING_MODES = ("greedy", "sample")
NUMERICS = ("default", "invariant")
FOLD_NORMS = {"auto": None, "on": True, "off": False}  # `--fold-norms` -> compile's fold_norms (None: auto)


def default_fold_norms(device: str, numerics: str) -> bool:
    """compile's fold_norms=None: fold on CUDA under default numerics, where it saves launches per layer (on the
    CPU there are no launches to save, and the CPU's packed-weight matmuls take plain projections)."""
    return device.startswith("cuda") and numerics == "default"


@dataclass(frozen=True)
class SpecConfig:
    """What a user chooses when compiling. Validated on construction, before any work starts."""

    k: int = 4
    batch_sizes: tuple[int, ...] = (1,)
    dtype: str = "bfloat16"
    device: str = "cuda"
    max_seq_len: int = 1024
    # Capture strategy per bucket on CUDA: "auto" picks full-graph capture when every op is
    # capturable and falls back to piecewise; "piecewise" forces eager attention between pieces.
    capture: str = "auto"
    lowering: str = "auto"  # "auto": Triton kernels where the registry has one for this SM; "reference": none
    prefill_tokens: int = DEFAULT_PREFILL_TOKENS  # tokens per prefill chunk, over all rows of a bucket
    # "invariant": row-invariant kernels in the steps and prefill programs (lowering/registry.py), so a
    # token's logits do not depend on the batch or the verify block it is computed in; "default": the fastest.
    numerics: str = "default"
    # Drafts per step of chosen buckets, below k (a mapping {bucket: K} or its items): at large batches the
    # verify's K+1 rows per sequence turn the step compute-bound, and fewer drafts keep it near the decode
    # (vLLM's disable_by_batch_size, TensorRT-LLM's draft_len_schedule). Other buckets draft k. Stored as
    # sorted (bucket, K) pairs; k stays the largest K, which the drafter's states are laid out for.
    k_by_bucket: tuple[tuple[int, int], ...] = ()
    # Fold each decoder layer's norm weights into the projections they feed, where a model allows
    # (models/fold_norms.py): up to two launches fewer per layer. The loader folds the weights, so an artifact
    # records it.
    fold_norms: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.k, bool) or not isinstance(self.k, int):
            raise InputError(f"k must be an int, got {self.k!r}")
        if not 1 <= self.k <= MAX_K:
            raise InputError(f"k must be between 1 and {MAX_K}, got {self.k}")
        sizes = tuple(self.batch_sizes)
        if not sizes or any(isinstance(b, bool) or not isinstance(b, int) or b < 1 for b in sizes):
            raise InputError(f"batch_sizes must be positive ints, got {self.batch_sizes!r}")
        object.__setattr__(self, "batch_sizes", tuple(sorted(set(sizes))))
        object.__setattr__(self, "k_by_bucket", self._checked_k_by_bucket())
        if self.dtype not in ("float32", "float16", "bfloat16"):
            raise InputError(f"dtype must be float32, float16 or bfloat16, got {self.dtype!r}")
        if self.capture not in ("auto", "full", "piecewise", "none"):
            raise InputError(f"capture must be auto, full, piecewise or none, got {self.capture!r}")
        if self.lowering not in ("auto", "reference"):
            raise InputError(f"lowering must be auto or reference, got {self.lowering!r}")
        if isinstance(self.prefill_tokens, bool) or not isinstance(self.prefill_tokens, int) or self.prefill_tokens < 1:
            raise InputError(f"prefill_tokens must be a positive int, got {self.prefill_tokens!r}")
        if self.numerics not in NUMERICS:
            raise InputError(f"numerics must be one of {', '.join(NUMERICS)}, got {self.numerics!r}")
        if self.numerics == "invariant" and (not self.device.startswith("cuda") or self.lowering != "auto"):
            raise InputError(
                f"numerics='invariant' needs the Triton kernels: device cuda and lowering auto, got device "
                f"{self.device!r}, lowering {self.lowering!r} (on the CPU the reference ops have no invariant form)"
            )
        if not isinstance(self.fold_norms, bool):
            raise InputError(f"fold_norms must be True or False, got {self.fold_norms!r}")
        if self.fold_norms and self.numerics == "invariant":
            raise InputError(
                "fold_norms=True with numerics='invariant': the folded residual add is cuBLAS's addmm, which is not "
                "row-invariant; compile with fold_norms=False (the default under invariant numerics)"
            )
        if self.max_seq_len < self.k + 3:
            raise InputError(f"max_seq_len={self.max_seq_len} is too small for k={self.k}")

    def _checked_k_by_bucket(self) -> tuple[tuple[int, int], ...]:
        pairs = self.k_by_bucket.items() if isinstance(self.k_by_bucket, dict) else self.k_by_bucket
        try:
            pairs = [(bucket, k) for bucket, k in pairs]
        except (TypeError, ValueError):
            raise InputError(f"k_by_bucket must map buckets to K, got {self.k_by_bucket!r}") from None
        for bucket, k in pairs:
            if bucket not in self.batch_sizes or isinstance(bucket, bool):
                raise InputError(f"k_by_bucket names bucket {bucket!r}, not one of batch_sizes {self.batch_sizes}")
            if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= self.k:
                raise InputError(f"k_by_bucket gives bucket {bucket} K={k!r}: it must be an int from 1 to k={self.k}")
        if len({bucket for bucket, _ in pairs}) != len(pairs):
            raise InputError(f"k_by_bucket names a bucket twice: {self.k_by_bucket!r}")
        return tuple(sorted(pairs))

    def k_for(self, bucket: int) -> int:
        """The drafts per step of `bucket`'s graphs."""
        return dict(self.k_by_bucket).get(bucket, self.k)


@dataclass(frozen=True)
class PassContext:
    """Everything a pass may look at. Passes keep no state of their own."""

    k: int
    batch: int  # the bucket this graph is compiled for
    mode: str  # "greedy" or "sample"
    sm: int | None  # compute capability as major*10+minor (90 for H100/H200), None on CPU
    device: str = "cpu"
    dtype: str = "float32"
    capture: str = "auto"
    lowering: str = "auto"
    numerics: str = "default"  # "invariant": row-invariant kernels (lowering/registry.py)
    scratch_slot: int = -1  # cache slot padded rows are redirected to (the runtime's spare slot)
    options: dict[str, Any] = field(default_factory=dict)


@dataclass
class PassResult:
    gm: fx.GraphModule
    changed: bool
    stats: dict[str, Any] = field(default_factory=dict)
    note: str = ""
