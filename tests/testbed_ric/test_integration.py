"""A node driven through the mini-RIC purely over RMR + REST by a tiny xApp: E2 setup, R-NIB,
subscribe (201 + notification), indications whose decoded values match the RAN model, a PRB quota
control that the MAC obeys in the next period, subscription delete. Once per node flavour:
KPM v3.00 + srsRAN parameter IDs, and KPM v2.03 + OAI/FlexRIC parameter IDs."""
from __future__ import annotations

import asyncio
import math

import pytest
from ricxappframe.xapp_sdl import SDLWrapper

from e2sm import e2ap, kpm, rc
from testbed.sim import SimConfig, Simulation

from .tiny_xapp import TinyXapp, kpm_action, prb_quota


async def _drive(kpm_version: str, rc_table: str, sdl: SDLWrapper | None = None) -> None:
    # the standard text's dialect: the quota control below caps the slice (srsRAN's DU would limit one UE's
    # grants instead, tests/emulator/test_dialect_effects.py); the ID table is still rc_table's
    sim = await Simulation.start(SimConfig(n_sites=1, n_cells=2, kpm_version=kpm_version, rc_table=rc_table,
                                           speed=0, seed=3, node_overrides={0: {"dialect": "o-ran"}}), sdl)
    x = await TinyXapp.start(sim.ric.xapp_route_table)
    try:
        node = sim.nodes[0]
        meid, cfg = node.meid, node.node.config
        # R-NIB: the node and its RAN functions, as an OSC xApp reads them.
        fns = x.functions(sim.ric.sdl, meid)
        kpm_oid = kpm.KPM_OID_V3 if kpm_version == "v3.00" else kpm.KPM_OID_V2
        assert set(fns) == {kpm_oid, rc.RC_OID}
        version = kpm.kpm_version_from_oid(kpm_oid)
        kpm_fn, kpm_def = fns[kpm_oid]
        desc = kpm.decode_ran_function_description(kpm_def, version)
        names = desc.report_style(1).meas_names
        assert {"GPU.SmUsed.Mean", "GPU.SmUsed.Max", "RRU.PrbUsedDl.SNSSAI"} <= set(names)
        rc_fn, rc_def = fns[rc.RC_OID]
        definition = rc.decode_ran_function_definition(rc_def)
        ids = rc.resolve_prb_quota_ids(definition, fallback=rc_table)
        assert ids == (rc.SRSRAN_IDS if rc_table == "srsran" else rc.OAI_IDS)
        assert definition.control_action(rc.WEAVER_STYLE, 1) is not None

        # Subscribe over REST: 201 now, the outcome as a notification.
        url = sim.ric.submgr_url + "/subscriptions"
        trigger = kpm.encode_event_trigger(kpm.KpmEventTrigger(100), version)
        body = x.subscription_body(meid, kpm_fn, trigger, kpm_action(version, cfg.nr_cell_id(0), cfg.slices))
        status, created = await x.post(url, body)
        assert status == 201 and created["SubscriptionId"]
        note = await x.notification()
        assert note["SubscriptionId"] == created["SubscriptionId"]
        [inst] = note["SubscriptionInstances"]
        assert inst["XappEventInstanceId"] == 1 and inst["E2EventInstanceId"] > 0, inst
        sub_id = inst["E2EventInstanceId"]
        # An identical re-POST is de-duplicated (md5): same SubscriptionId.
        status, again = await x.post(url, body)
        assert status == 201 and again["SubscriptionId"] == created["SubscriptionId"]

        # Indications carry sub_id and meid; their values are the model's period report for cell 0.
        report = await sim.step()
        msg = await x.receive(12050)
        assert msg.sub_id == sub_id and msg.meid == meid
        ind = e2ap.decode_e2ap(msg.payload)
        assert isinstance(ind, e2ap.RicIndication) and ind.ran_function_id == kpm_fn
        hdr = kpm.decode_indication_header(ind.header, version)
        assert hdr.collect_start_time > 0
        m = kpm.decode_indication_message(ind.message, version)
        [rec] = m.records
        used_p, used_be, avail, thp_be, sm_mean, sm_max = rec
        assert used_p == round(float(report.slice_prb_used_dl[0, 0, 0]))
        assert used_be == round(float(report.slice_prb_used_dl[0, 0, 1]))
        assert avail == round(float(report.prb_avail_dl[0, 0]))
        assert thp_be == pytest.approx(float(report.slice_bytes_dl[0, 0, 1]) * 8 / report.period_s / 1000, rel=1e-9)
        assert sm_mean == pytest.approx(float(report.sm_mean[0]), rel=1e-9)
        assert sm_max == math.ceil(float(report.sm_max[0]) - 1e-9)
        assert [str(i.name) for i in m.meas_info][:2] == ["RRU.PrbUsedDl", "RRU.PrbUsedDl"]

        # Quota control on the best-effort slice: ACK, then the MAC obeys it in the next period.
        be = cfg.slices[1]
        cap_ratio = 2
        cap = cap_ratio / 100 * float(report.prb_avail_dl[0, 0])
        assert float(report.slice_prb_used_dl[0, 0, 1]) > cap, "test needs best-effort load above the cap"
        await x.control(meid, rc_fn, *prb_quota(ids, be.sst, be.sd, cap_ratio))
        ack = await x.receive(timeout=5)
        assert ack.mtype == 12041 and ack.meid == meid, e2ap.decode_e2ap(ack.payload)
        assert isinstance(e2ap.decode_e2ap(ack.payload), e2ap.RicControlAcknowledge)
        report2 = await sim.step()
        for cell in range(cfg.n_cells):
            assert float(report2.slice_prb_used_dl[0, cell, 1]) <= cap + 1e-6
        ind2 = e2ap.decode_e2ap((await x.receive(12050)).payload)
        rec2 = kpm.decode_indication_message(ind2.message, version).records[0]
        assert rec2[1] == round(float(report2.slice_prb_used_dl[0, 0, 1])) <= round(cap)

        # Delete: 204 at once (SubMgr deletes in the background), then the list empties and no more
        # indications come.
        status, _ = await x.delete(f"{url}/{created['SubscriptionId']}")
        assert status == 204
        for _ in range(200):
            if node.node.subscriptions == {} and (await x.get(url))[1] == []:
                break
            await asyncio.sleep(0.02)
        while True:                      # indications already on their way before the delete landed
            try:
                await x.receive(12050, timeout=0.05)
            except TimeoutError:
                break
        await sim.step()
        with pytest.raises(TimeoutError):
            await x.receive(12050, timeout=0.3)
        status, listed = await x.get(url)
        assert status == 200 and listed == []
        assert node.node.subscriptions == {}
    finally:
        await x.close()
        await sim.close()


