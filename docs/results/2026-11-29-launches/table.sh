#!/bin/bash
# Issue 13's table with solo rows on (0b663e8), next to the B = 16 run with them off (solo_off.diff), in one call.
# Ran at 0b663e8; solo rows were reverted after it (docs/BENCHMARKS.md, 2026-11-29), so it applies to 0b663e8 only.
#   OUT=... COMMIT=$(git rev-parse --short HEAD) bash docs/results/2026-11-29-launches/table.sh
# COMMIT is passed in because the device copy's .git can lag the working tree it runs.
set -u
here=docs/results/2026-11-29-launches
python -m pip install --no-deps --no-build-isolation -q -e . > /dev/null 2>&1
echo "${COMMIT:-unknown}" > "$OUT/commit.txt"
run() {  # run NAME LIMIT ARGS: one bench of the tree as it is now
  timeout "$2" python benchmarks/bench_drafters.py $3 --json "$OUT/$1.json" 2>&1 | grep -v "warm-up" | tail -8 > "$OUT/$1.log"
}
git apply "$here/solo_off.diff" && run short_off 170 "--drafters mtp,eagle3 --token-map-sizes 16384 --batch-sizes 16"
git apply -R "$here/solo_off.diff" && run table 380 \
  "--drafters mtp,eagle3 --token-map-sizes 16384 --batch-sizes 1,4,16,64 --k-by-bucket 64:1"
