# ruff: noqa  (the script as run, kept with its results: `python full_collection.py ART`, ART the 32/16-layer CPU artifact)
import gc, sys, time
import graphspec

rt = graphspec.Runtime.load(sys.argv[1])
gc.collect()
t = time.perf_counter()
gc.collect()
print(f"full collection after load: {1e3 * (time.perf_counter() - t):.0f} ms, tracked objects {len(gc.get_objects())}")
gc.freeze()
t = time.perf_counter()
gc.collect()
print(f"after freeze: {1e3 * (time.perf_counter() - t):.0f} ms, frozen {gc.get_freeze_count()}")
