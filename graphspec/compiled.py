"""An in-memory artifact (Compiled): what compile() produces, save_artifact() writes and load_artifact() reads.

It sits below compiler.py and artifact.py so the compiler can write artifacts and the artifact loader can
build one without either importing the other.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.fx as fx

from graphspec import trace, trace_prefill
from graphspec.config import SpecConfig
from graphspec.drafters import Drafter, State
from graphspec.dump import PassRecord
from graphspec.models.loading import LoadedModel, parse_dtype


@dataclass
class Compiled:
    """An in-memory artifact: target, drafter, config and the compiled step graph per (mode, bucket)."""

    config: SpecConfig
    target: LoadedModel
    drafter: Drafter
    graphs: dict[tuple[str, int], fx.GraphModule]
    signature: trace.StepSignature
    sm: int | None
    records: dict[str, list[PassRecord]] = field(default_factory=dict)
    # The prefill chunk programs by (bucket, chunk size) (trace_prefill.py); empty for artifacts written
    # before them.
    prefill_graphs: dict[tuple[int, int], fx.GraphModule] = field(default_factory=dict)
    # Seconds per phase of how this Compiled came to be in memory (load_artifact: "verify", "checks",
    # "weights", "graphs" in order, then "hashing_beside_weights": the weight shards' sha256, which runs
    # during "weights" and "graphs" and is not added to them); the Runtime adds its own start-up phases
    # (Runtime.startup_seconds).
    load_seconds: dict[str, float] = field(default_factory=dict)

    def prefill_chunks(self, bucket: int) -> tuple[int, ...]:
        """Positions per row of the bucket's prefill chunk programs, largest first."""
        config = self.config
        return trace_prefill.chunk_sizes(bucket, config.max_seq_len, config.prefill_tokens, config.device)

    @property
    def slots(self) -> int:
        """Cache slots: one per row of the largest bucket plus the spare slot padded rows write to."""
        return max(self.config.batch_sizes) + 1

    def states(self) -> tuple[State, ...]:
        """Every state tensor the step keeps (target KV cache, then the drafter's)."""
        dtype = parse_dtype(self.config.dtype)
        config = self.config
        return trace.step_states(self.target.model, self.drafter, self.slots, config.max_seq_len, config.k, dtype)

    def new_state(self) -> dict[str, torch.Tensor]:
        """Freshly allocated state tensors on the compiled device, by name."""
        return {state.name: state.allocate(self.config.device) for state in self.states()}

    def weights(self) -> list[torch.Tensor]:
        """The step graphs' weight inputs in placeholder order: the target's, then the drafter's."""
        return [*trace.model_inputs(self.target.model).values(), *self.drafter.params().values()]


def prefill_graph_name(bucket: int, chunk: int) -> str:
    """The name of a bucket's prefill chunk program of `chunk` positions per row (dumps, artifact files)."""
    return f"prefill_b{bucket}_c{chunk}"


def device_sm(device: str) -> int | None:
    if not device.startswith("cuda"):
        return None
    major, minor = torch.cuda.get_device_capability(torch.device(device))
    return major * 10 + minor
