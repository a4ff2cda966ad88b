"""Route tables the mini-RIC renders must parse with an RMR router and route as intended."""
from __future__ import annotations

import pytest

from testbed.ric.routes import (
    RicRoutes,
    RouteTableError,
    e2term_route_table,
    node_route_table,
    submgr_route_table,
    write_route_table,
    xapp_route_table,
)

rmr_routes = pytest.importorskip("xapp.rmr.routes")
RmrSendError = pytest.importorskip("xapp.rmr.message").RmrSendError


def _router(text: str, self_names=frozenset()):
    r = rmr_routes.Router(self_names)
    notes = r.load_text(text)
    assert r.ready, notes
    return r


def test_e2term_routes_indications_by_sub_id_and_controls_by_meid():
    routes = RicRoutes(submgr="127.0.0.1:4561", xapps=("xapp-a:4560", "xapp-b:4560"),
                       nodes={"gnb_001_01_00000001": "127.0.0.1:40001", "gnb_001_01_00000002": "127.0.0.1:40002"},
                       subscriptions={7: "xapp-a:4560", 8: "xapp-b:4560"})
    r = _router(e2term_route_table(routes))
    assert r.targets(12050, 7) == ["xapp-a:4560"]
    assert r.targets(12050, 8) == ["xapp-b:4560"]
    with pytest.raises(RmrSendError):  # unknown sub_id: no default route for indications
        r.targets(12050, 9)
    assert r.targets(12040, -1, "gnb_001_01_00000002") == ["127.0.0.1:40002"]
    assert r.targets(12010, 7, "gnb_001_01_00000001") == ["127.0.0.1:40001"]
    assert r.targets(12011, 7) == ["127.0.0.1:4561"]
    # Control replies as rtmgr routes them: by sub_id to the subscription's owner; any other sub_id
    # to one xApp only (rtmgr's per-xApp default entries, of which RMR keeps the last).
    assert r.targets(12041, 7) == ["xapp-a:4560"] and r.targets(12042, 7) == ["xapp-a:4560"]
    assert r.targets(12041, 8) == ["xapp-b:4560"] and r.targets(12042, 8) == ["xapp-b:4560"]
    assert r.targets(12041, 9) == ["xapp-b:4560"] and r.targets(12041) == ["xapp-b:4560"]


def test_tables_without_nodes_or_xapps_still_commit():
    r = _router(e2term_route_table(RicRoutes(submgr="h:1")))
    assert r.targets(12021) == ["h:1"]


def test_node_submgr_and_xapp_tables():
    assert _router(node_route_table("e2t:38000")).targets(12050, 5) == ["e2t:38000"]
    assert _router(submgr_route_table("e2t:38000")).targets(12010, 5) == ["e2t:38000"]
    r = _router(xapp_route_table("e2t:38000", submgr="submgr:4560"))
    assert r.targets(12040, -1, "any") == ["e2t:38000"]
    assert r.targets(12010) == ["submgr:4560"]


@pytest.mark.parametrize("bad", ["nohost", "h:0", "h:70000", "a|b:1", "a;b:1", ":1"])
def test_bad_endpoints_refused(bad):
    with pytest.raises(RouteTableError):
        node_route_table(bad)


def test_bad_meid_refused():
    with pytest.raises(RouteTableError):
        e2term_route_table(RicRoutes(submgr="h:1", nodes={"x" * 32: "h:2"}))
    with pytest.raises(RouteTableError):
        e2term_route_table(RicRoutes(submgr="h:1", nodes={"a b": "h:2"}))


def test_write_is_atomic_and_leaves_no_temp(tmp_path):
    p = write_route_table(tmp_path / "rt" / "xapp.rt", xapp_route_table("e2t:1"))
    assert p.read_text().startswith("newrt|start")
    assert [f.name for f in p.parent.iterdir()] == ["xapp.rt"]


def test_incremental_updates_leave_the_table_a_full_render_makes():
    """The E2 termination pushes one subscription's routes (updatert) and one node's meid (meid map block) a
    change: after any sequence of them the router holds what the whole table of that state would give."""
    import random

    from testbed.ric.routes import meid_map_update, subscription_route_update

    rng = random.Random(7)
    base = RicRoutes(submgr="127.0.0.1:4561", xapps=("127.0.0.1:4560",), nodes={"n0": "127.0.0.1:40000"})
    nodes, subs = dict(base.nodes), {}
    r = _router(e2term_route_table(base))
    for step in range(300):
        what = rng.random()
        if what < 0.4:
            sid = rng.randrange(1, 60)
            subs[sid] = rng.choice(("127.0.0.1:4560", "127.0.0.1:4570"))
            outcomes = r.apply_update(subscription_route_update(sid, subs[sid]))
        elif what < 0.6 and subs:
            sid = rng.choice(sorted(subs))
            del subs[sid]
            outcomes = r.apply_update(subscription_route_update(sid, None))
        elif what < 0.85:
            meid = f"n{rng.randrange(1, 40)}"
            nodes[meid] = f"127.0.0.1:{41000 + step}"
            outcomes = r.apply_update(meid_map_update({meid: nodes[meid]}))
        else:
            gone = [m for m in nodes if m != "n0"]
            if not gone:
                continue
            meid = rng.choice(sorted(gone))
            del nodes[meid]
            outcomes = r.apply_update(meid_map_update(removed=(meid,)))
        assert all(o.committed for o in outcomes) and not r.update_notes, (outcomes, r.update_notes)
        full = _router(e2term_route_table(RicRoutes(submgr=base.submgr, xapps=base.xapps, nodes=nodes,
                                                    subscriptions=subs)))
        assert dict(r.table.entries) == dict(full.table.entries), step
        assert dict(r.meid_map) == dict(full.meid_map), step


def test_a_bad_update_changes_nothing():
    from testbed.ric.routes import meid_map_update, subscription_route_update

    with pytest.raises(RouteTableError):
        subscription_route_update(0, "127.0.0.1:4560")
    with pytest.raises(RouteTableError):
        subscription_route_update(5, "no-port")
    with pytest.raises(RouteTableError):
        meid_map_update({"has space": "127.0.0.1:1"})
