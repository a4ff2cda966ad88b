"""The hand-over audit over the SDL ledger (testbed.groundtruth.lease_epoch_overlaps): a lease issued for a
site while another epoch's lease for it could still be acted on is found, whatever became of the earlier one."""
from __future__ import annotations

from testbed.groundtruth import lease_epoch_overlaps


def _l(site, epoch, seq, issued, until, ended=""):
    return {"site_id": site, "epoch": epoch, "lease_id": f"{site}.{epoch}.{seq}", "issued_unix": issued,
            "valid_until_unix": until, "ended": ended}


def test_a_takeover_that_waited_out_the_old_leases_has_no_overlap():
    ledger = [_l("s0", 1, 1, 10.0, 10.3), _l("s0", 1, 57, 15.6, 15.9, "revoked"),   # first and last of epoch 1
              _l("s0", 2, 1, 19.0, 19.3), _l("s0", 2, 40, 23.0, 23.3),
              _l("s1", 2, 1, 10.0, 10.3)]                                           # another site: its own
    assert lease_epoch_overlaps(ledger) == []


def test_a_grant_before_the_previous_owners_hard_end_is_found_even_if_that_lease_was_revoked():
    ledger = [_l("s0", 1, 1, 10.0, 10.3), _l("s0", 1, 57, 15.6, 15.9, "revoked"),
              _l("s0", 2, 1, 15.75, 16.05), _l("s0", 2, 9, 16.6, 16.9)]
    found = lease_epoch_overlaps(ledger)
    assert [(f["lease_id"], f["other_lease_id"]) for f in found] == [("s0.2.1", "s0.1.57")]
    assert abs(found[0]["overlap_ms"] - 150.0) < 1e-6
    # and the other way round: an old owner that granted after the new one began
    late = [_l("s0", 2, 1, 19.0, 19.3), _l("s0", 1, 58, 19.1, 19.4)]
    assert [f["lease_id"] for f in lease_epoch_overlaps(late)] == ["s0.1.58"]