@pytest.mark.timeout(120)
def test_kpm_v3_srsran_node_through_the_mini_ric():
    asyncio.run(_drive("v3.00", "srsran"))


@pytest.mark.timeout(120)
def test_kpm_v2_oai_node_through_the_mini_ric(redis_env):
    # This flavour keeps its R-NIB in a real Redis (DBAAS_* as on the platform).
    asyncio.run(_drive("v2.03", "oai", SDLWrapper()))


async def _indication_bytes(seed: int) -> list[bytes]:
    sim = await Simulation.start(SimConfig(n_sites=1, n_cells=2, speed=0, seed=seed, epoch_unix=1.8e9,
                                           keepalive_s=None))
    x = await TinyXapp.start(sim.ric.xapp_route_table)
    try:
        v3 = kpm.KpmVersion.V3_00
        node = sim.nodes[0]
        body = x.subscription_body(node.meid, 2, kpm.encode_event_trigger(kpm.KpmEventTrigger(100), v3),
                                   kpm_action(v3, None, node.node.config.slices))
        await x.post(sim.ric.submgr_url + "/subscriptions", body)
        await x.notification()
        out = []
        for _ in range(5):
            await sim.step()
            ind = e2ap.decode_e2ap((await x.receive(12050)).payload)
            out.append(ind.header + ind.message)
        return out
    finally:
        await x.close()
        await sim.close()


def test_same_seed_same_indication_bytes():
    a = asyncio.run(_indication_bytes(7))
    assert a == asyncio.run(_indication_bytes(7))
    assert a != asyncio.run(_indication_bytes(8))
