"""The E2 termination: forwards E2AP between E2 nodes, the subscription manager and xApps over RMR.

Simplification (stated): real E2 nodes reach the E2T over SCTP (port 36422); here they use RMR
too, one RMR endpoint per node. Everything xApps and submgr see is as in OSC: mtype 12050 with
`sub_id` = the subscription's E2EventInstanceId (the RICrequestID instance ID the node echoes) and
`meid` = the node's RAN inventory name; controls 12040 in, 12041/12042 back with `sub_id` = the
request's RIC instance ID (routed to the xApp owning that sub_id, as rtmgr's routes do); 10030 error
indications.

The E2T also plays e2mgr for E2 setup: it names the node as OSC's E2T does (`names.ran_name`), writes the
R-NIB, adds the node to the meid map of its route table, and answers E2setupResponse.

Routing is by route table throughout (rmr-wire §9): the E2T re-renders its own table whenever a
node connects, an xApp appears, or submgr adds or removes a subscription route, as rtmgr would.
Bad input never stops it: an undecodable control from an xApp is answered with an E2AP
ErrorIndication (10030), a control for an unknown node with a RICcontrolFailure (12042); anything
else undecodable is counted and dropped.

No peer can stall it (issue 13): the receive loop never awaits a send. Every send is queued per peer
(`PeerOutbox`), so a `src` naming an address that never accepts delays only what goes to that
address, for the endpoint's connect timeout. A node's identity is held by the connection that set
it up: a second E2 setup for a connected node's global gNB ID from another address is refused with
an E2setupFailure while the first is alive (its link is up, or it answers a health check); once it
is gone, the new setup is a restart and is accepted.
"""
from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field

from e2sm import e2ap, kpm
from e2sm.errors import E2DecodeError
from xapp.rmr import RmrError, RmrMessage, RmrSendError, RmrState

from .names import ran_name
from .outbox import PeerOutbox
from .rnib import NodeRecord, RanFunctionRecord, RnibWriter
from .routes import (
    RIC_CONTROL_ACK,
    RIC_CONTROL_FAILURE,
    RIC_CONTROL_REQ,
    RIC_E2_SETUP_FAILURE,
    RIC_E2_SETUP_REQ,
    RIC_E2_SETUP_RESP,
    RIC_ERROR_INDICATION,
    RIC_INDICATION,
    RIC_SUB_DEL_FAILURE,
    RIC_SUB_DEL_REQ,
    RIC_SUB_DEL_RESP,
    RIC_SUB_FAILURE,
    RIC_SUB_REQ,
    RIC_SUB_RESP,
    RicRoutes,
    RouteTableError,
    e2term_route_table,
    meid_map_update,
    subscription_route_update,
)

log = logging.getLogger("weaver.ric.e2term")

RIC_HEALTH_CHECK_REQ, RIC_HEALTH_CHECK_RESP = 100, 101
OUTBOX_SPARE_PEERS = 256   # peers with sends queued beyond the nodes set up and the xApps (testbed.ric.outbox)

KPM_OID_PREFIXES = kpm.KPM_OID_PREFIXES
RC_OID = "1.3.6.1.4.1.53148.1.1.2.3"
MAX_XAPPS = 32   # xApps are learnt from the src of controls: any sender can name one
IDENTITY_IN_USE = e2ap.Cause("protocol", "message-not-compatible-with-receiver-state")


def supported_oid(oid: str) -> bool:
    return oid == RC_OID or any(oid.startswith(p) for p in KPM_OID_PREFIXES)


@dataclass
class E2TermStats:
    forwarded: dict[int, int] = field(default_factory=dict)
    dropped_undecodable: int = 0
    dropped_unroutable: int = 0
    error_indications_sent: int = 0
    control_failures_sent: int = 0
    setups: int = 0
    setups_refused: int = 0      # a connected node's identity claimed from another address
    nodes_lost: int = 0
    xapps_refused: int = 0       # control senders beyond MAX_XAPPS, not routed to


