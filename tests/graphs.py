"""Tiny hand-built FX graphs for pass tests, and a structural graph comparison."""

from __future__ import annotations

import operator

import torch
import torch.fx as fx
from torch._subclasses.fake_tensor import FakeTensorMode

from graphspec import trace

KV_UPDATE = torch.ops.graphspec.kv_update.default
KV_WRITE = torch.ops.graphspec.kv_write.default
ATTENTION = torch.ops.graphspec.attention.default
BLOCK_ATTENTION = torch.ops.graphspec.block_attention.default
ROTARY = torch.ops.graphspec.rotary.default
ROTARY_KV_WRITE = torch.ops.graphspec.rotary_kv_write.default
ROTARY_KV_ATTENTION = torch.ops.graphspec.rotary_kv_attention.default


_FAKE_MODE = FakeTensorMode(allow_non_fake_inputs=True)


# The stub step's states: a target and a draft-model KV cache, as the draft-model drafter declares.
STATES = ("target_cache", "draft_cache")
SPECULATED = trace.SPECULATE_OUTPUTS[:3]  # target_logits, draft_logits, draft_tokens


def _placeholder(graph: fx.Graph, name: str, value: torch.Tensor) -> fx.Node:
    """A placeholder carrying a fake value, as traced graphs do, so passes can read shapes; states
    carry their rollback rule as trace_step tags them."""
    node = graph.placeholder(name)
    node.meta["gs_input"] = name
    node.meta["val"] = _FAKE_MODE.from_tensor(value)
    if name in STATES:
        node.meta["gs_state"] = "length"
    return node


def stub_inputs() -> tuple[str, ...]:
    """Placeholder names of the stubs, in order: the step's row inputs and states, then SPECULATED."""
    return (*trace.ROW_INPUTS, *STATES, *SPECULATED)


def step_values(batch: int = 3, k: int = 2, vocab: int = 11, slots: int = 4) -> dict[str, torch.Tensor]:
    """Concrete values for every step input plus the speculate outputs, small and random."""
    generator = torch.Generator().manual_seed(0)
    return {
        "last_tokens": torch.randint(0, vocab, (batch, 2), generator=generator),
        "committed_len": torch.randint(2, 20, (batch,), generator=generator),
        "slot_ids": torch.arange(batch),
        "row_valid": torch.tensor([True] * (batch - 1) + [False]),
        "temperature": torch.zeros(batch),
        "top_k": torch.zeros(batch, dtype=torch.int64),
        "top_p": torch.ones(batch),
        "seed": torch.arange(batch),
        "step_counter": torch.ones(batch, dtype=torch.int64),
        "target_cache": torch.randn(1, 2, slots, 1, 32, 4, generator=generator),
        "draft_cache": torch.randn(1, 2, slots, 1, 32, 4, generator=generator),
        "target_logits": torch.randn(batch, k + 1, vocab, generator=generator),
        "draft_logits": torch.randn(batch, k, vocab, generator=generator),
        "draft_tokens": torch.randint(0, vocab, (batch, k), generator=generator),
    }


def speculate_stub(values: dict[str, torch.Tensor]) -> fx.GraphModule:
    """Step inputs + the speculate outputs as placeholders, returned as the traced program returns
    them (SPECULATED, then the states): the shape of a traced program with the models cut out."""
    graph = fx.Graph()
    nodes = {name: _placeholder(graph, name, values[name]) for name in stub_inputs()}
    output = graph.output(tuple(nodes[name] for name in (*SPECULATED, *STATES)))
    output.meta["gs_outputs"] = (*SPECULATED, *STATES)
    return fx.GraphModule(torch.nn.Module(), graph)


def verified_stub_expected(values: dict[str, torch.Tensor]) -> fx.GraphModule:
    """What insert_verify must produce from speculate_stub in greedy mode, built by hand."""
    graph = fx.Graph()
    nodes = {name: _placeholder(graph, name, values[name]) for name in stub_inputs()}
    verify = graph.call_function(
        torch.ops.graphspec.verify_greedy.default, (nodes["target_logits"], nodes["draft_tokens"])
    )
    tokens = graph.call_function(operator.getitem, (verify, 0))
    accepted = graph.call_function(operator.getitem, (verify, 1))
    commit = graph.call_function(
        torch.ops.graphspec.commit.default, (nodes["committed_len"], nodes["last_tokens"], tokens, accepted)
    )
    next_len = graph.call_function(operator.getitem, (commit, 0))
    next_last = graph.call_function(operator.getitem, (commit, 1))
    counter = graph.call_function(torch.ops.aten.add.Tensor, (nodes["step_counter"], 1))
    graph.output((tokens, accepted, next_len, next_last, counter, nodes["target_cache"], nodes["draft_cache"]))
    return fx.GraphModule(torch.nn.Module(), graph)


def kv_chain(layers: int = 2, functional: bool = True) -> fx.GraphModule:
    """cache -> (kv_update -> attention) x layers -> output(cache version), the KV pattern of a model;
    with functional=False, the in-place form defunctionalize_kv must produce."""
    graph = fx.Graph()
    q, cache, slots, start, k, v = (graph.placeholder(n) for n in ("q", "cache", "slot_ids", "start_pos", "k", "v"))
    current, outs = cache, []
    for layer in range(layers):
        if functional:
            current = graph.call_function(KV_UPDATE, (current, layer, slots, start, k, v))
        else:
            graph.call_function(KV_WRITE, (cache, layer, slots, start, k, v))
        outs.append(graph.call_function(ATTENTION, (q, current, layer, slots, start, 0.5)))
    graph.output((outs[-1], current))
    return fx.GraphModule(torch.nn.Module(), graph)


