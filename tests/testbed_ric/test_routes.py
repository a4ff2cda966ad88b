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
