"""A tiny xApp for the integration tests: an RMR endpoint, an HTTP server for SubMgr notifications,
and helpers that read the R-NIB and build E2SM payloads. It talks to the mini-RIC only over RMR and
REST (and reads SDL as an OSC xApp does), never through the simulator's Python objects."""
from __future__ import annotations

import asyncio
import json

from aiohttp import ClientSession, web

from e2sm import e2ap, kpm, rc
from e2sm.common import NrCgi
from testbed.ric.rnib import read_nodeb
from xapp.rmr import RmrEndpoint, RmrMessage


class TinyXapp:
    def __init__(self, ep: RmrEndpoint, runner: web.AppRunner, http_port: int, session: ClientSession):
        self.ep = ep
        self.runner = runner
        self.http_port = http_port
        self.session = session
        self.notifications: asyncio.Queue = asyncio.Queue()

    @classmethod
    async def start(cls, route_table: str) -> TinyXapp:
        ep = await RmrEndpoint.open(0, src_id="127.0.0.1", bind_if="127.0.0.1", env={})
        ep.load_route_table(route_table)
        app = web.Application()
        holder: list[TinyXapp] = []

        async def on_notification(request: web.Request) -> web.Response:
            await holder[0].notifications.put(await request.json())
            return web.Response(status=200)

        app.router.add_post("/ric/v1/subscriptions/response", on_notification)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]
        x = cls(ep, runner, port, ClientSession())
        holder.append(x)
        return x

    async def close(self) -> None:
        await self.session.close()
        await self.runner.cleanup()
        await self.ep.close()

    # -- R-NIB --------------------------------------------------------------------------------------

    @staticmethod
    def functions(sdl, meid: str) -> dict[str, tuple[int, bytes]]:
        """OID -> (RAN function ID, definition bytes), from `RAN:<meid>` in SDL namespace e2Manager."""
        info = read_nodeb(sdl, meid)
        return {f.ran_function_oid: (f.ran_function_id, bytes.fromhex(f.ran_function_definition))
                for f in info.gnb.ran_functions}

    # -- REST ---------------------------------------------------------------------------------------

    def subscription_body(self, meid: str, ran_function_id: int, trigger: bytes, action_def: bytes,
                          xapp_event_id: int = 1) -> dict:
        return {"SubscriptionId": "",
                "ClientEndpoint": {"Host": "127.0.0.1", "HTTPPort": self.http_port, "RMRPort": self.ep.port},
                "Meid": meid, "RANFunctionID": ran_function_id,
                "E2SubscriptionDirectives": {"E2TimeoutTimerValue": 2, "E2RetryCount": 1, "RMRRoutingNeeded": True},
                "SubscriptionDetails": [{"XappEventInstanceId": xapp_event_id, "EventTriggers": list(trigger),
                                         "ActionToBeSetupList": [{"ActionID": 1, "ActionType": "report",
                                                                  "ActionDefinition": list(action_def)}]}]}

    async def post(self, url: str, body) -> tuple[int, dict]:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        async with self.session.post(url, data=data, headers={"Content-Type": "application/json"}) as r:
            return r.status, await r.json(content_type=None)

    async def delete(self, url: str) -> tuple[int, str]:
        async with self.session.delete(url) as r:
            return r.status, await r.text()

    async def get(self, url: str) -> tuple[int, object]:
        async with self.session.get(url) as r:
            return r.status, await r.json(content_type=None)

    async def notification(self, timeout: float = 10.0) -> dict:
        return await asyncio.wait_for(self.notifications.get(), timeout)

    # -- RMR ----------------------------------------------------------------------------------------

    async def receive(self, mtype: int | None = None, timeout: float = 5.0) -> RmrMessage:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            msg = await self.ep.receive(timeout=max(0.01, deadline - loop.time()))
            if mtype is None or msg.mtype == mtype:
                return msg

    async def control(self, meid: str, ran_function_id: int, header: bytes, message: bytes, instance: int = 1,
                      ack: bool = True) -> None:
        req = e2ap.RicControlRequest(e2ap.RicRequestId(1001, instance), ran_function_id, header, message,
                                     ack_request=ack)
        await self.ep.send(RmrMessage(12040, e2ap.encode_e2ap(req), meid=meid))


def kpm_action(version: kpm.KpmVersion, cell_nci: int | None, slices, period_ms: int = 100) -> bytes:
    meas = (kpm.MeasInfo("RRU.PrbUsedDl", tuple(kpm.MeasLabel(kpm.Snssai(s.sst, s.sd)) for s in slices)),
            kpm.MeasInfo("RRU.PrbAvailDl"), kpm.MeasInfo("DRB.UEThpDl.SNSSAI", (kpm.MeasLabel(kpm.Snssai(
                slices[1].sst, slices[1].sd)),)),
            kpm.MeasInfo("GPU.SmUsed.Mean"), kpm.MeasInfo("GPU.SmUsed.Max"))
    cgi = NrCgi("00101", cell_nci) if cell_nci is not None else None
    return kpm.encode_action_definition(kpm.KpmActionDefinition(1, kpm.ActionDefFormat1(meas, period_ms, cgi)), version)


def prb_quota(ids: rc.PrbQuotaIds, sst: int, sd: int | None, max_ratio: int) -> tuple[bytes, bytes]:
    header = rc.encode_control_header(rc.RcControlHeader(2, 6))
    msg = rc.encode_control_message(rc.build_prb_quota_control(
        [rc.SliceQuota("00101", sst, sd, 0, max_ratio, 0)], ids))
    return header, msg
