"""Route-table parsing and lookup, sans-IO (the loopback counts are in test_conformance.py c22-c27)."""
from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from xapp.rmr import RmrSendError, RmrState, Router, parse_route_table
from xapp.rmr.routes import RouteOutcome

ME = frozenset({"me:4560", "10.0.0.5:4560"})
SPEC_EXAMPLE = """\
newrt|start
rte|12050|xapp-a:4560,xapp-b:4560           # indications balanced over two replicas
rte|20011|a1med:4560;audit:4560             # A1 policy response fanned out to both
mse|12010|-1|submgr:4560
mse|12050|77|xapp-c:4560                    # sub_id 77 only; other sub_ids use the rte
mse|12040|-1|%meid                          # RC control to the E2T that owns the node
newrt|end|5
meid_map|start
mme_ar|e2term:38000|gnb_734_733_b5c67788 gnb_734_733_00000002
meid_map|end|1
"""


def router(text: str, me=ME) -> Router:
    r = Router(me)
    r.load_text(text)
    return r


def test_spec_example_table():
    r = router(SPEC_EXAMPLE)
    assert [r.targets(12050)[0] for _ in range(4)] == ["xapp-a:4560", "xapp-b:4560"] * 2
    assert r.targets(20011) == ["a1med:4560", "audit:4560"]
    assert r.targets(12050, 77) == ["xapp-c:4560"]
    assert r.targets(12050, 78)[0] in ("xapp-a:4560", "xapp-b:4560")
    assert r.targets(12010, 5) == ["submgr:4560"]
    assert r.targets(12040, meid="gnb_734_733_00000002") == ["e2term:38000"]
    with pytest.raises(RmrSendError) as e:
        r.targets(12040, meid="gnb_unknown")
    assert e.value.state == RmrState.NOENDPT


def test_p7_subid_position_rte_last_mse_third():
    t = parse_route_table("newrt|start\nrte|1|a:1|42\nmse|2|43|b:1\nnewrt|end|2\n").table
    assert set(t.entries) == {(42, 1), (43, 2)}
    assert t.entries[(42, 1)].groups == (("a:1",),) and t.entries[(43, 2)].groups == (("b:1",),)


def test_no_table_means_noendpt_and_not_ready():
    r = Router(ME)
    assert not r.ready
    with pytest.raises(RmrSendError) as e:
        r.targets(1)
    assert e.value.state == RmrState.NOENDPT
    notes = r.load_text("newrt|start\nrte|1|a:1\n")  # never ends
    assert not r.ready and notes


def test_count_includes_filtered_records():
    r = router("newrt|start\nrte|1,other:1|a:1\nrte|2|b:1\nnewrt|end|2\n")
    assert r.ready and r.table.lookup(1, -1) is None and r.targets(2) == ["b:1"]


@pytest.mark.parametrize("bad", ["rte|x|a:1", "mse|1|notint|a:1", "rte|1", "mse|1|2", "rte|1||", "newrt|end|x"])
def test_bad_record_poisons_the_pending_table(bad):
    r = router("newrt|start|good\nrte|1|a:1\nnewrt|end|1\n")
    notes = r.load_text(f"newrt|start|bad\nrte|1|z:1\n{bad}\nnewrt|end\n")
    assert r.table.table_id == "good" and r.targets(1) == ["a:1"] and notes


def test_meid_map_start_discards_unfinished_table_and_counts():
    r = router("newrt|start\nrte|1|a:1\nnewrt|end\n")
    notes = r.load_text("newrt|start\nrte|1|b:1\nmeid_map|start\nmme_ar|o:1|m1\nmeid_map|end|1\nnewrt|end\n")
    assert r.targets(1) == ["a:1"] and dict(r.meid_map) == {"m1": "o:1"}
    assert any("meid_map|start" in n for n in notes)
    r.load_text("newrt|start\nrte|1|a:1\nnewrt|end\nmeid_map|start\nmme_ar|o:2|m2\nmeid_map|end|3\n")
    assert dict(r.meid_map) == {"m1": "o:1"}  # wrong count: previous map stays


def test_incremental_updates_and_deletes():
    r = router("newrt|start\nrte|1|a:1\nrte|2|b:1\nnewrt|end\n")
    r.apply_update("updatert|start\ndel|1\nrte|3|c:1\n")  # split across route-manager messages
    assert r.targets(1) == ["a:1"]  # nothing applied before the end marker
    r.apply_update("updatert|end|2\n")
    assert r.table.lookup(1, -1) is None and r.targets(2) == ["b:1"] and r.targets(3) == ["c:1"]
    r.apply_update("meid_map|start\nmme_ar|o:1|x y\nmeid_map|end|1\nmeid_map|start\nmme_del|x\nmeid_map|end|1\n")
    assert dict(r.meid_map) == {"y": "o:1"}
    outcomes = r.apply_update("updatert|start|u3\nrte|4|d:1\nupdatert|end|7\n")
    assert r.table.lookup(4, -1) is None
    assert outcomes == [RouteOutcome(False, "u3", "count 7 given, 1 records seen")]
    assert outcomes[0].state_payload() == b"ERR u3 count 7 given, 1 records seen\n"
    ok = r.apply_update("newrt|start|full\nrte|9|z:1\nnewrt|end|1\n")
    assert ok == [RouteOutcome(True, "full")] and ok[0].state_payload() == b"OK full \n"
    assert r.targets(9) == ["z:1"] and r.table.lookup(2, -1) is None  # newrt replaces, updatert amends


def test_self_endpoints_dropped_and_group_emptied():
    r = router("newrt|start\nrte|1|me:4560,a:1;10.0.0.5:4560\nrte|2|me:4560\nnewrt|end\n")
    assert r.table.lookup(1, -1).groups == (("a:1",),)
    with pytest.raises(RmrSendError):
        r.targets(2)


def test_round_robin_cursor_per_group():
    r = router("newrt|start\nrte|1|a:1,b:1;c:1,d:1,e:1\nnewrt|end\n")
    seen = [tuple(r.targets(1)) for _ in range(6)]
    assert seen == [("a:1", "c:1"), ("b:1", "d:1"), ("a:1", "e:1"), ("b:1", "c:1"), ("a:1", "d:1"), ("b:1", "e:1")]


def test_unknown_records_and_records_outside_blocks_are_ignored():
    r = router("hello|world\nrte|1|x:1\nnewrt|start\nrte|1|a:1\nnewrt|end|1\nmme_ar|o:1|m\n")
    assert r.targets(1) == ["a:1"] and dict(r.meid_map) == {}


@given(st.text(max_size=400))
def test_fuzz_parser_never_raises(text):
    r = Router(ME)
    r.load_text(text)
    r.apply_update(text)
