"""What an accepted slice-quota control changes, by the DU the node emulates (issue 28 item 1).

srsRAN's DU (`testbed.e2node.dialects.ue_grant_limit`, after `convert_to_du_config_request` and
`du_ue_ric_configuration_procedure::handle_mac_config`) turns the first policy's ratios into the grant-size limits
of the one UE the header names, whatever slice it is on, and changes nothing else in the cell; a node of the
standard text's dialect applies the quota to the slice. Driven with the srsRAN simple RC xApp's own encoding."""
from __future__ import annotations

import numpy as np
import pytest

from e2sm import e2ap
from testbed.e2node import E2Node, from_period_report, node_configs
from testbed.e2node.measure import measure, measure_ue
from testbed.e2node.node import CONTROL_ACK
from testbed.model import RanModel
from testbed.sim import SimConfig, build_scenario

from . import peers


def _world(dialect: str = ""):
    scenario = build_scenario(SimConfig(n_sites=1, n_cells=2, slices={"*": "2:1,1:1"}))
    model = RanModel(scenario, seed=3, track_delay=False)
    over = {0: {"dialect": dialect}} if dialect else None
    return model, E2Node(node_configs(scenario, "v4.00", "srsran", overrides=over)[0], model)


def _control(node, lo, hi, ded, ue_id=0, n=1):
    (out,) = node.receive(12040, peers.srsran_control_request(*peers.srsran_quota(lo, hi, ded, ue_id=ue_id),
                                                              requestor=n))
    assert out.mtype == CONTROL_ACK, e2ap.decode_e2ap(out.payload)


def test_srsran_limits_the_named_ue_and_leaves_the_slice_quota_alone():
    model, node = _world()
    before = model.quota.copy()
    ue0 = node.config.ues.get(0)
    assert ue0.slice == 0            # UE 0 is on the protected slice: srsRAN checks no bearer, it limits it anyway
    for n, (lo, hi, ded) in enumerate(peers.SRSRAN_CONTROLS, start=1):
        _control(node, lo, hi, ded, n=n)
        assert (model.quota == before).all()
        for lim in (model.limits_dl, model.limits_ul):       # PDSCH and PUSCH grant-size limits
            assert lim.tag[0, ue0.cell, ue0.slice] == 0
            assert lim.cap[0, ue0.cell, ue0.slice] == pytest.approx(hi / 100)
            assert lim.share[0, ue0.cell, ue0.slice] == pytest.approx(ue0.share)
        assert int((model.limits_dl.tag >= 0).sum()) == 1   # that UE only
    assert [u for u, _ in node.stats.ue_limits_applied] == [0, 0, 0, 0] and node.stats.quotas_applied == []


def test_standard_dialect_applies_the_same_control_to_the_slice():
    model, node = _world("o-ran")
    _control(node, 10, 30, 100)
    assert (model.quota[0, :, 1] == (0.10, 0.30, 1.00)).all()      # SST 1 / SD 1 on every cell
    assert (model.limits_dl.tag < 0).all() and node.stats.ue_limits_applied == []


def _run(model, node, periods=20):
    ms = [from_period_report(model.step_period(), 0, 132) for _ in range(periods)]
    ue_prbs = {u.f1ap_id: float(np.mean([measure_ue(m, node.config.slices, node.config.ues, u, "RRU.PrbUsedDl", None)
                                         for m in ms])) for u in node.config.ues.ues}
    cell_prbs = float(np.mean([measure(m, node.config.slices, "RRU.PrbUsedDl", None, 0) for m in ms]))
    return ue_prbs, cell_prbs


def test_the_limited_ue_gets_no_more_than_its_limit_and_the_rest_of_its_cell_carries_on():
    free_model, free_node = _world()
    free, free_cell = _run(free_model, free_node)
    model, node = _world()
    ue0 = node.config.ues.get(0)
    prbs = float(model.prbs[0, ue0.cell])
    limit = max(1, int(100 * 0.5 * free[0] / prbs))                # half of what UE 0 took unlimited, in %
    _control(node, 0, limit, 0)
    got, cell = _run(model, node)
    assert free[0] > 2 and got[0] <= limit / 100 * prbs + 1          # + 1: KPM's integer PRB counts
    assert got[0] < 0.75 * free[0]
    # the cell's other UEs keep theirs (their slice's capacity is not capped), and the cell's KPM still adds up
    others = [u.f1ap_id for u in node.config.ues.in_cell(ue0.cell) if u.f1ap_id != 0]
    assert sum(got[u] for u in others) >= 0.95 * sum(free[u] for u in others)
    assert sum(got[u.f1ap_id] for u in node.config.ues.in_cell(0)) == pytest.approx(cell, abs=len(others) + 1)


def test_a_node_restart_forgets_the_limit():
    model, node = _world()
    _control(node, 0, 10, 0)
    assert (model.limits_dl.tag >= 0).any()
    model.reset_controls(0)
    assert (model.limits_dl.tag < 0).all() and (model.limits_dl.share == 0).all()


