"""`weaver up`'s view of the cross-site tier, as read from the xApp REST API: polls merged by (site, round)
(the xApp keeps only each agent's latest reports), per-site and global figures, and the round flag."""
from __future__ import annotations

import math

import pytest

from testbed.up import RoundsSeen, UpConfig


def _window(site, k, nbytes=400):
    return {"site_id": site, "round": k, "bytes": nbytes, "deadline_unix_ms": 1000 * (k + 1), "workers": 1}


def _report(site, k, committed=True, tokens=100, wait_ms=10.0):
    return {"site_id": site, "round": k, "committed": committed, "participants": 2, "tokens": tokens,
            "bytes_sent": 400, "wall_ms": 1000.0, "wait_ms": wait_ms}


def test_polls_merge_without_double_counting():
    seen = RoundsSeen()
    seen.merge([_window("a", 1), _window("b", 1)], [_report("a", 1), _report("b", 1, tokens=0)])
    # the next poll repeats round 1 (still in the xApp's window) and adds round 2, where b's round failed
    seen.merge([_window("a", 1), _window("a", 2), _window("b", 2)],
               [_report("a", 1), _report("a", 2, tokens=50, wait_ms=30.0), _report("b", 2, committed=False)])
    a, b = seen.site("a"), seen.site("b")
    assert (a["transfer_windows"], a["transfer_bytes_planned"]) == (2, 800)
    assert (a["rounds_reported"], a["rounds_committed"], a["committed_tokens"]) == (2, 2, 150)
    assert a["bytes_sent"] == 800 and a["mean_wait_ms"] == 20.0 and a["median_wait_ms"] == 20.0
    assert (b["rounds_reported"], b["rounds_committed"], b["committed_tokens"]) == (2, 1, 0)   # failed: not counted
    assert seen.committed_rounds() == 2        # round indices are wall-clock slots shared by all sites


def test_a_site_never_heard_from():
    c = RoundsSeen().site("nobody")
    assert c["rounds_reported"] == 0 and c["transfer_windows"] == 0 and math.isnan(c["mean_wait_ms"])


@pytest.mark.parametrize("round_ms", [0, 199, 600_001])
def test_round_length_is_checked(round_ms):
    with pytest.raises(ValueError, match="round-ms"):
        UpConfig(round_ms=round_ms)
