"""bench/crash_timing.py: crashes placed against other trials' ends, and the chance of that."""

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.crash_timing import covered, crashes, report, tail_probability  # noqa: E402

LOG = """\
[  10.0 s]     2s  a-s0 started
[  10.0 s]     2s  b-s0 started
[  50.0 s]    42s  a-s0 done at step 160/160: train loss 1.1
[  50.3 s]    42s  b-s0 crashed (Segmentation fault in replay): restarting from its last checkpoint
[  80.0 s]    72s  b-s0 crashed (Segmentation fault in replay): restarting from its last checkpoint
[ 110.0 s]   102s  b-s0 done at step 160/160: train loss 1.2
"""


def test_a_crash_just_after_another_trials_end_is_listed_with_that_end_and_others_are_not():
    found = crashes("x.log", LOG, window=0.5)
    assert [(c.t, c.ends_before) for c in found] == [(50.3, (("a-s0", 0.3),)), (80.0, ())]


def test_the_chance_of_a_crash_near_an_end_is_the_share_of_the_span_the_windows_cover():
    # one other trial's end (a-s0 at 50 s; b-s0's own end does not count), span 10-110 s
    assert [c.chance for c in crashes("x.log", LOG, window=0.5)] == [0.005, 0.005]


def test_a_log_of_a_sweep_resumed_in_parts_is_read_part_by_part():
    second = LOG.replace("a-s0 done", "c-s0 done")
    found = crashes("x.log", LOG + second, window=0.5)
    assert len(found) == 4 and found[2].ends_before == (("c-s0", 0.3),)


def test_overlapping_windows_are_counted_once_and_clipped_to_the_span():
    assert covered([1.0, 1.2, 5.0], width=0.5, lo=0.0, hi=5.2) == pytest.approx(0.7 + 0.2)


def test_the_tail_probability_is_exact_for_independent_crashes():
    assert tail_probability([0.5, 0.5], 2) == 0.25
    assert abs(tail_probability([0.1, 0.2, 0.3], 1) - (1 - 0.9 * 0.8 * 0.7)) < 1e-12
    assert tail_probability([0.3], 0) == 1.0


def test_a_crash_just_after_its_own_start_counts_as_at_start_and_not_against_chance():
    log = LOG + "[ 120.0 s]   112s  c-s0 started\n[ 120.3 s]   112s  c-s0 crashed (Segmentation fault in gc)\n"
    found = crashes("x.log", log, window=0.5)
    assert [c.at_start for c in found] == [False, False, True] and found[2].since_start == 0.3
    assert "1 within 0.5 s of their own start" in report(found, 0.5)
    assert "2 mid-run: 1 within 0.5 s after another trial's end" in report(found, 0.5)
