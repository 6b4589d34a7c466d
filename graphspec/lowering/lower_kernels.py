"""Swap hot reference ops for SM-specific Triton kernels. (Placeholder until the kernel registry
lands: it lowers nothing, so every op keeps its torch reference.)"""

from __future__ import annotations

import torch.fx as fx

from graphspec.config import PassContext, PassResult

NAME = "lower_kernels"


def kernel_table(gm: fx.GraphModule) -> list[tuple[str, str, str]]:
    return []


def run(gm: fx.GraphModule, ctx: PassContext) -> PassResult:
    return PassResult(gm, changed=False, note="no kernel registry yet")
