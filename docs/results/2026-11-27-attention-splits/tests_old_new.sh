#!/usr/bin/env bash
# The kernel tests that run unmarked on CUDA (fp32 among them), with d710d40's kernels/attention.py and then
# today's: which failures (if any) the change brought. Run from the repository root; logs to $OUT.
set -u
TESTS="tests/kernels/test_attention.py tests/kernels/test_rotary_kv_attention.py tests/kernels/test_block_attention.py tests/kernels/test_invariance.py"
cp kernels/attention.py /tmp/attention_new.py
git show d710d40:kernels/attention.py >kernels/attention.py
timeout 150 python -m pytest -q -p no:cacheprovider $TESTS -k "not empty_split" 2>&1 | tail -12 | tee "$OUT/pytest_old_attention.log"
cp /tmp/attention_new.py kernels/attention.py
timeout 150 python -m pytest -q -p no:cacheprovider $TESTS 2>&1 | tail -12 | tee "$OUT/pytest_new_attention.log"
