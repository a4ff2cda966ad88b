"""R-NIB discovery against what the mini-RIC writes (the same keys and protobufs e2mgr writes)."""
from __future__ import annotations

from ricxappframe.xapp_sdl import SDLWrapper

from testbed.ric.rnib import NodeRecord, RanFunctionRecord, RnibWriter
from xapp.config import E2Config, StaticNode
from xapp.rnib import NAMESPACE, RC_OID, read_rnib, static_nodes

KPM3 = "1.3.6.1.4.1.53148.1.3.2.2"


def test_nodes_and_functions_by_oid():
    sdl = SDLWrapper(use_fake_sdl=True)
    w = RnibWriter(sdl)
    w.node_connected(NodeRecord("gnb-a", "00101", 0x19B, 22, (
        RanFunctionRecord(2, b"\x01\x02\xff", 1, KPM3), RanFunctionRecord(3, b"\x0a", 1, RC_OID))))
    node_b = NodeRecord("gnb-b", "00101", 0x19C, 22, (RanFunctionRecord(147, b"\x05", 1, KPM3),))
    w.node_connected(node_b)
    w.node_disconnected(node_b)
    sdl.set(NAMESPACE, "RAN:broken", b"\xff\xff\xff", usemsgpack=False)
    nodes, problems = read_rnib(sdl)
    by = {n.meid: n for n in nodes}
    assert set(by) == {"gnb-a", "gnb-b"} and len(problems) == 1 and "RAN:broken" in problems[0]
    a = by["gnb-a"]
    assert a.connected and a.kpm.ran_function_id == 2 and a.kpm.definition == b"\x01\x02\xff"
    assert a.rc.ran_function_id == 3 and a.rc.definition == b"\x0a"
    assert not by["gnb-b"].connected and by["gnb-b"].kpm.ran_function_id == 147 and by["gnb-b"].rc is None


def test_static_list_and_its_actuation_mode():
    from xapp.actuate import node_control
    from xapp.config import ActuationConfig

    nodes = static_nodes(E2Config(static_nodes=(StaticNode(meid="n", kpm_function_id=2, rc_function_id=3),
                                                StaticNode(meid="m", kpm_function_id=2, rc_function_id=3,
                                                           envelope=True),
                                                StaticNode(meid="k", kpm_function_id=2))))
    assert nodes[0].kpm.ran_function_id == 2 and nodes[0].rc.ran_function_id == 3 and nodes[0].connected
    modes = [node_control(n, ActuationConfig()).mode for n in nodes]
    assert modes == ["quota", "envelope", "none"]
