"""How traced programs name their weight inputs: "target.<name>" for the target's parameters and buffers,
"draft.<name>" for the drafter's (trace.StepSignature, trace_prefill.PrefillSignature, the artifact's manifest). The
registry reads these names to tell a model weight, which no kernel writes, from any other input (the GEMVs ask for
their first weight tile before they wait for earlier kernels), and the CPU runtime to pack the drafter's weights in its
own dtype."""

from __future__ import annotations

from collections.abc import Iterable

TARGET_PREFIX = "target."
DRAFT_PREFIX = "draft."


def weight_input_names(target_params: Iterable[str], draft_params: Iterable[str] = ()) -> tuple[str, ...]:
    """The input names of the target's and the drafter's weights, in this order."""
    return tuple(TARGET_PREFIX + name for name in target_params) + tuple(DRAFT_PREFIX + name for name in draft_params)


def is_weight_input(name: str) -> bool:
    """Whether an input name is a target's or a drafter's weight."""
    return name.startswith((TARGET_PREFIX, DRAFT_PREFIX))


def is_draft_weight(name: str) -> bool:
    """Whether an input name is a drafter's weight."""
    return name.startswith(DRAFT_PREFIX)
