# ruff: noqa  (the script as run, kept with its results: `python comp_mem.py on|off` beside target/ and draft/)
# (Run while compile carried @paused_gc(), e31ee4e: "on" called the undecorated compile.__wrapped__.)
import gc, sys, time, resource
import graphspec
from graphspec import compiler

if sys.argv[1] == "on":  # undo the pause: compile's own decorator; re-enable inside by wrapping
    import graphspec.gc_pause as gp
    from contextlib import nullcontext
t = time.perf_counter()
if sys.argv[1] == "on":
    fn = compiler.compile.__wrapped__  # the undecorated function
else:
    fn = compiler.compile
c = fn(
    "target",
    "draft",
    k=4,
    batch_sizes=(1, 4, 8),
    modes=("greedy", "sample"),
    device="cpu",
    dtype="float32",
    max_seq_len=1024,
)
print(
    sys.argv[1],
    f"compile {time.perf_counter() - t:.1f} s, peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB",
)
