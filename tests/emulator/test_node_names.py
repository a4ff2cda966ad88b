"""Node names as OSC's E2 termination derives them (RIC-E2-TERMINATION/BuildRunName.h), on E2 setup
requests that go through the wire: each case is encoded as an E2setupRequest, decoded, and named. The
expected strings are worked out by hand from BuildRunName.h; the srsRAN one is the default E2 node ID of
the oran-sc-ric example xApps (`--e2_node_id gnbd_001_001_00019b_0`: srsRAN gNB ID 411, 22 bits, DU 0)."""
from __future__ import annotations

import pytest

from e2sm import e2ap
from testbed.e2node import node_configs
from testbed.ric.names import ran_name
from testbed.sim import SimConfig, build_scenario

G = e2ap.GlobalE2NodeId
CASES = [
    (G("00101", 0x19B, 22, du_id=0), "gnbd_001_001_00019b_0"),              # srsRAN gNB-DU (the examples' default)
    (G("00101", 1, 22, du_id=1), "gnbd_001_001_000001_1"),                  # the example
    (G("00101", 0x19B, 22, du_id=26), "gnbd_001_001_00019b_1a"),            # DU ID in hex
    (G("00101", 0x19B, 22), "gnb_001_001_00019b"),                          # gNB, neither ID
    (G("00101", 0x19B, 22, du_id=7, cu_up_id=5), "gnb_001_001_00019b"),     # CU-UP and DU: one gNB
    (G("00101", 0x19B, 22, cu_up_id=31), "gnbc_001_001_00019b_1f"),         # gNB-CU-UP
    (G("00101", 0xDEADBEEF, 32, du_id=1), "gnbd_001_001_deadbeef_1"),       # 32-bit gNB ID: 4 octets
    (G("310410", 5, 24, du_id=1), "gnbd_310_041_000005_1"),                 # 3-digit MNC: OSC prints digit 3 first
    (G("00101", 0x19B, 22, node_type="en-gNB"), "en_gnb_001_001_00019b"),
    (G("00101", 0xABCDE, 20, node_type="ng-eNB"), "ng_enB_macro_001_00_0abcde"),   # prefix+PLMN cut at 19
    (G("00101", 0x3FFFF, 18, node_type="ng-eNB", id_choice="enb-ID-shortmacro"), "ng_enB_shortmacro_0_03ffff"),
    (G("00101", 0x1FFFFF, 21, node_type="ng-eNB", id_choice="enb-ID-longmacro"), "ng_enB_longmacro_00_1fffff"),
    (G("00101", 0xABCDE, 20, node_type="eNB"), "enB_macro_001_001_0abcde"),
    (G("00101", 0xABCDEF1, 28, node_type="eNB", id_choice="home-eNB-ID"), "enB_home_001_001_0abcdef1"),
    (G("00101", 0x12345, 18, node_type="eNB", id_choice="short-Macro-eNB-ID"), "enB_shortmacro_001__012345"),
    (G("00101", 0x12345, 21, node_type="eNB", id_choice="long-Macro-eNB-ID"), "enB_longmacro_001_0_012345"),
]


@pytest.mark.parametrize(("node_id", "name"), CASES, ids=[c[1] for c in CASES])
def test_name_from_an_e2_setup_on_the_wire(node_id, name):
    kpm = e2ap.RanFunctionItem(2, b"\x00", 1, "1.3.6.1.4.1.53148.1.3.2.2")
    req = e2ap.E2SetupRequest(transaction_id=1, node_id=node_id, ran_functions=(kpm,),
                              components=(e2ap.E2NodeComponentConfig("f1", 1, b"\x00", b"\x00"),))
    decoded = e2ap.decode_e2ap(e2ap.encode_e2ap(req))
    assert decoded.node_id == node_id
    assert ran_name(decoded.node_id) == name


def test_the_emulated_nodes_are_gnb_dus_named_by_that_rule():
    configs = node_configs(build_scenario(SimConfig(n_sites=3, n_cells=1)))
    assert [c.inventory_name for c in configs] == ["gnbd_001_001_000001_1", "gnbd_001_001_000002_1",
                                                   "gnbd_001_001_000003_1"]
