"""The srsRAN oran-sc-ric example xApps and FlexRIC's OAI example against the emulated DU, with their own
encodings (tests/emulator/peers.py): subscriptions for KPM styles 1-5 are admitted and every indication
decodes with the peer's compiled module; their PRB quota controls are acknowledged and applied."""
from __future__ import annotations

import pytest

from e2sm import e2ap
from testbed.e2node import E2Node, from_period_report, node_configs
from testbed.e2node.node import CONTROL_ACK, CONTROL_FAILURE, INDICATION, SUB_RESP
from testbed.model import RanModel
from testbed.sim import SimConfig, build_scenario

from . import peers

NTP_2026 = (3_976_000_000 << 32)


def _world(kpm_version: str, rc_table: str = "srsran", slices: str = "2:1,1:1"):
    scenario = build_scenario(SimConfig(n_sites=1, n_cells=2, slices={"*": slices}))
    model = RanModel(scenario, seed=3, track_delay=False)
    return model, E2Node(node_configs(scenario, kpm_version, rc_table)[0], model)


def _subscribe(node: E2Node, style: int) -> None:
    req = e2ap.RicSubscriptionRequest(e2ap.RicRequestId(123, style), 2, peers.event_trigger(1000),
                                      (e2ap.RicAction(1, "report", peers.action_definition(style)),))
    (out,) = node.receive(12010, e2ap.encode_e2ap(req))
    assert out.mtype == SUB_RESP, e2ap.decode_e2ap(out.payload)


@pytest.mark.parametrize("kpm_version", ["v4.00", "v3.00"])
def test_kpm_monitor_styles_1_to_5_decode_with_the_peers_module(kpm_version):
    model, node = _world(kpm_version)
    for style in range(1, 6):
        _subscribe(node, style)
    m = from_period_report(model.step_period(), 0, 132)
    outs = node.on_period(m, 1000.0, NTP_2026)
    assert [o.mtype for o in outs] == [INDICATION] * 5
    got = {}
    for o in outs:
        ind = e2ap.decode_e2ap(o.payload)
        # the example reads the header as Format1 and the NTP seconds from colletStartTime
        hdr = peers.kpm().decode("E2SM-KPM-IndicationHeader-Format1", ind.header)
        assert int.from_bytes(hdr["colletStartTime"], "big") >> 32 == NTP_2026 >> 32
        kind, body = peers.kpm().decode("E2SM-KPM-IndicationMessage", ind.message)["indicationMessage-formats"]
        got[ind.request_id.instance] = (kind, body)
    ues = node.config.ues.ues
    assert got[1][0] == got[2][0] == "indicationMessage-Format1"
    assert got[3][0] == "indicationMessage-Format2" and got[4][0] == got[5][0] == "indicationMessage-Format3"
    dl_node = got[1][1]["measData"][0]["measRecord"][1][1]   # DRB.UEThpDl of the node (style 1)
    # style 4: ul-rSRP < 1000 holds for every UE; their throughputs sum to the node's
    per_ue = {r["ueID"][1]["gNB-CU-UE-F1AP-ID"]: r["measReport"]["measData"][0]["measRecord"]
              for r in got[4][1]["ueMeasReportList"]}
    assert sorted(per_ue) == [u.f1ap_id for u in ues] and len(ues) == 8
    assert sum(rec[1][1] for rec in per_ue.values()) == pytest.approx(dl_node, rel=1e-9)
    assert dl_node > 0
    # style 2 (UE 0) and style 5 (UEs 0 and the example's filler 1) report those UEs' own values
    assert got[2][1]["measData"][0]["measRecord"] == per_ue[0]
    assert [r["ueID"][1]["gNB-CU-UE-F1AP-ID"] for r in got[5][1]["ueMeasReportList"]] == [0, 1]
    # style 3: one record item per condition (the sum over the matching UEs), the UEs listed
    (cond,) = got[3][1]["measCondUEidList"]
    assert len(cond["matchingUEidList"]) == 8
    assert got[3][1]["measData"][0]["measRecord"][0][1] == pytest.approx(
        sum(rec[0][1] for rec in per_ue.values()), rel=1e-9)


