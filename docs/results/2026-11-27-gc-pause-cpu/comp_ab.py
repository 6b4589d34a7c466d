# ruff: noqa  (the script as run, kept with its results: `python comp_ab.py on|off` in a folder with target/ and draft/)
import gc, sys, time
import graphspec

if sys.argv[1] == "off":
    gc.disable()
t = time.perf_counter()
c = graphspec.compile(
    "target",
    "draft",
    k=4,
    batch_sizes=(1, 4, 8),
    modes=("greedy", "sample"),
    device="cpu",
    dtype="float32",
    max_seq_len=1024,
)
print(sys.argv[1], f"compile {time.perf_counter() - t:.1f} s")
t = time.perf_counter()
rt = graphspec.Runtime(c)
print(sys.argv[1], f"Runtime() {time.perf_counter() - t:.1f} s")
