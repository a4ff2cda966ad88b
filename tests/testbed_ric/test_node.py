"""The sans-IO E2 node: bytes in, bytes out, against the real RAN model. Invariant of the fuzz tests:
any bytes from the RIC give a list of well-formed E2AP replies, never an exception."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from e2sm import e2ap, kpm, rc
from testbed.e2node.config import NodeConfig, NodeConfigError, SliceId, node_configs
from testbed.e2node.measure import CellMeasurements, SiteMeasurements, SliceMeasurements, measure
from testbed.e2node.node import E2Node
from testbed.model import CellConfig, RanModel, Scenario, SiteConfig
from testbed.ric.e2term import ran_name

SCEN = Scenario("t", "two cells", sites=(SiteConfig(0, cells=(CellConfig(),) * 2),))
V3 = kpm.KpmVersion.V3_00


def _node(**kw) -> tuple[E2Node, RanModel]:
    model = RanModel(SCEN, seed=1)
    cfg = node_configs(SCEN, overrides={0: kw})[0]
    return E2Node(cfg, model), model


def _subscribe(node: E2Node, period_ms: int = 100, instance: int = 5) -> list:
    version = kpm.KpmVersion.V3_00 if node.config.kpm_version == "v3.00" else kpm.KpmVersion.V2_03
    act = kpm.encode_action_definition(kpm.KpmActionDefinition(1, kpm.ActionDefFormat1(
        (kpm.MeasInfo("GPU.SmUsed.Mean"), kpm.MeasInfo("RRU.PrbTotDl")), period_ms)), version)
    req = e2ap.RicSubscriptionRequest(e2ap.RicRequestId(123, instance), node.config.kpm_function_id,
                                      kpm.encode_event_trigger(kpm.KpmEventTrigger(period_ms), version),
                                      (e2ap.RicAction(1, "report", act),))
    return node.receive(12010, e2ap.encode_e2ap(req))


def _meas(sm_mean=10.0) -> SiteMeasurements:
    s = (SliceMeasurements(5, 2, 100.0, 0.5), SliceMeasurements(50, 20, 1000.0, 8.0))
    return SiteMeasurements((CellMeasurements(273, 273, s), CellMeasurements(273, 273, s)), sm_mean, 40.0, 132, 0)


def test_setup_request_names_node_like_e2mgr():
    node, _ = _node()
    out = node.setup_request()
    req = e2ap.decode_e2ap(out.payload)
    assert out.mtype == 12001 and isinstance(req, e2ap.E2SetupRequest)
    assert ran_name(req.node_id) == node.config.inventory_name == "gnbd_001_001_000001_1"
    oids = {f.oid for f in req.ran_functions}
    assert oids == {kpm.KPM_OID_V3, rc.RC_OID}
    assert _node(kpm_version="v2.03")[0].setup_request().payload != out.payload


def test_reporting_period_and_sequence_numbers():
    node, _ = _node()
    [resp] = _subscribe(node, period_ms=300)
    assert resp.mtype == 12011
    sent = [len(node.on_period(_meas(), t, 1 << 40)) for t in range(0, 1000, 100)]
    assert sent == [1, 0, 0, 1, 0, 0, 1, 0, 0, 1]
    ind = e2ap.decode_e2ap(node.on_period(_meas(), 1200, 1 << 40)[0].payload)
    assert ind.sn == 4 and ind.request_id == e2ap.RicRequestId(123, 5)
    rec = kpm.decode_indication_message(ind.message, V3).records[0]
    assert rec == (10.0, round(100 * 110 / 546))


def test_duplicate_subscription_and_unknown_delete_fail_with_causes():
    node, _ = _node()
    _subscribe(node)
    [dup] = _subscribe(node)
    assert dup.mtype == 12012
    assert e2ap.decode_e2ap(dup.payload).cause.value == "duplicate-ric-request-id"
    [nope] = node.receive(12020, e2ap.encode_e2ap(e2ap.RicSubscriptionDeleteRequest(e2ap.RicRequestId(123, 9), 2)))
    assert nope.mtype == 12022 and e2ap.decode_e2ap(nope.payload).cause.value == "request-id-unknown"
    [ok] = node.receive(12020, e2ap.encode_e2ap(e2ap.RicSubscriptionDeleteRequest(e2ap.RicRequestId(123, 5), 2)))
    assert ok.mtype == 12021 and node.subscriptions == {}


def test_quota_control_reaches_every_cell_of_the_model():
    node, model = _node(rc_table="oai")
    hdr = rc.encode_control_header(rc.RcControlHeader(2, 6))
    msg = rc.encode_control_message(rc.build_prb_quota_control([rc.SliceQuota("00101", 1, 2, 10, 40, 5)], rc.OAI_IDS))
    req = e2ap.RicControlRequest(e2ap.RicRequestId(7, 1), 3, hdr, msg)
    [ack] = node.receive(12040, e2ap.encode_e2ap(req))
    assert ack.mtype == 12041
    outcome = rc.decode_control_outcome(e2ap.decode_e2ap(ack.payload).outcome)
    assert outcome.params == ((1, 100), (10, 10), (11, 40))  # OAI IDs: min 10, max 11
    assert model.quota[0, :, 1].tolist() == [[0.10, 0.40, 0.05]] * 2
    # noAck: applied, nothing sent back.
    req = e2ap.RicControlRequest(e2ap.RicRequestId(7, 2), 3, hdr, msg, ack_request=False)
    assert node.receive(12040, e2ap.encode_e2ap(req)) == []


def test_measure_scopes():
    sl = (SliceId(2, 1), SliceId(1, 2))
    m = _meas()
    assert measure(m, sl, "RRU.PrbUsedDl", None, None) == 110
    assert measure(m, sl, "RRU.PrbUsedDl", (1, 2), 0) == 50
    assert measure(m, sl, "RRU.PrbUsedDl.SNSSAI", None, 0) is None
    assert measure(m, sl, "RRU.PrbUsedDl", (9, None), 0) is None
    assert measure(m, sl, "RRU.PrbUsedDl", (1, None), 1) == 50  # SST only matches any SD
    assert measure(m, sl, "RRU.PrbAvailDl", None, None) == 546
    assert measure(m, sl, "GPU.SmUsed.Max", None, 1) == 40
    assert measure(m, sl, "DRB.UEThpDl.SNSSAI", (2, 1), None) == 200.0
    assert measure(m, sl, "DRB.RlcSduDelayDl", None, 0) == pytest.approx((0.5 * 100 + 8 * 1000) / 1100)
    assert measure(m, sl, "GPU.SmEnvelope", None, None) is None
    m2 = SiteMeasurements(m.cells, 10.0, 40.2, 132, 3, 12.0, 55.5, 20.01, 4.5, 96.0)
    assert [measure(m2, sl, n, None, None) for n in ("GPU.SmUsed.Max", "GPU.SmOffered.Mean", "GPU.SmOffered.Max",
            "GPU.SmNonDeferrable.Max", "GPU.BeAddedDelay.Max", "GPU.SmEnvelope", "GPU.DeadlineMiss")] == [
        41, 12.0, 56, 21, 4.5, 96, 3]


def test_config_refuses_bad_fields():
    with pytest.raises(NodeConfigError, match="kpm_version"):
        NodeConfig(0, 1, (SliceId(1, None),), kpm_version="v1")
    with pytest.raises(NodeConfigError, match="rc_table"):
        NodeConfig(0, 1, (SliceId(1, None),), rc_table="nokia")
    with pytest.raises(NodeConfigError):
        NodeConfig(0, 1, (SliceId(1, None),), kpm_function_id=3, rc_function_id=3)


def _check_replies(outs) -> None:
    for out in outs:
        assert out.mtype in (10030, 12011, 12012, 12021, 12022, 12041, 12042)
        e2ap.decode_e2ap(out.payload)  # every reply is well-formed E2AP


@settings(max_examples=150, deadline=None)
@given(st.sampled_from([12010, 12020, 12040, 12002, 1]), st.binary(max_size=200))
def test_fuzz_random_bytes(mtype, data):
    node, _ = _node()
    _check_replies(node.receive(mtype, data))


_VALID = []


def _valid_pdus() -> list[bytes]:
    if not _VALID:
        node, _ = _node()
        act = kpm.encode_action_definition(kpm.KpmActionDefinition(1, kpm.ActionDefFormat1(
            (kpm.MeasInfo("GPU.SmUsed.Mean"),), 100)), V3)
        _VALID.extend([
            e2ap.encode_e2ap(e2ap.RicSubscriptionRequest(e2ap.RicRequestId(123, 1), 2, b"\x00\x63",
                                                         (e2ap.RicAction(1, "report", act),))),
            e2ap.encode_e2ap(e2ap.RicControlRequest(e2ap.RicRequestId(1, 1), 3, rc.encode_control_header(
                rc.RcControlHeader(2, 6)), rc.encode_control_message(rc.build_prb_quota_control(
                    [rc.SliceQuota("00101", 1, 2, 0, 50, 0)], rc.SRSRAN_IDS)))),
        ])
    return _VALID


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 1), st.data())
def test_fuzz_mutated_valid_pdus(which, data):
    raw = bytearray(_valid_pdus()[which])
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(raw) - 1))
        raw[i] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(raw)))
    node, _ = _node()
    _check_replies(node.receive(12040 if which else 12010, bytes(raw[:cut] if data.draw(st.booleans()) else raw)))


@pytest.mark.parametrize("table,ids", [("srsran", rc.SRSRAN_IDS), ("oai", rc.OAI_IDS), ("oai-gnb", rc.OAI_GNB_IDS)])
def test_each_rc_table_accepts_its_own_form_and_refuses_the_others(table, ids):
    node, model = _node(rc_table=table)
    definition = rc.decode_ran_function_definition(
        next(f.definition for f in e2ap.decode_e2ap(node.setup_request().payload).ran_functions if f.oid == rc.RC_OID))
    assert rc.resolve_prb_quota_ids(definition, fallback=table) == ids
    hdr = rc.encode_control_header(rc.RcControlHeader(2, 6))
    for n, other in enumerate((rc.SRSRAN_IDS, rc.OAI_IDS, rc.OAI_GNB_IDS)):
        msg = rc.encode_control_message(rc.build_prb_quota_control([rc.SliceQuota("00101", 1, 2, 0, 30 + n, 0)], other))
        [out] = node.receive(12040, e2ap.encode_e2ap(e2ap.RicControlRequest(e2ap.RicRequestId(1, n), 3, hdr, msg)))
        assert out.mtype == (12041 if other == ids else 12042), (table, n)
    ratio = (30 + [rc.SRSRAN_IDS, rc.OAI_IDS, rc.OAI_GNB_IDS].index(ids)) / 100
    if table == "srsran":   # srsRAN's DU limits the UE the header names (UE 0), not the slice (dialects.ue_grant_limit)
        ue0 = node.config.ues.get(0)
        assert model.limits_dl.cap[0, ue0.cell, ue0.slice] == pytest.approx(ratio)
        assert model.quota[0, 0, 1].tolist() == [0.0, 1.0, 0.0]
    elif table == "oai-gnb":   # OAI's NVS slicer: the slice reserves its dedicated ratio, here 0 (dialects.nvs_reserved)
        assert model.nvs_reserved[0, 1] == 0.0 and model.quota[0, 0, 1].tolist() == [0.0, 1.0, 0.0]
    else:
        assert model.quota[0, 0, 1].tolist() == [0.0, ratio, 0.0]
