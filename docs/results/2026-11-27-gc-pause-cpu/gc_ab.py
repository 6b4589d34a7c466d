# ruff: noqa  (the script as run, kept with its results)
import gc, sys, time
import graphspec

off = sys.argv[1] == "off"
if off:
    gc.disable()
t = time.perf_counter()
rt = graphspec.Runtime.load("art")
el = time.perf_counter() - t
print(sys.argv[1], f"{el:.2f}", {k: round(v, 2) for k, v in rt.startup_seconds.items()})
