"""The srsRAN oran-sc-ric example xApps and FlexRIC's OAI example against the emulated DU, with their own
encodings (tests/emulator/peers.py): subscriptions for KPM styles 1-5 are admitted and every indication
decodes with the peer's compiled module; their PRB quota controls are acknowledged and applied as the DU they
address applies them."""
from __future__ import annotations

import numpy as np
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
    # style 3 as srsRAN's DU answers it (testbed.e2node.dialects): the conditions are not checked, every UE
    # matches, and the one measData item holds one value per UE, the UE's own
    (cond,) = got[3][1]["measCondUEidList"]
    assert [u["ueID"][1]["gNB-CU-UE-F1AP-ID"] for u in cond["matchingUEidList"]] == [u.f1ap_id for u in ues]
    (item,) = got[3][1]["measData"]
    assert [v[1] for v in item["measRecord"]] == pytest.approx([per_ue[u.f1ap_id][0][1] for u in ues], rel=1e-9)


def test_srsran_headers_carry_the_collection_time_only_and_the_standard_nodes_all_four_fields():
    got = {}
    for table in ("srsran", "oai"):
        model, node = _world("v4.00", rc_table=table)   # the peer's module is v4.00
        _subscribe(node, 1)
        (o,) = node.on_period(from_period_report(model.step_period(), 0, 132), 1000.0, NTP_2026)
        kind, got[table] = peers.kpm().decode("E2SM-KPM-IndicationHeader", e2ap.decode_e2ap(o.payload).header)[
            "indicationHeader-formats"]
        assert kind == "indicationHeader-Format1"
    assert set(got["srsran"]) == {"colletStartTime"}
    assert {"fileFormatversion", "senderName", "senderType", "vendorName"} <= set(got["oai"])


def test_style_3_by_condition_on_a_standard_node():
    model, node = _world("v3.00", rc_table="oai")
    _subscribe(node, 3)
    _subscribe(node, 4)
    o3, o4 = node.on_period(from_period_report(model.step_period(), 0, 132), 1000.0, NTP_2026)
    body = {i: peers.kpm().decode("E2SM-KPM-IndicationMessage", e2ap.decode_e2ap(o.payload).message)
            ["indicationMessage-formats"][1] for i, o in ((3, o3), (4, o4))}
    per_ue = [r["measReport"]["measData"][0]["measRecord"][0][1] for r in body[4]["ueMeasReportList"]]
    (item,) = body[3]["measData"]
    assert item["measRecord"][0][1] == pytest.approx(sum(per_ue), rel=1e-9)   # the sum over the matching UEs


def test_rc_xapp_controls_are_acked_and_limit_the_ue_they_name():
    model, node = _world("v4.00")
    before = model.quota.copy()
    ue0 = node.config.ues.get(0)
    for n, (lo, hi, ded) in enumerate(peers.SRSRAN_CONTROLS, start=1):
        req = peers.srsran_control_request(*peers.srsran_quota(lo, hi, ded), requestor=n)
        (out,) = node.receive(12040, req)
        assert out.mtype == CONTROL_ACK, e2ap.decode_e2ap(out.payload)
        ack = e2ap.decode_e2ap(out.payload)
        assert ack.request_id == e2ap.RicRequestId(n, 0)
        assert ack.outcome is None   # srsRAN's ACK carries no RIC Control Outcome
        # what srsRAN's DU does with it (testbed.e2node.dialects.ue_grant_limit, tests/emulator/test_dialect_effects.py):
        # UE 0's grant sizes, not the quota of the slice it names (SST 1 / SD 1, where UE 0 has no bearer)
        assert (model.quota == before).all()
        assert model.limits_dl.tag[0, ue0.cell, ue0.slice] == 0
        assert model.limits_dl.cap[0, ue0.cell, ue0.slice] == pytest.approx(hi / 100)
    assert node.stats.controls_ok == 4 and node.stats.controls_failed == 0
    # with no RICcontrolAckRequest srsRAN answers nothing, a failure included; a standard node answers
    hdr, msg = peers.srsran_quota(10, 30, 100, ue_id=999)
    bare = e2ap.encode_e2ap(e2ap.RicControlRequest(e2ap.RicRequestId(9, 0), 3, hdr, msg, ack_request=None))
    assert node.receive(12040, bare) == [] and node.stats.controls_failed == 1
    _, standard = _world("v4.00", rc_table="oai")
    assert [o.mtype for o in standard.receive(12040, bare)] == [CONTROL_FAILURE]


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
    assert np.isnan(model.nvs_reserved).all()           # the NVS slicer took nothing either
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
    from e2sm import rc  # OAI's ACK: a RIC Control Outcome format 1 with no RAN parameter
    assert rc.decode_control_outcome(e2ap.decode_e2ap(out.payload).outcome).params == ()
    # what OAI does with it (testbed.e2node.dialects.nvs_reserved): its NVS downlink slicer reserves each slice its
    # dedicated ratio, slice 0 (SST 1 / SD 5) 50 %, slice 1 (SST 1 / SD 1) 30 %; min and max are not used, and
    # the RC quotas (which the uplink keeps) are unchanged
    assert model.nvs_reserved[0].tolist() == pytest.approx([0.50, 0.30])
    assert (model.quota == before).all() and node.stats.nvs_applied == [{0: 0.50, 1: 0.30}]
