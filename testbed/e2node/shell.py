"""The asyncio shell of one E2 node: an RMR endpoint to the E2 termination around the sans-IO `E2Node`.

Simplification (stated): real E2 nodes speak SCTP to the E2T; this node sends its E2AP over RMR with
`meid` = its RAN inventory name, using a static route table that sends everything to the E2T.

`ack_shaper` (a fault of `testbed.faults`) acts on the node's RIC control acknowledgements on their way
to the wire: delayed, lost, duplicated or reordered. Everything else goes out as it is.
"""
from __future__ import annotations

import asyncio
import logging

from xapp.rmr import RmrEndpoint, RmrError, RmrMessage, RmrSendError

from ..ric.routes import RIC_CONTROL_REQ, RIC_SUB_DEL_REQ, RIC_SUB_REQ, node_route_table
from .config import NodeConfig
from .measure import SiteMeasurements
from .node import CONTROL_ACK, E2Node, Outgoing

log = logging.getLogger("weaver.e2node")

ACK_MODES = ("delay", "loss", "duplicate", "reorder")


class AckShaper:
    """What a fault does to RIC control ACKs (mtype 12041) leaving one node, while it is installed:
    "delay" sends each ACK `delay_ms` later, "loss" never sends it, "duplicate" sends it twice, "reorder"
    holds one ACK and sends it right after the next one (`release()` sends a held one when the fault ends)."""

    def __init__(self, mode: str, delay_ms: float = 0.0) -> None:
        if mode not in ACK_MODES:
            raise ValueError(f"ACK fault mode must be one of {ACK_MODES}, got {mode!r}")
        self.mode = mode
        self.delay_ms = float(delay_ms)
        self.held: Outgoing | None = None
        self.counts = {"acks": 0, "delayed": 0, "lost": 0, "duplicated": 0, "reordered": 0}
        self._tasks: set[asyncio.Task] = set()

    async def send(self, shell: NodeShell, out: Outgoing) -> None:
        self.counts["acks"] += 1
        if self.mode == "loss":
            self.counts["lost"] += 1
            return
        if self.mode == "duplicate":
            self.counts["duplicated"] += 1
            await shell._send(out)
            await shell._send(out)
            return
        if self.mode == "delay":
            self.counts["delayed"] += 1

            async def later() -> None:
                await asyncio.sleep(self.delay_ms / 1000.0)
                await shell._send(out)

            t = asyncio.ensure_future(later())
            self._tasks.add(t)
            t.add_done_callback(self._tasks.discard)
            return
        if self.held is None:  # reorder: hold this one, it goes out after the next
            self.held = out
            return
        held, self.held = self.held, None
        self.counts["reordered"] += 1
        await shell._send(out)
        await shell._send(held)

    async def release(self, shell: NodeShell) -> None:
        """The fault ends: a held ACK goes out now; delayed ones still go out at their time."""
        if self.held is not None:
            held, self.held = self.held, None
            await shell._send(held)


class NodeShell:
    def __init__(self, node: E2Node, ep: RmrEndpoint) -> None:
        self.node = node
        self.ep = ep
        self._task: asyncio.Task | None = None
        self.send_errors = 0
        self.ack_shaper: AckShaper | None = None
        c = node.config
        # per request type, how long the node takes before it acts and answers (NodeConfig)
        self.delay_s = {RIC_SUB_REQ: c.subscription_delay_ms / 1000.0, RIC_SUB_DEL_REQ: c.subscription_delay_ms / 1000.0,
                        RIC_CONTROL_REQ: c.control_delay_ms / 1000.0}

    @classmethod
    async def open(cls, config: NodeConfig, ran, e2term: str, host: str = "127.0.0.1", port: int = 0) -> NodeShell:
        ep = await RmrEndpoint.open(port, src_id=host, bind_if=host, env={})
        ep.load_route_table(node_route_table(e2term))
        shell = cls(E2Node(config, ran), ep)
        shell._task = asyncio.ensure_future(shell._serve())
        return shell

    @property
    def meid(self) -> str:
        return self.node.config.inventory_name

    async def _send(self, out: Outgoing) -> None:
        try:
            await self.ep.send(RmrMessage(out.mtype, out.payload, meid=self.meid))
        except RmrSendError as exc:
            self.send_errors += 1
            log.info("%s: mtype %d not sent: %s", self.meid, out.mtype, exc)

    async def setup(self, timeout: float = 10.0, retry_s: float = 0.5) -> None:
        """E2 setup, repeated every `retry_s` until the E2T answers (it may start after us)."""
        deadline = asyncio.get_running_loop().time() + timeout
        while not self.node.connected:
            await self._send(self.node.setup_request())
            for _ in range(int(retry_s / 0.02)):
                if self.node.connected:
                    return
                await asyncio.sleep(0.02)
            if asyncio.get_running_loop().time() > deadline:
                raise TimeoutError(f"{self.meid}: no E2 setup response within {timeout}s")

    async def report(self, m: SiteMeasurements, now_ms: float, collect_start_ntp: int) -> int:
        outs = self.node.on_period(m, now_ms, collect_start_ntp)
        for out in outs:
            await self._send(out)
        return len(outs)

    async def _serve(self) -> None:
        """Requests are taken in arrival order, each acted on and answered its type's delay after it arrived:
        a later request never overtakes an earlier one, and delays do not add up behind each other."""
        loop = asyncio.get_running_loop()
        arrived: asyncio.Queue = asyncio.Queue()

        async def stamp() -> None:
            while True:
                try:
                    msg = await self.ep.receive()
                except RmrError:
                    await arrived.put(None)
                    return
                await arrived.put((loop.time() + self.delay_s.get(msg.mtype, 0.0), msg))
        reader = asyncio.ensure_future(stamp())
        try:
            while (item := await arrived.get()) is not None:
                due, msg = item
                if due > loop.time():
                    await asyncio.sleep(due - loop.time())
                try:
                    for out in self.node.receive(msg.mtype, msg.payload):
                        if out.mtype == CONTROL_ACK and self.ack_shaper is not None:
                            await self.ack_shaper.send(self, out)
                        else:
                            await self._send(out)
                except Exception:  # a bug on one message must not silence the node
                    log.exception("%s: failed on mtype %d", self.meid, msg.mtype)
        finally:
            reader.cancel()

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        await self.ep.close()
