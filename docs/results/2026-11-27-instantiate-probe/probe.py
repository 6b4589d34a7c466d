# ruff: noqa  (the script as run, kept with its results)
"""Probe for issue 14's largest cold-start phase (warm-up and capture, about 0.25 s per captured program on an H200):
how long a CUDA graph of N small kernels takes to record, to end its capture with instantiation (what
torch.cuda.graph's exit does), and with CUDAGraph(keep_graph=True) to end capture and instantiate() apart; and
whether instantiating several graphs on threads overlaps. Synthetic graphs (chains of one elementwise kernel),
so only the node-count part of the cost shows, not module loading of many distinct kernels.

    python docs/results/2026-11-27-instantiate-probe/probe.py
"""

import time
from concurrent.futures import ThreadPoolExecutor

import torch

x = torch.randn(4096, device="cuda")


def body(n: int) -> torch.Tensor:
    y = x
    for _ in range(n):
        y = torch.add(y, 1.0)
    return y


def capture(n: int, keep: bool):
    graph = torch.cuda.CUDAGraph(keep_graph=keep)
    torch.cuda.synchronize()
    began = time.perf_counter()
    with torch.cuda.graph(graph):
        body(n)
        recorded = time.perf_counter()
    ended = time.perf_counter()
    return graph, recorded - began, ended - recorded


body(10)
torch.cuda.synchronize()
for n in (500, 1500, 3000):
    _, record, end = capture(n, keep=False)
    graph, record_k, end_k = capture(n, keep=True)
    began = time.perf_counter()
    graph.instantiate()
    instantiate = time.perf_counter() - began
    print(
        f"{n:5d} kernels: record {record * 1e3:6.1f} ms, end of capture with instantiation {end * 1e3:6.1f} ms; "
        f"keep_graph: end {end_k * 1e3:6.1f} ms, instantiate() {instantiate * 1e3:6.1f} ms",
        flush=True,
    )
graphs = [capture(1500, keep=True)[0] for _ in range(8)]
began = time.perf_counter()
for graph in graphs[:4]:
    graph.instantiate()
serial = time.perf_counter() - began
began = time.perf_counter()
with ThreadPoolExecutor(4) as pool:
    list(pool.map(lambda graph: graph.instantiate(), graphs[4:]))
threaded = time.perf_counter() - began
print(
    f"4 graphs of 1500 kernels: instantiate() one after another {serial * 1e3:.1f} ms, on 4 threads {threaded * 1e3:.1f} ms"
)
for graph in graphs:
    graph.replay()
torch.cuda.synchronize()
print("replayed all")
