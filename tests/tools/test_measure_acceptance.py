"""tools/measure_acceptance.py's loop classification: which steps continue a loop, and the mean accepted over
the others."""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tools"))

import measure_acceptance  # noqa: E402


def test_a_position_is_in_a_loop_when_it_completes_a_4gram_seen_before():
    text = [1, 2, 3, 4, 1, 2, 3, 4, 9]
    assert [measure_acceptance.in_loop(text, at) for at in range(len(text))] == [
        False, False, False, False, False, False, False, True, False,
    ]  # fmt: skip


def test_measure_reports_the_steps_outside_loops(monkeypatch):
    # After the prompt [1] the target "generates" 5 6 7 8 5 6 7 8 5 6; a drafter that proposes nothing
    # accepts 0 at every step, so each of the 10 positions starts a step: the first 7 complete no 4-gram
    # seen before, the last three (5 6 7 8, 6 7 8 5, 7 8 5 6 again) do.
    continuation = [5, 6, 7, 8, 5, 6, 7, 8, 5, 6]
    monkeypatch.setattr(measure_acceptance, "continuation", lambda *args: (continuation + [0] * 4, len(continuation)))

    class Silent:
        def proposer(self, full, k):
            return lambda at: []

    result = measure_acceptance.measure(None, Silent(), [("p", [1])], k=4, new_tokens=10, eos=set())
    full = [1, *continuation]
    expected_outside = sum(not measure_acceptance.in_loop(full, at) for at in range(1, 11))
    assert result.steps == 10 and result.steps_outside_loops == expected_outside == 7
    assert result.mean_accepted_outside_loops == 0.0