def _oai_world():
    scenario = build_scenario(SimConfig(n_sites=1, n_cells=2, slices={"*": "1:5,1:1"}))
    model = RanModel(scenario, seed=3, track_delay=False)
    return model, E2Node(node_configs(scenario, "v3.00", "oai-gnb")[0], model)


def _oai_control(node, dedicated, n=1):
    from e2sm import e2ap as e2
    hdr, msg = peers.flexric_slice_control(dedicated=dedicated)
    (out,) = node.receive(12040, e2.encode_e2ap(e2.RicControlRequest(e2.RicRequestId(1, n), 3, hdr, msg,
                                                                        ack_request=True)))
    return out


def _prbs(model, periods=30):
    reps = [model.step_period() for _ in range(periods)]
    return (np.mean([r.slice_prb_used_dl[0] for r in reps], axis=0),     # (C, L) mean DL PRBs per slot
            np.mean([r.slice_prb_used_ul[0] for r in reps], axis=0))


def test_oai_nvs_gives_each_slice_its_reserved_time_share_of_the_downlink_only():
    """FlexRIC's slice control on OAI's gNB: every DL slot goes to one slice, each taking slots in proportion to its
    reservation beside the default slice's 5 % (OAI's nvs_nr_dl), busy or idle; so a slice gets at most
    pct / (0.05 + the reservations) of the DL PRBs, however much it has to send; the UL is as before."""
    free_model, _ = _oai_world()
    free_dl, free_ul = _prbs(free_model)
    model, node = _oai_world()
    assert _oai_control(node, (5, 30)).mtype == CONTROL_ACK    # slice 1 (SD 1) reserves 5 %, slice 0 (SD 5) 30 %
    dl, ul = _prbs(model)
    total = 0.05 + 0.30 + 0.05
    prbs = model.prbs[0]
    for c in range(2):
        assert dl[c, 0] <= 0.30 / total * prbs[c] + 1e-6
        assert dl[c, 1] <= 0.05 / total * prbs[c] + 1e-6 < 0.7 * free_dl[c, 1]   # the 12.5 % binds: it had more
    np.testing.assert_allclose(ul, free_ul)      # NVS slices the downlink only
    # a later control sets the slices it names (OAI's addmod); one past OAI's admission control fails
    assert _oai_control(node, (30, 60), n=2).mtype == CONTROL_ACK
    assert model.nvs_reserved[0].tolist() == pytest.approx([0.60, 0.30])
    assert _oai_control(node, (50, 60), n=3).mtype != CONTROL_ACK          # 0.05 + 1.1 > 1.0
    assert model.nvs_reserved[0].tolist() == pytest.approx([0.60, 0.30])


def test_oai_nvs_puts_a_slice_no_control_named_in_the_default_slice():
    from testbed.model.ran import NVS_DEFAULT_SHARE
    model, _ = _oai_world()
    model.set_nvs_reserved(0, (None, 0.30))      # only slice 1 configured: slice 0's UEs are in the default slice
    q = model._dl_quota()[0, 0]
    assert q[0, 1] == pytest.approx(NVS_DEFAULT_SHARE / 0.35) and q[1, 1] == pytest.approx(0.30 / 0.35)
    model.reset_controls(0)                      # a restart: the slicer's configuration is gone
    assert np.isnan(model.nvs_reserved).all() and model._dl_quota() is model.quota


def test_oai_adds_a_slice_no_ue_is_on_and_its_reservation_takes_slots_from_the_others():
    """FlexRIC's control names SD 1 and SD 5; a node serving SST 2 / SD 1 (protected) and SST 1 / SD 1: OAI adds
    SD 5 with its 50 % though no UE is on it (addmod_nvs_nr_slice_dl), and the protected slice, named by no
    control, is in the default slice: 5 % of the DL slots against 30 + 50 + 5."""
    scenario = build_scenario(SimConfig(n_sites=1, n_cells=2, slices={"*": "2:1,1:1"}))
    model = RanModel(scenario, seed=3, track_delay=False)
    node = E2Node(node_configs(scenario, "v3.00", "oai-gnb")[0], model)
    assert _oai_control(node, (30, 50)).mtype == CONTROL_ACK
    assert model.nvs_unserved[0] == {(1, 5): pytest.approx(0.50)} and np.isnan(model.nvs_reserved[0, 0])
    q = model._dl_quota()[0, 0]
    assert q[0, 1] == pytest.approx(0.05 / 0.85) and q[1, 1] == pytest.approx(0.30 / 0.85)
    srs = E2Node(node_configs(scenario, "v3.00", "oai-gnb", overrides={0: {"dialect": "o-ran"}})[0],
                 RanModel(scenario, seed=3, track_delay=False))
    assert _oai_control(srs, (30, 50)).mtype != CONTROL_ACK     # the standard text's node: no such slice here
    model.reset_controls(0)                                      # a restart forgets the added slice too
    assert model.nvs_unserved[0] == {} and model._dl_quota() is model.quota
