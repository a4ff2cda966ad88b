"""R-NIB entries are readable with ricxappframe's own R-NIB readers (fake SDL and real Redis)."""
from __future__ import annotations

import pytest
from ricxappframe.entities.rnib import nb_identity_pb2
from ricxappframe.xapp_sdl import SDLWrapper

from testbed.ric.rnib import NAMESPACE, NodeRecord, RanFunctionRecord, RnibWriter, plmn_to_hex, read_nodeb

NODE = NodeRecord("gnb_001_01_00000001", "00101", 1, 22,
                  (RanFunctionRecord(2, bytes(range(40)), 1, "1.3.6.1.4.1.53148.1.3.2.2"),
                   RanFunctionRecord(3, b"\xff\x00", 2, "1.3.6.1.4.1.53148.1.1.2.3")), e2t_address="127.0.0.1:38000")


def _members(sdl):
    out = []
    for raw in sdl.get_members(NAMESPACE, "GNB", usemsgpack=False):
        ident = nb_identity_pb2.NbIdentity()
        ident.ParseFromString(raw)
        out.append(ident)
    return out


def _check(sdl):
    w = RnibWriter(sdl)
    w.node_connected(NODE)
    info = read_nodeb(sdl, NODE.inventory_name)
    assert info.connection_status == nb_identity_pb2.CONNECTED
    assert info.global_nb_id.plmn_id == "00F110" and info.global_nb_id.nb_id == "0" * 21 + "1"
    fns = {rf.ran_function_oid: rf for rf in info.gnb.ran_functions}
    assert bytes.fromhex(fns["1.3.6.1.4.1.53148.1.3.2.2"].ran_function_definition) == bytes(range(40))
    assert fns["1.3.6.1.4.1.53148.1.1.2.3"].ran_function_id == 3
    [ident] = _members(sdl)
    assert ident.inventory_name == NODE.inventory_name and ident.connection_status == nb_identity_pb2.CONNECTED
    w.node_disconnected(NODE)
    [ident] = _members(sdl)  # replaced, not duplicated
    assert ident.connection_status == nb_identity_pb2.DISCONNECTED
    assert read_nodeb(sdl, NODE.inventory_name).connection_status == nb_identity_pb2.DISCONNECTED
    assert read_nodeb(sdl, "gnb_nope") is None


def test_rnib_fake_sdl():
    _check(SDLWrapper(use_fake_sdl=True))


def test_rnib_real_redis(redis_env):
    redis_server = redis_env
    sdl = SDLWrapper()
    _check(sdl)
    # ricxappframe's reader (what an OSC xApp calls) sees the same node.
    import redis
    keys = redis.Redis(port=redis_server["port"]).keys("*")
    assert b"{e2Manager},RAN:gnb_001_01_00000001" in keys


@pytest.mark.parametrize("plmn,hexed", [("00101", "00F110"), ("310410", "130014"), ("99999", "99F999")])
def test_plmn_bcd(plmn, hexed):
    assert plmn_to_hex(plmn) == hexed


@pytest.mark.parametrize("bad", ["", "1234", "1234567", "0010a"])
def test_plmn_refused(bad):
    with pytest.raises(ValueError):
        plmn_to_hex(bad)
