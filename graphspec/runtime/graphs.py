"""Run one compiled step per (mode, bucket): eagerly, or as a captured CUDA graph replayed per step.

The graph's inputs are the model weights, the bucket's StepBuffers and the shared KV caches, all at
fixed addresses, so a captured graph replays with no per-step argument handling: the runtime writes
the next step's values into the buffers (device-to-device) and calls replay().
"""

from __future__ import annotations

import torch
import torch.fx as fx

from graphspec import trace
from graphspec.counters import COUNTERS
from graphspec.runtime.buffers import StepBuffers


class StepGraph:
    def __init__(
        self,
        gm: fx.GraphModule,
        params: list[torch.Tensor],
        buffers: StepBuffers,
        caches: dict[str, torch.Tensor],
        capture: bool,
        pool: object | None = None,
    ) -> None:
        self.gm = gm
        self.buffers = buffers
        self.args = [*params, *(buffers.inputs.get(n, caches.get(n)) for n in trace.STEP_INPUTS)]
        self.capture = capture
        self.pool = pool
        self.cuda_graph: torch.cuda.CUDAGraph | None = None
        self.outputs: tuple[torch.Tensor, ...] | None = None

    def warm_up_and_capture(self) -> None:
        """Warm up on a side stream (every row invalid, so only the spare cache slot is written),
        then capture. Any Triton JIT or cuBLAS workspace setup happens here, never during replay."""
        valid = self.buffers.inputs["row_valid"]
        saved = valid.clone()
        valid.zero_()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):
                self.gm(*self.args)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            self.outputs = self.gm(*self.args)
        valid.copy_(saved)
        self.cuda_graph = graph
        COUNTERS.captures += 1

    def __call__(self) -> dict[str, torch.Tensor]:
        if self.capture:
            if self.cuda_graph is None:
                self.warm_up_and_capture()
            self.cuda_graph.replay()
            COUNTERS.replays += 1
            outputs = self.outputs
        else:
            outputs = self.gm(*self.args)
            COUNTERS.eager_steps += 1
        return dict(zip(trace.VERIFIED_OUTPUTS, outputs, strict=True))
