"""The mini-RIC assembled: E2 termination + subscription manager (REST + RMR) + R-NIB, in one process.

    ric = await MiniRic.start(host="127.0.0.1", e2term_port=0, submgr_http_port=0, sdl=SDLWrapper(...))
    ric.e2term_address   # "127.0.0.1:<port>": E2 nodes and xApps send RMR here
    ric.submgr_url       # "http://127.0.0.1:<port>/ric/v1": POST .../subscriptions
    ric.xapp_route_table # text for an xApp's RMR_SEED_RT (also written to `route_dir`/xapp.rt)
    await ric.close()
"""
from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web
from ricxappframe.xapp_sdl import SDLWrapper

from xapp.rmr import RmrEndpoint, RmrError

from .e2term import E2Termination
from .rnib import NAMESPACE, RnibWriter, read_nodeb
from .routes import submgr_route_table, write_route_table, xapp_route_table
from .submgr import NOTIFY_INTERVAL_S, SubscriptionManager, build_app

log = logging.getLogger("weaver.ric")


def sdl_connected(sdl: SDLWrapper, meid: str) -> bool:
    """submgr's view of a node: CONNECTED in the R-NIB."""
    from ricxappframe.entities.rnib import nb_identity_pb2

    info = read_nodeb(sdl, meid)
    return info is not None and info.connection_status == nb_identity_pb2.CONNECTED


@dataclass
class MiniRic:
    host: str
    e2term: E2Termination
    e2term_ep: RmrEndpoint
    submgr: SubscriptionManager
    submgr_ep: RmrEndpoint
    runner: web.AppRunner
    http_port: int
    sdl: SDLWrapper
    route_file: Path | None
    _tasks: list[asyncio.Task]

    @classmethod
    async def start(cls, host: str = "127.0.0.1", e2term_port: int = 0, submgr_rmr_port: int = 0,
                    submgr_http_port: int = 0, xapps: tuple[str, ...] = (), sdl: SDLWrapper | None = None,
                    route_dir: str | Path | None = None, keepalive_s: float | None = 1.0,
                    notify_interval_s: float = NOTIFY_INTERVAL_S) -> MiniRic:
        """`notify_interval_s`: the pause between notification tries (SubMgr's 5 s; tests shorten it)."""
        sdl = sdl if sdl is not None else SDLWrapper(use_fake_sdl=True)
        e2t_ep = await RmrEndpoint.open(e2term_port, src_id=host, bind_if=host, env={})
        sm_ep = await RmrEndpoint.open(submgr_rmr_port, src_id=host, bind_if=host, env={})
        sm_ep.load_route_table(submgr_route_table(e2t_ep.src))
        e2term = E2Termination(e2t_ep, submgr=sm_ep.src, rnib=RnibWriter(sdl), xapps=xapps)
        submgr = SubscriptionManager(send=sm_ep.send, is_connected=lambda meid: sdl_connected(sdl, meid),
                                     routes=e2term.set_subscription_route, notify_interval_s=notify_interval_s)
        runner = web.AppRunner(build_app(submgr), access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, host, submgr_http_port)
        await site.start()
        http_port = site._server.sockets[0].getsockname()[1]  # aiohttp exposes the bound port only here
        route_file = None
        if route_dir is not None:
            route_file = write_route_table(Path(route_dir) / "xapp.rt", xapp_route_table(e2t_ep.src))
        ric = cls(host, e2term, e2t_ep, submgr, sm_ep, runner, http_port, sdl, route_file, [])
        ric._tasks.append(e2term.start(keepalive_s))
        ric._tasks.append(asyncio.ensure_future(ric._submgr_rx()))
        return ric

    async def _submgr_rx(self) -> None:
        while True:
            try:
                msg = await self.submgr_ep.receive()
            except RmrError:
                return
            try:
                self.submgr.on_rmr(msg)
            except Exception:
                log.exception("submgr: failed on mtype %d", msg.mtype)

    @property
    def e2term_address(self) -> str:
        return self.e2term_ep.src

    @property
    def submgr_url(self) -> str:
        return f"http://{self.host}:{self.http_port}/ric/v1"

    @property
    def xapp_route_table(self) -> str:
        return xapp_route_table(self.e2term_ep.src)

    @property
    def rnib_namespace(self) -> str:
        return NAMESPACE

    async def close(self) -> None:
        await self.submgr.close()
        await self.e2term.stop()
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.runner.cleanup()
        await self.e2term_ep.close()
        await self.submgr_ep.close()
