"""Plain (non-speculative) decoding of the target model: the oracle every speculative path is tested against.

Deliberately simple: one right-padded prefill for all rows, then one single-token forward per step for
the rows still running. No graph capture, no speculation, no bucket padding. It uses the same model
code, KV-cache layout and graphspec::sample op as the runtime, so in fp32 on CPU greedy output must
equal the runtime's token for token, and both must equal transformers' own greedy generate.

Sampling follows the runtime's random-stream convention: row i of a request seeded `seed` draws from
stream row_seeds(seed, n)[i], and the token generated after c earlier tokens uses counter c on lane 0.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from graphspec import ops
from graphspec.errors import InputError
from graphspec.inputs import check_max_new_tokens, check_prompts, check_sampling, token_id
from graphspec.models.decoder import DecoderLM
from graphspec.models.hybrid import HybridLM
from graphspec.models.target import target_forward, target_states

# Seeds become int64 tensors holding the seed's high 32 bits in the top word, so they must fit in 63 bits.


def row_seeds(seed: int | Sequence[int] | None, count: int) -> torch.Tensor:
    """[count] int64 per-row seeds, a pure function of the request's seed (an int for every row, or
    one per row), never of the row index. seed None draws fresh random seeds. Same function the runtime uses."""
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        raise InputError(f"count must be an int >= 0, got {count!r}")
    return ops.row_seeds(seed, count)


@torch.inference_mode()
def reference_generate(
    model: DecoderLM | HybridLM,
    prompts: list[list[int]],
    max_new_tokens: int,
    *,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
    seed: int | Sequence[int] | None = None,
    stop_token_ids: Sequence[int] = (),
    max_seq_len: int | None = None,
) -> list[list[int]]:
    """Generate up to max_new_tokens per prompt; returns only the generated tokens of each prompt.

    A row stops right after emitting any of stop_token_ids (the stop token is included, nothing after
    it). temperature 0 is greedy (argmax of the logits); otherwise tokens are drawn by graphspec::sample
    after temperature, top-k (None or 0: off) and top-p (None: off). max_seq_len sizes the KV cache;
    by default it is just long enough for the longest prompt plus max_new_tokens.
    """
    spec = model.spec
    prompts = check_prompts(prompts, spec.vocab_size)
    check_sampling(temperature, top_k, top_p)
    check_max_new_tokens(max_new_tokens)
    stops = {token_id(t, "stop_token_ids") for t in stop_token_ids or ()}
    longest = max(len(p) for p in prompts)
    needed = longest + max_new_tokens
    if max_seq_len is None:
        max_seq_len = needed
    elif isinstance(max_seq_len, bool) or not isinstance(max_seq_len, int) or max_seq_len < 1:
        raise InputError(f"max_seq_len must be None or an int >= 1, got {max_seq_len!r}")
    for index, prompt in enumerate(prompts):
        if len(prompt) + max_new_tokens > max_seq_len:
            raise InputError(
                f"prompt {index} ({len(prompt)} tokens) + max_new_tokens {max_new_tokens} = "
                f"{len(prompt) + max_new_tokens} exceeds max_seq_len {max_seq_len}"
            )
    # graphspec attention is full causal attention; past a sliding window it would silently differ
    # from the checkpoint's own model (Mistral v0.1), so refuse instead.
    window = spec.sliding_window
    if window is not None and needed > window:
        raise InputError(
            f"prompt + max_new_tokens ({needed} tokens) exceeds the model's sliding_window {window}, "
            f"which graphspec does not implement; keep sequences within {window} tokens"
        )

    parameter = next(model.parameters())
    device, dtype = parameter.device, parameter.dtype
    rows = len(prompts)
    lengths = torch.tensor([len(p) for p in prompts], dtype=torch.int64, device=device)  # [B]
    # The target's declared states (a hybrid's linear-attention states beside its KV cache), zeroed.
    states = {state.name: state.allocate(device) for state in target_states(model, rows, max_seq_len, 0, dtype)}
    slot_ids = torch.arange(rows, device=device)

    sampling = temperature > 0
    params = {
        "temperature": torch.full((rows,), float(temperature), dtype=torch.float32, device=device),
        "top_k": torch.full((rows,), top_k or 0, dtype=torch.int64, device=device),
        "top_p": torch.full((rows,), 1.0 if top_p is None else float(top_p), dtype=torch.float32, device=device),
        "seed": row_seeds(seed, rows).to(device),  # also validates seed when decoding greedily
    }

    # Prefill, right-padded: positions past a row's prompt write dead KV beyond its length. Attention
    # masks by position, and the row's next token overwrites position len(prompt) before reading it;
    # linear-attention state stops at each row's length.
    tokens = torch.zeros((rows, longest), dtype=torch.int64, device=device)  # [B, T]
    for row, prompt in enumerate(prompts):
        tokens[row, : len(prompt)] = torch.tensor(prompt, dtype=torch.int64, device=device)
    start = torch.zeros(rows, dtype=torch.int64, device=device)
    hidden, _ = target_forward(model, None, tokens, start, slot_ids, states, "hidden", lengths=lengths, in_place=True)
    logits = model.logits(hidden[torch.arange(rows, device=device), lengths - 1])  # [B, V]

    outputs: list[list[int]] = [[] for _ in range(rows)]
    active = list(range(rows))  # rows still generating, in row order
    while True:
        index = torch.tensor(active, dtype=torch.int64, device=device)
        generated = torch.tensor([len(outputs[row]) for row in active], dtype=torch.int64, device=device)
        if sampling:
            next_tokens = torch.ops.graphspec.sample(
                logits,
                params["temperature"][index],
                params["top_k"][index],
                params["top_p"][index],
                params["seed"][index],
                generated,  # counter: tokens this row has already generated
                0,  # lane 0, as the runtime uses for the token it samples outside a speculation step
            )
        else:
            next_tokens = logits.argmax(dim=-1)  # [A]
        still_active = []
        for row, token in zip(active, next_tokens.tolist(), strict=True):
            outputs[row].append(token)
            if token not in stops and len(outputs[row]) < max_new_tokens:
                still_active.append(row)
        if not still_active:
            return outputs
        # Feed each surviving row's newest token at position len(prompt) + generated - 1.
        keep = [active.index(row) for row in still_active]
        active = still_active
        index = torch.tensor(active, dtype=torch.int64, device=device)
        step_tokens = next_tokens[keep].unsqueeze(1)  # [A, 1]
        positions = lengths[index] + torch.tensor([len(outputs[row]) - 1 for row in active], device=device)
        hidden, _ = target_forward(
            model, None, step_tokens, positions, slot_ids[index], states, "hidden", in_place=True
        )
        logits = model.logits(hidden[:, -1])  # [A, V]
