"""graphspec::prefill_attention on the CPU: a prefill chunk's keys and values written into each row's slot,
then each row's queries attend over the positions they can see, [0, start_pos[b] + T), not the whole cache.

The reference (graphspec.ops.prefill_attention_reference) is exactly kv_write then attention, and attention
reads and scores all max_seq_len positions of every row. The chunk's write plus a prefix-only attention is
what kernels/rotary_kv_attention_cpu.py's kv_attention already does for the step's cache write + attention,
with these very arguments: plain slice copies of the values the reference's indexed write stores, then
kernels/attention_cpu.py's per-row attention (the chunk's causal triangle shifted by the row's start). A
padded row's chunk is written and attended like the reference's; its outputs are never read.

Reads slots and starts on the host, so it is never captured: the runtime applies the CPU table only to
programs it runs eagerly on the CPU (runtime/prefill.py). Imports torch only.
"""

from __future__ import annotations

from graphspec.kernels import cpu_library
from graphspec.kernels.rotary_kv_attention_cpu import kv_attention, kv_attention_fake

from graphspec.ops import prefill_attention_reference

__all__ = ["CONFIGS", "prefill_attention", "prefill_attention_cpu", "prefill_attention_reference"]

CONFIGS: dict[str, dict[str, int]] = {"cpu": {}}

prefill_attention = kv_attention  # the reference's arguments, in its order; its fake too
prefill_attention_cpu = cpu_library.define("prefill_attention", prefill_attention, kv_attention_fake)