def kv_chain_inputs(layers: int = 2) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    return [
        torch.randn(2, 2, 3, 4, generator=generator),  # q [B, Hq, T, D]
        torch.randn(layers, 2, 3, 1, 16, 4, generator=generator),  # cache
        torch.tensor([0, 2]),
        torch.tensor([4, 7]),
        torch.randn(2, 1, 3, 4, generator=generator),
        torch.randn(2, 1, 3, 4, generator=generator),
    ]


def rotary_kv_chain(
    regions: tuple[str, ...] = ("draft", "verify"), fused: bool = False, fused_attention: bool = False,
    block: bool = False,
) -> fx.GraphModule:  # fmt: skip
    """One layer per entry of `regions`: rotary -> kv_write of the rotated k -> attention of the rotated q
    on one in-place cache, the per-layer pattern of a step after defunctionalize_kv, each layer's ops
    tagged with its region. With fused=True, the form fuse_rotary_kv must produce; with fused_attention
    also, the form fuse_kv_attention makes of that. block=True: block_attention (DFlash's non-causal
    block) instead of attention. Outputs: every layer's attention, then the cache."""
    graph = fx.Graph()
    names = ("q", "k", "v", "cos", "sin", "cache", "slot_ids", "start_pos")
    q, k, v, cos, sin, cache, slots, start = (graph.placeholder(name) for name in names)
    outs = []
    for layer, region in enumerate(regions):
        if fused_attention:
            args = (q, k, v, cos, sin, cache, layer, slots, start, 0.5) + ((None, None, 1e-6, False) if block else ())
            node = graph.call_function(ROTARY_KV_ATTENTION, args)
            node.meta["gs_region"] = region
            outs.append(node)
            continue
        if fused:
            nodes = [graph.call_function(ROTARY_KV_WRITE, (q, k, v, cos, sin, cache, layer, slots, start))]
            q_rot = nodes[0]
        else:
            rotated = graph.call_function(ROTARY, (q, k, cos, sin))
            q_rot = graph.call_function(operator.getitem, (rotated, 0))
            k_rot = graph.call_function(operator.getitem, (rotated, 1))
            nodes = [rotated, q_rot, k_rot, graph.call_function(KV_WRITE, (cache, layer, slots, start, k_rot, v))]
        attend = BLOCK_ATTENTION if block else ATTENTION
        nodes.append(graph.call_function(attend, (q_rot, cache, layer, slots, start, 0.5)))
        for node in nodes:
            node.meta["gs_region"] = region
        outs.append(nodes[-1])
    graph.output((*outs, cache))
    return fx.GraphModule(torch.nn.Module(), graph)


def rotary_kv_chain_inputs(dtype: torch.dtype = torch.float32, layers: int = 2) -> list[torch.Tensor]:
    """Inputs of rotary_kv_chain: GQA (4 q heads, 2 kv heads), q/k/v as the decoder passes them
    (transposed views into one fused qkv projection), rows in scattered cache slots."""
    generator = torch.Generator().manual_seed(2)
    batch, t, q_heads, kv_heads, head_dim = 2, 3, 4, 2, 8
    qkv = torch.randn(batch, t, (q_heads + 2 * kv_heads) * head_dim, generator=generator).to(dtype)
    q, k, v = qkv.split([q_heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], dim=-1)
    angles = torch.rand(batch, t, head_dim // 2, generator=generator) * 50
    angles = torch.cat((angles, angles), dim=-1)
    return [
        q.view(batch, t, q_heads, head_dim).transpose(1, 2),
        k.view(batch, t, kv_heads, head_dim).transpose(1, 2),
        v.view(batch, t, kv_heads, head_dim).transpose(1, 2),
        angles.cos(),
        angles.sin(),
        torch.randn(layers, 2, 3, kv_heads, 16, head_dim, generator=generator).to(dtype),
        torch.tensor([2, 0]),
        torch.tensor([4, 13]),
    ]


def _structure(gm: fx.GraphModule) -> list[tuple]:
    index = {}
    rows = []

    def arg(a: object) -> object:
        if isinstance(a, fx.Node):
            return ("node", index[a])
        if isinstance(a, (list, tuple)):
            return tuple(arg(x) for x in a)
        return a

    for position, node in enumerate(gm.graph.nodes):
        index[node] = position
        target = node.target if node.op != "placeholder" else None
        rows.append((node.op, target, arg(node.args), tuple(sorted((k, arg(v)) for k, v in node.kwargs.items()))))
    return rows


def assert_graph_equal(actual: fx.GraphModule, expected: fx.GraphModule) -> None:
    """Same ops, targets and argument structure in the same order (not the same printed text)."""
    got, want = _structure(actual), _structure(expected)
    assert len(got) == len(want), (
        f"{len(got)} nodes, expected {len(want)}:\n{actual.graph}\nexpected:\n{expected.graph}"
    )
    for position, (g, w) in enumerate(zip(got, want, strict=True)):
        assert g == w, f"node {position} differs: {g} != {w}\n{actual.graph}\nexpected:\n{expected.graph}"