def test_rc_xapp_controls_are_acked_and_applied():
    model, node = _world("v4.00")
    be = 1  # the best-effort slice: SST 1 / SD 1, the one simple_rc_xapp.py controls
    for n, (lo, hi, ded) in enumerate(peers.SRSRAN_CONTROLS, start=1):
        req = peers.srsran_control_request(*peers.srsran_quota(lo, hi, ded), requestor=n)
        (out,) = node.receive(12040, req)
        assert out.mtype == CONTROL_ACK, e2ap.decode_e2ap(out.payload)
        ack = e2ap.decode_e2ap(out.payload)
        assert ack.request_id == e2ap.RicRequestId(n, 0)
        assert (model.quota[0, :, be] == (lo / 100, hi / 100, ded / 100)).all()
    assert node.stats.controls_ok == 4 and node.stats.controls_failed == 0


def test_srsran_rule_refuses_what_srsran_refuses():
    model, node = _world("v4.00")
    before = model.quota.copy()
    hdr, msg = peers.srsran_quota(10, 30, 100, ue_id=999)  # no such UE: srsRAN finds no UE context
    (out,) = node.receive(12040, peers.srsran_control_request(hdr, msg))
    assert out.mtype == CONTROL_FAILURE
    assert e2ap.decode_e2ap(out.payload).cause == e2ap.Cause("misc", "unspecified")
    assert (model.quota == before).all()


def test_flexric_oai_control_follows_the_oai_parser():
    # the example controls SST 1 SD 1 and SST 1 SD 5 of PLMN 505/01 with dedicated 70 % each: the OAI gNB
    # parses it, and its NVS slicer's admission control (`_nvs_nr_admission_control`: the reservations'
    # sum over 1.0 -> -3, so add_mod_rc_slice fails) refuses it; the emulated DU refuses dedicated ratios
    # summing over 100 % too, so the control fails, with nothing applied
    model, node = _world("v3.00", rc_table="oai-gnb", slices="1:5,1:1")
    from e2sm import rc
    from testbed.e2node import rules

    hdr, msg = peers.flexric_slice_control()
    quotas = rules.quotas(node.config, rc.decode_control_header(hdr), rc.decode_control_message(msg), rc.OAI_GNB_IDS)
    assert [(q.plmn, q.sst, q.sd, q.min_ratio, q.max_ratio, q.dedicated_ratio) for q in quotas] == [
        ("50501", 1, 1, 70, 100, 70), ("50501", 1, 5, 30, 51, 70)]   # OAI ignores the max; 51 < min 70 is dropped
    before = model.quota.copy()
    req = e2ap.RicControlRequest(e2ap.RicRequestId(1, 1), 3, hdr, msg, ack_request=True)
    (out,) = node.receive(12040, e2ap.encode_e2ap(req))
    assert out.mtype == CONTROL_FAILURE and (model.quota == before).all()
    # the same tree to a srsRAN-table node: ID 4 is no top-level ID, but 7 is S-NSSAI where srsRAN wants PLMN
    _, srs = _world("v3.00", slices="1:5,1:1")
    (out,) = srs.receive(12040, e2ap.encode_e2ap(req))
    assert out.mtype == CONTROL_FAILURE


def test_flexric_oai_control_within_oai_s_admission_control_is_acked_and_applied():
    # the same FlexRIC encoding with reservations OAI's NVS admission control takes (30 % + 50 %)
    model, node = _world("v3.00", rc_table="oai-gnb", slices="1:5,1:1")
    hdr, msg = peers.flexric_slice_control(dedicated=(30, 50))
    req = e2ap.RicControlRequest(e2ap.RicRequestId(1, 2), 3, hdr, msg, ack_request=True)
    before = model.quota.copy()
    (out,) = node.receive(12040, e2ap.encode_e2ap(req))
    assert out.mtype == CONTROL_ACK, e2ap.decode_e2ap(out.payload)
    assert not (model.quota == before).all()
    # slice 0 is SST 1 / SD 5 (min 30, max 51, dedicated 50), slice 1 SST 1 / SD 1 (min 70; its max 51 is
    # below the min, which OAI would not read: 100; dedicated 30)
    assert all(cell == pytest.approx((0.30, 0.51, 0.50)) for cell in model.quota[0, :, 0].tolist())
    assert all(cell == pytest.approx((0.70, 1.00, 0.30)) for cell in model.quota[0, :, 1].tolist())