class E2Termination:
    """Serve one RMR endpoint `ep` (already open) for nodes, submgr and xApps."""

    def __init__(self, ep, submgr: str, rnib: RnibWriter, xapps: tuple[str, ...] = (),
                 ric_plmn: str = "00101", ric_id: int = 1) -> None:
        self.ep = ep
        self.rnib = rnib
        self.ric_plmn = ric_plmn
        self.ric_id = ric_id
        self.nodes: dict[str, NodeRecord] = {}
        self._node_addr: dict[str, str] = {}
        self._xapps: dict[str, None] = dict.fromkeys(xapps)
        self._subs: dict[int, str] = {}
        self._submgr = submgr
        self.stats = E2TermStats()
        self._task: asyncio.Task | None = None
        self._keepalive_task: asyncio.Task | None = None
        self._last_seen: dict[str, float] = {}
        self._addr_index: dict[str, str] | None = None
        self.outbox = PeerOutbox(max_peers=OUTBOX_SPARE_PEERS)
        self._claims: dict[str, asyncio.Task] = {}   # identity -> the check of its holder's liveness
        self._reload()

    # -- routing -----------------------------------------------------------------------------------

    @property
    def _addr_node(self) -> dict[str, str]:
        if self._addr_index is None:
            self._addr_index = {addr: name for name, addr in self._node_addr.items()}
        return self._addr_index

    @property
    def routes(self) -> RicRoutes:
        return RicRoutes(submgr=self._submgr, xapps=tuple(self._xapps), nodes=dict(self._node_addr),
                         subscriptions=dict(self._subs))

    def _reload(self) -> None:
        self._addr_index = None  # node addresses may have changed
        notes = self.ep.load_route_table(e2term_route_table(self.routes))
        if not self.ep.ready:
            raise RuntimeError(f"E2T route table did not commit: {notes}")

    def _update(self, text: str) -> None:
        """Apply route-manager records on top of the table (its per-change push); the whole table again
        if they do not commit. A full table a change costs O(nodes + subscriptions) a change: at 1,000 nodes
        their setups and subscriptions held this loop for seconds and the nodes' health checks went unanswered."""
        for outcome in self.ep.router.apply_update(text):
            if not outcome.committed:
                log.warning("e2term: route update did not commit (%s): reloading the whole table", outcome.reason)
                self._reload()
                return
        if self.ep.router.update_notes:
            log.warning("e2term: route update: %s; reloading the whole table", "; ".join(self.ep.router.update_notes))
            self._reload()

    def _node_routes_changed(self, added: dict[str, str] | None = None, removed: tuple[str, ...] = ()) -> None:
        self._addr_index = None  # node addresses may have changed
        # room in the outbox for every node set up (and its xApps) on top of the bound for peers that only a
        # frame's `src` names: at a fixed 256, 1,000 nodes' setup responses and health checks were dropped
        # once 256 peers had something queued, and the nodes behind them were declared lost
        self.outbox.max_peers = OUTBOX_SPARE_PEERS + len(self._node_addr) + len(self._xapps)
        # the per-node routes (`%meid`) exist only in a table with nodes: the first and the last node reload it
        if not self._node_addr or (added and len(self._node_addr) == len(added)):
            self._reload()
        else:
            self._update(meid_map_update(added or {}, removed))

    def set_subscription_route(self, sub_id: int, xapp: str | None) -> None:
        """submgr's request to rtmgr: indications with `sub_id` go to `xapp` (None removes the route)."""
        if xapp is None:
            if self._subs.pop(sub_id, None) is None:
                return
        else:
            self._subs[sub_id] = xapp
        self._update(subscription_route_update(sub_id, xapp))

    def add_xapp(self, endpoint: str) -> None:
        """Route ACK/FAILURE/error indications to `endpoint` too (a src that no table can name is ignored)."""
        if not endpoint or endpoint in self._xapps:
            return
        if len(self._xapps) >= MAX_XAPPS:
            self.stats.xapps_refused += 1
            return
        self._xapps[endpoint] = None
        try:
            self._reload()
        except RouteTableError as exc:
            del self._xapps[endpoint]
            self._reload()
            log.warning("e2term: xApp src %r cannot be routed to: %s", endpoint, exc)

    def is_connected(self, meid: str) -> bool:
        return meid in self.nodes

    # -- serving -----------------------------------------------------------------------------------

    def start(self, keepalive_s: float | None = 1.0, misses: int = 3) -> asyncio.Task:
        """Serve; with `keepalive_s`, also probe every node with an RMR health check (mtype 100) that
        often and declare it lost after `misses` silent intervals or a failed send (our stand-in for
        SCTP loss): R-NIB DISCONNECTED, its meid unrouted, submgr then answers 503 for it."""
        self._task = asyncio.ensure_future(self._serve())
        if keepalive_s is not None:
            self._keepalive_task = asyncio.ensure_future(self._keepalive(keepalive_s, misses))
        return self._task

    async def stop(self) -> None:
        for task in (self._task, self._keepalive_task, *self._claims.values()):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        await self.outbox.close()
        for node in self.nodes.values():
            self.rnib.node_disconnected(node)

    def _seen(self, meid: str | None) -> None:
        if meid is not None:
            self._last_seen[meid] = asyncio.get_running_loop().time()

    def node_lost(self, meid: str, why: str, addr: str | None = None) -> None:
        """`addr`: only if the node is still the one at that address (not set up again since)."""
        if addr is not None and self._node_addr.get(meid) != addr:
            return
        node = self.nodes.pop(meid, None)
        if node is None:
            return
        self._node_addr.pop(meid, None)
        self._last_seen.pop(meid, None)
        self._node_routes_changed(removed=(meid,))
        self.rnib.node_disconnected(node)
        self.stats.nodes_lost += 1
        log.warning("e2term: lost %s (%s)", meid, why)

    async def _keepalive(self, interval_s: float, misses: int) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(interval_s)
            now = loop.time()
            for meid, addr in list(self._node_addr.items()):
                if now - self._last_seen.get(meid, now) > misses * interval_s:
                    self.node_lost(meid, f"silent for {misses} keepalive intervals")
                    continue
                if self.outbox.busy(addr):  # the last probe or other traffic is still on its way
                    continue
                probe = RmrMessage(RIC_HEALTH_CHECK_REQ, b"", meid=meid)
                self.outbox.post(addr, lambda a=addr, p=probe: self.ep.wormhole_send(a, p),
                                 lambda exc, m=meid, a=addr: self.node_lost(m, f"unreachable: {exc}", a))

    async def _serve(self) -> None:
        while True:
            try:
                msg = await self.ep.receive()
            except RmrError:
                return
            try:
                await self.handle(msg)
            except Exception:  # one bad message must never stop the E2T
                log.exception("e2term: failed on mtype %d from %s", msg.mtype, msg.src)

    async def handle(self, msg: RmrMessage) -> None:
        t = msg.mtype
        if t != RIC_CONTROL_REQ:
            self._seen(self._node_of(msg))  # anything a node sends proves it is alive
        if t == RIC_HEALTH_CHECK_RESP:
            return
        if t == RIC_INDICATION:
            await self._from_node_indication(msg)
        elif t == RIC_E2_SETUP_REQ:
            await self._setup(msg)
        elif t in (RIC_SUB_RESP, RIC_SUB_FAILURE, RIC_SUB_DEL_RESP, RIC_SUB_DEL_FAILURE):
            await self._from_node_to_submgr(msg)
        elif t in (RIC_CONTROL_ACK, RIC_CONTROL_FAILURE, RIC_ERROR_INDICATION):
            await self._from_node_to_xapps(msg)
        elif t in (RIC_SUB_REQ, RIC_SUB_DEL_REQ):
            await self._forward(msg)  # submgr -> node, by meid
        elif t == RIC_CONTROL_REQ:
            await self._control(msg)
        else:
            self.stats.dropped_unroutable += 1

    async def _forward(self, msg: RmrMessage) -> bool:
        """Send by the route table, one copy per group, each queued for its endpoint (never awaited here)."""
        try:
            targets = list(self.ep.router.targets(msg.mtype, msg.sub_id, msg.meid))
        except RmrSendError as exc:
            self._undelivered(msg, exc)
            return False
        if msg.call or msg.call_id:  # a routed send is never a call (as RmrEndpoint.send)
            msg = msg.replace(call=False, call_id=0)
        for target in targets:
            if not self.outbox.post(target, lambda t=target: self._send_to(t, msg),
                                    lambda exc: self._undelivered(msg, exc)):
                self._undelivered(msg, RmrSendError(RmrState.RETRY, f"outbox for {target} full"))
        return True

    async def _send_to(self, target: str, msg: RmrMessage) -> None:
        await self.ep.wormhole_send(target, msg)
        self.stats.forwarded[msg.mtype] = self.stats.forwarded.get(msg.mtype, 0) + 1

    def _undelivered(self, msg: RmrMessage, exc: Exception) -> None:
        self.stats.dropped_unroutable += 1
        log.debug("e2term: mtype %d sub_id %d meid %s not delivered: %s", msg.mtype, msg.sub_id, msg.meid, exc)

    def _node_of(self, msg: RmrMessage) -> str | None:
        meid = msg.meid
        if meid in self.nodes and self._node_addr.get(meid) in (msg.src, msg.srcip):
            return meid
        return self._addr_node.get(msg.src) or self._addr_node.get(msg.srcip)

    async def _from_node_indication(self, msg: RmrMessage) -> None:
        meid = self._node_of(msg)
        try:
            pdu = e2ap.decode_e2ap(msg.payload)
        except E2DecodeError as exc:
            self.stats.dropped_undecodable += 1
            log.debug("e2term: undecodable indication from %s: %s", msg.src, exc)
            return
        if meid is None or not isinstance(pdu, e2ap.RicIndication):
            self.stats.dropped_undecodable += 1
            return
        # OSC E2T puts the RICrequestID instance ID (= submgr's sub_id) into the RMR header.
        await self._forward(msg.replace(sub_id=pdu.request_id.instance, meid=meid))

    async def _from_node_to_submgr(self, msg: RmrMessage) -> None:
        meid = self._node_of(msg)
        try:
            pdu = e2ap.decode_e2ap(msg.payload)
        except E2DecodeError:
            self.stats.dropped_undecodable += 1
            return
        rid = getattr(pdu, "request_id", None)
        if meid is None or rid is None:
            self.stats.dropped_undecodable += 1
            return
        await self._forward(msg.replace(sub_id=rid.instance, meid=meid))

    async def _from_node_to_xapps(self, msg: RmrMessage) -> None:
        # Only E2 nodes send these to the E2T, and only well-formed E2AP is passed on.
        meid = self._node_of(msg)
        if meid is None:
            self.stats.dropped_unroutable += 1
            return
        try:
            pdu = e2ap.decode_e2ap(msg.payload)
        except E2DecodeError:
            self.stats.dropped_undecodable += 1
            return
        # OSC e2term (sctpThread.cpp, RICcontrolAcknowledge/Failure) sets the reply's sub_id to the
        # request's RIC instance ID; the route table then picks the xApp that owns that sub_id.
        rid = getattr(pdu, "request_id", None) if msg.mtype != RIC_ERROR_INDICATION else None
        await self._forward(msg.replace(sub_id=rid.instance if rid is not None else -1, meid=meid))

    async def _control(self, msg: RmrMessage) -> None:
        if msg.src:
            self.add_xapp(msg.src)  # the reply routes back to whoever sends controls
        try:
            pdu = e2ap.decode_e2ap(msg.payload)
        except E2DecodeError as exc:
            await self._error_indication(msg, e2ap.ErrorIndication(cause=e2ap.Cause("protocol", "transfer-syntax-error")),
                                         f"undecodable RICcontrolRequest: {exc}")
            return
        if not isinstance(pdu, e2ap.RicControlRequest):
            await self._error_indication(msg, e2ap.ErrorIndication(
                cause=e2ap.Cause("protocol", "abstract-syntax-error-falsely-constructed-message"),
                request_id=getattr(pdu, "request_id", None)), f"mtype 12040 carried a {type(pdu).__name__}")
            return
        if msg.meid not in self.nodes:
            failure = e2ap.RicControlFailure(pdu.request_id, pdu.ran_function_id,
                                             e2ap.Cause("transport", "transport-resource-unavailable"))
            self.stats.control_failures_sent += 1
            await self._reply(msg, RIC_CONTROL_FAILURE, e2ap.encode_e2ap(failure))
            return
        await self._forward(msg.replace(sub_id=-1))

    async def _error_indication(self, msg: RmrMessage, ind: e2ap.ErrorIndication, why: str) -> None:
        log.info("e2term: error indication to %s: %s", msg.src, why)
        self.stats.error_indications_sent += 1
        await self._reply(msg, RIC_ERROR_INDICATION, e2ap.encode_e2ap(ind))

    async def _reply(self, msg: RmrMessage, mtype: int, payload: bytes) -> None:
        """Return to sender, queued for the sender's address (never awaited here)."""
        def lost(exc: Exception) -> None:
            log.info("e2term: reply to %s lost: %s", msg.src, exc)

        if not self.outbox.post(msg.src or msg.srcip or "", lambda: self.ep.rts(msg, mtype=mtype, payload=payload),
                                lost):
            lost(RmrSendError(RmrState.RETRY, "outbox full"))

    async def _setup(self, msg: RmrMessage) -> None:
        try:
            req = e2ap.decode_e2ap(msg.payload)
        except E2DecodeError as exc:
            self.stats.dropped_undecodable += 1
            log.info("e2term: undecodable E2 setup from %s: %s", msg.src, exc)
            return
        if not isinstance(req, e2ap.E2SetupRequest) or not msg.src:
            self.stats.dropped_undecodable += 1
            return
        name = ran_name(req.node_id)
        held_by = self._node_addr.get(name)
        if held_by is not None and held_by != msg.src:  # the identity is held by another address
            if self.ep.connected(held_by) or self.outbox.busy(held_by):
                await self._refuse_setup(msg, req, name, held_by)
            elif name not in self._claims:  # is the holder still there? ask it, off the loop
                self._claims[name] = asyncio.ensure_future(self._settle_claim(msg, req, name, held_by))
            return
        await self._accept_setup(msg, req, name)

    async def _settle_claim(self, msg: RmrMessage, req: e2ap.E2SetupRequest, name: str, held_by: str) -> None:
        """A setup for an identity whose holder has no open link: a restart if the holder is gone."""
        try:
            try:
                await self.ep.wormhole_send(held_by, RmrMessage(RIC_HEALTH_CHECK_REQ, b"", meid=name))
            except RmrSendError as exc:
                self.node_lost(name, f"unreachable when {msg.src} set up as it: {exc}", held_by)
            if self._node_addr.get(name, msg.src) == msg.src:
                await self._accept_setup(msg, req, name)
            else:
                await self._refuse_setup(msg, req, name, self._node_addr[name])
        except Exception:
            log.exception("e2term: E2 setup from %s failed", msg.src)
        finally:
            self._claims.pop(name, None)

    async def _refuse_setup(self, msg: RmrMessage, req: e2ap.E2SetupRequest, name: str, held_by: str) -> None:
        self.stats.setups_refused += 1
        log.warning("e2term: E2 setup from %s refused: %s is connected at %s", msg.src, name, held_by)
        failure = e2ap.E2SetupFailure(req.transaction_id, IDENTITY_IN_USE, time_to_wait="v1s")
        await self._reply(msg, RIC_E2_SETUP_FAILURE, e2ap.encode_e2ap(failure))

    async def _accept_setup(self, msg: RmrMessage, req: e2ap.E2SetupRequest, name: str) -> None:
        accepted = tuple((f.ran_function_id, f.revision) for f in req.ran_functions if supported_oid(f.oid))
        rejected = tuple((f.ran_function_id, e2ap.Cause("ricService", "ran-function-not-supported"))
                         for f in req.ran_functions if not supported_oid(f.oid))
        node = NodeRecord(
            inventory_name=name, plmn=req.node_id.plmn, gnb_id=req.node_id.gnb_id,
            gnb_id_bits=req.node_id.gnb_id_bits, e2t_address=self.ep.src,
            ran_functions=tuple(RanFunctionRecord(f.ran_function_id, f.definition, f.revision, f.oid)
                                for f in req.ran_functions if supported_oid(f.oid)),
            ip=msg.src.rpartition(":")[0], port=int(msg.src.rpartition(":")[2] or 0))
        self.nodes[name] = node
        self._node_addr[name] = msg.src
        self._seen(name)
        self._node_routes_changed(added={name: msg.src})
        self.rnib.node_connected(node)
        self.stats.setups += 1
        acks = tuple(e2ap.E2NodeComponentAck(c.interface_type, c.component_id, True) for c in req.components)
        resp = e2ap.E2SetupResponse(req.transaction_id, self.ric_plmn, self.ric_id, accepted, rejected,
                                    component_acks=acks)
        await self._forward(RmrMessage(RIC_E2_SETUP_RESP, e2ap.encode_e2ap(resp), meid=name))
        log.info("e2term: E2 setup from %s at %s: %d RAN functions accepted", name, msg.src, len(accepted))
