"""gRPC lease broker: `weaver.v1.LeaseBroker/Session` (schemas/proto/weaver/v1/lease.proto) over grpc.aio.

One long-lived bidi stream per agent. The agent's first message must be `Register` (its site's credential,
`xapp.agents.site_credential`, in `Register.token` or `authorization: Bearer <t>` metadata when a broker
secret is configured); a site with a live session is refused (ALREADY_EXISTS); the broker answers
`Welcome` (site, epoch, heartbeat interval, CrossSiteConfig) and an empty `Revoke` ("every lease of this
site"), so that an agent reconnecting to a restarted xApp drops anything from the previous epoch at once.
Then leases and revocations flow down as the control loop decides them (`grant` / `revoke`), heartbeats
are echoed, and usage, transfer plans and round reports flow up into the `AgentBook`.

The method is registered with raw-bytes (de)serializers so that undecodable bytes are answered with
INVALID_ARGUMENT and a message, not grpc's generic INTERNAL. Message size limits apply both ways.
Refused registrations and usage reports are counted by reason (`refused_registrations`, `refused_usage`)
for /metrics; a refused usage report leaves the stream up but never reaches the ledger.
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path

import grpc
from google.protobuf.message import DecodeError

from schemas import tierpass
from schemas.credential import tier_key
from schemas.proto.weaver.v1 import lease_pb2
from schemas.redirect import REDIRECT_METADATA
from xapp.agents import (
    AgentBook,
    BadRequest,
    LeaseIssued,
    ProofBook,
    UsageRefused,
    check_register,
    check_usage,
)
from xapp.config import XappConfig

log = logging.getLogger("weaver.xapp.broker")

SERVICE = "weaver.v1.LeaseBroker"
REGISTER_TIMEOUT_S = 10.0
REFUSALS_LOGGED = 5         # refused usage reports logged per session before going quiet (then every 1000th)
_CLOSE = object()
_CODES = {"unauthenticated": grpc.StatusCode.UNAUTHENTICATED, "already_exists": grpc.StatusCode.ALREADY_EXISTS,
          "failed-precondition": grpc.StatusCode.FAILED_PRECONDITION, "unavailable": grpc.StatusCode.UNAVAILABLE}


class _Session:
    def __init__(self, site_id: str, session: int, maxsize: int = 64) -> None:
        self.site_id = site_id
        self.session = session
        self.out: asyncio.Queue = asyncio.Queue(maxsize)
        self.refused = 0                      # usage reports refused on this stream (for log throttling)
        self.pass_expiry = 0                  # the expiry of the tier pass this stream last carried (unix s)

    def push(self, msg: lease_pb2.BrokerMessage) -> bool:
        try:
            self.out.put_nowait(msg)
            return True
        except asyncio.QueueFull:
            return False

    def close(self) -> None:
        """End the stream writer; pending messages are dropped when the queue is full (the agent is stuck)."""
        while True:
            try:
                self.out.put_nowait(_CLOSE)
                return
            except asyncio.QueueFull:
                self.out.get_nowait()


class LeaseBroker:
    """The gRPC server plus the async side of lease issuance. `now` is monotonic, `wall` unix time."""

    def __init__(self, cfg: XappConfig, book: AgentBook, *, now: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time,
                 on_lease: Callable[[LeaseIssued, str], None] | None = None,
                 on_release: Callable[[str, int, str], None] | None = None) -> None:
        self.cfg = cfg
        self.book = book
        self.now = now
        self.wall = wall
        self.on_lease = on_lease              # ledger hook: (issued, "granted" | "revoked")
        self.on_release = on_release          # (site, seq, reason): the agent acts on no lease up to seq
        self.released = 0
        self.sessions: dict[str, _Session] = {}
        self.events: deque = deque(maxlen=512)
        self.rejected = 0                     # streams aborted for a bad request
        # site -> None (served here) or the broker of the replica that controls it ("" = none known)
        self.serves: Callable[[str], str | None] | None = None
        self.refused_registrations: dict[str, int] = {}   # reason -> count
        self.refused_usage: dict[str, int] = {}           # reason -> count
        self.revoked: dict[str, int] = {}                 # reason -> leases this broker ended (xapp.metrics)
        self.server: grpc.aio.Server | None = None
        self.port = 0
        self.tier_key = tier_key(cfg.broker.secret(), book.epoch)
        # the epoch's CA (schemas.tierpass): it signs each admitted site's own tier pass
        self._tier_ca = tierpass.ca_seed(cfg.broker.secret(), book.epoch)
        self.tier_ca = tierpass.public_key(self._tier_ca)
        # registration proofs are taken once, and only if made since this broker started (schemas.credential)
        self.proofs = ProofBook(started_unix_ms=int(wall() * 1000))

    # lifecycle
    async def start(self, listen: str | None = None) -> int:
        b = self.cfg.broker
        opts = [("grpc.max_receive_message_length", b.max_message_bytes),
                ("grpc.max_send_message_length", b.max_message_bytes)]
        self.server = grpc.aio.server(options=opts)
        handler = grpc.stream_stream_rpc_method_handler(self._session)   # raw bytes both ways
        self.server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, {"Session": handler}),))
        addr = listen or b.listen
        if b.tls_cert and b.tls_key:
            ca = Path(b.tls_client_ca).read_bytes() if b.tls_client_ca else None
            creds = grpc.ssl_server_credentials([(Path(b.tls_key).read_bytes(), Path(b.tls_cert).read_bytes())],
                                                root_certificates=ca, require_client_auth=ca is not None)
            self.port = self.server.add_secure_port(addr, creds)
            log.info("lease broker on %s (TLS%s)", addr, ", client certificates required" if ca else "")
        else:
            self.port = self.server.add_insecure_port(addr)
            log.info("lease broker on %s (plaintext)", addr)
        await self.server.start()
        return self.port

    async def stop(self, grace: float = 1.0) -> None:
        """Revoke every lease first (RAN first), then close the streams."""
        for site in list(self.sessions):
            self.revoke(site, "xapp-shutdown")
        for s in list(self.sessions.values()):
            s.close()
        if self.server is not None:
            await asyncio.sleep(0)            # let the revocations reach the stream writers
            await self.server.stop(grace)

    # decisions from the control loop
    def cross_site(self, site_id: str = "") -> lease_pb2.CrossSiteConfig:
        """The tier's settings, and with `site_id` that site's own tier pass (for its stream only)."""
        b = self.cfg.broker
        msg = lease_pb2.CrossSiteConfig(lighthouse_addr=b.lighthouse_addr, round_ms=b.round_ms,
                                        round_epoch_ms=b.round_epoch_ms,
                                        heartbeat_timeout_ms=b.heartbeat_ms * b.agent_timeout_heartbeats,
                                        tier_key=self.tier_key, tier_epoch=self.book.epoch, tier_ca=self.tier_ca)
        if site_id and b.lighthouse_addr:      # no tier, no pass (nor its renewals)
            ident = tierpass.issue(self._tier_ca, self.book.epoch, site_id, int(self.wall()) + b.tier_pass_s)
            msg.tier_site_key = ident.site_key
            msg.tier_pass_expiry_unix = ident.tier_pass.expiry_unix
            msg.tier_pass_signature = ident.tier_pass.ca_signature
        return msg

    def _push_cross_site(self, sess: _Session) -> bool:
        msg = lease_pb2.BrokerMessage(cross_site=self.cross_site(sess.site_id))
        if sess.push(msg):
            sess.pass_expiry = msg.cross_site.tier_pass_expiry_unix
            return True
        return False

    def publish_cross_site(self) -> int:
        """Push the (changed) CrossSiteConfig, each with its site's pass, to every connected agent; returns how
        many got it."""
        return sum(self._push_cross_site(s) for s in self.sessions.values())

    def _renew_pass(self, sess: _Session) -> None:
        """A site the broker still admits gets its tier pass renewed at half its life (on its heartbeat): a site
        it stops admitting (its session ends, its credential expires) keeps none beyond `tier_pass_s`."""
        if sess.pass_expiry and sess.pass_expiry - self.wall() < self.cfg.broker.tier_pass_s / 2:
            self._push_cross_site(sess)

    def open_session(self, site_id: str, session: int) -> _Session:
        """The stream side of an admitted registration: leases and revokes for the site queue here."""
        sess = _Session(site_id, session)
        self.sessions[site_id] = sess
        return sess

    def grant(self, site_id: str, sm_count: int, reason: str, *, seq: int = 0, decided_at: float | None = None,
              basis: str = "") -> LeaseIssued | None:
        """Issue (or renew) the site's lease; None when no agent is connected for the site.

        `decided_at` (monotonic, the loop's decision instant): the lease is stamped with it, backdated on
        the wall clock, so a lease that waited before it was sent ends when the xApp's ledger says."""
        s = self.sessions.get(site_id)
        site = self.cfg.site(site_id)
        if s is None or site is None:
            return None
        late = 0.0 if decided_at is None else max(0.0, self.now() - decided_at)
        issued = self.book.issue(site_id, sm_count, site.gpu_sms, reason, self.wall() - late, seq=seq, basis=basis)
        if not s.push(lease_pb2.BrokerMessage(lease=issued.lease)):
            self._drop(s, "agent not reading its stream")
            return None
        if self.on_lease:
            self.on_lease(issued, "granted")
        return issued

    def revoke(self, site_id: str, reason: str) -> bool:
        issued = self.book.revoke(site_id, self.wall())
        s = self.sessions.get(site_id)
        if s is not None and not s.push(lease_pb2.BrokerMessage(revoke=lease_pb2.Revoke(lease_id="", reason=reason))):
            # A revoke is never dropped: the agent treats a closed stream as a revoke of everything.
            self._drop(s, "revoke could not be queued (agent not reading its stream)")
        if issued is not None:
            self.revoked[reason.split(":")[0]] = self.revoked.get(reason.split(":")[0], 0) + 1
            self.events.append((self.wall(), site_id, "revoke", reason))
            if self.on_lease:
                self.on_lease(issued, "revoked")
        return issued is not None

    def drop(self, site_id: str, why: str) -> bool:
        """Close a site's agent stream (e.g. it stopped heartbeating); its lease is revoked."""
        s = self.sessions.get(site_id)
        if s is None:
            return False
        self._drop(s, why)
        return True

    def _drop(self, s: _Session, why: str) -> None:
        log.warning("site %s: closing agent stream (%s)", s.site_id, why)
        if self.book.revoke(s.site_id, self.wall()) is not None:
            self.revoked["stream-closed"] = self.revoked.get("stream-closed", 0) + 1
        self.sessions.pop(s.site_id, None)
        self.book.disconnect(s.site_id, s.session)
        s.close()

    # the RPC
    @staticmethod
    def _metadata_token(context) -> str | None:
        for k, v in context.invocation_metadata() or ():
            if k == "authorization" and isinstance(v, str) and v.startswith("Bearer "):
                return v[len("Bearer "):]
        return None

    @staticmethod
    def _parse(raw: bytes) -> lease_pb2.AgentMessage:
        m = lease_pb2.AgentMessage()
        try:
            m.ParseFromString(raw)
        except DecodeError as exc:
            raise BadRequest(f"undecodable AgentMessage ({len(raw)} bytes): {exc}") from None
        if m.WhichOneof("body") is None:
            raise BadRequest("AgentMessage with no body")
        return m

    async def _session(self, request_iterator, context):
        it = request_iterator.__aiter__()
        try:
            raw = await asyncio.wait_for(it.__anext__(), REGISTER_TIMEOUT_S)
            first = self._parse(raw)
            if first.WhichOneof("body") != "register":
                raise BadRequest(f"first message must be register, got {first.WhichOneof('body')}")
            reg = check_register(first.register, {s.site_id for s in self.cfg.sites}, self.cfg.broker.secret(),
                                 self._metadata_token(context), proofs=self.proofs,
                                 now_unix_ms=int(self.wall() * 1000))
            want = self.cfg.broker.job
            if want and reg.job != want:
                raise BadRequest(f"register.job: site {reg.site_id!r} trains {want!r} (broker.job), the agent "
                                 f"registered {reg.job[:200]!r}", code="failed-precondition", reason="wrong-job")
            if self.serves is not None:        # several replicas (xapp.shards): the site's own replica serves it
                elsewhere = self.serves(reg.site_id)
                if elsewhere is not None:
                    if elsewhere:
                        context.set_trailing_metadata(((REDIRECT_METADATA, elsewhere),))
                    raise BadRequest(f"site {reg.site_id!r} is controlled by another xApp replica "
                                     + (f"(its broker: {elsewhere})" if elsewhere else "(none holds its shard now)"),
                                     code="unavailable", reason="other-shard")
            sid, old = self.book.connect(reg, self.now())
        except (StopAsyncIteration, TimeoutError):
            return
        except BadRequest as exc:
            self.rejected += 1
            self.refused_registrations[exc.reason] = self.refused_registrations.get(exc.reason, 0) + 1
            log.warning("agent refused (%s) from %s: %s", exc.reason, context.peer(), exc)
            await context.abort(_CODES.get(exc.code, grpc.StatusCode.INVALID_ARGUMENT), str(exc))
            return

        stale = self.sessions.get(reg.site_id)
        if old is not None and stale is not None:
            # The old session was silent past the expiry (its stream never closed, e.g. a half-open TCP
            # connection): its lease is revoked and its stream closed before the new one is welcomed.
            log.warning("site %s: replacing agent %s, silent for %.1f s, with %s", reg.site_id, old.reg.agent_id,
                        self.now() - old.last_seen, reg.agent_id)
            self.revoke(reg.site_id, "agent-replaced")
            stale.close()
        sess = self.open_session(reg.site_id, sid)
        cross_site = self.cross_site(reg.site_id)
        sess.pass_expiry = cross_site.tier_pass_expiry_unix
        self.events.append((self.wall(), reg.site_id, "agent-connected", reg.agent_id))
        log.info("agent %s connected for site %s (%s, %d SMs / %d), job %s, mode %s: %s, worker bound by %s",
                 reg.agent_id, reg.site_id, reg.kind, reg.sm_count, reg.granularity, reg.job or "-", reg.mode,
                 reg.mode_evidence or "-", reg.confinement or "(not said)")
        yield lease_pb2.BrokerMessage(welcome=lease_pb2.Welcome(
            site_id=reg.site_id, epoch=self.book.epoch, heartbeat_ms=self.cfg.broker.heartbeat_ms,
            cross_site=cross_site, sent_unix_ms=int(self.wall() * 1000))).SerializeToString()
        yield lease_pb2.BrokerMessage(revoke=lease_pb2.Revoke(lease_id="", reason="new-session")).SerializeToString()

        error: list[BadRequest] = []
        reader = asyncio.ensure_future(self._read(it, sess, error))
        try:
            while True:
                msg = await sess.out.get()
                if msg is _CLOSE:
                    break
                yield msg.SerializeToString()
            if error:
                self.rejected += 1
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(error[0]))
        finally:
            reader.cancel()
            if self.sessions.get(reg.site_id) is sess:
                del self.sessions[reg.site_id]
                if self.book.revoke(reg.site_id) is not None:
                    self.revoked["agent-disconnected"] = self.revoked.get("agent-disconnected", 0) + 1
                    self.events.append((self.wall(), reg.site_id, "revoke", "agent-disconnected"))
            self.book.disconnect(reg.site_id, sid)
            self.events.append((self.wall(), reg.site_id, "agent-disconnected", reg.agent_id))

    async def _read(self, it, sess: _Session, error: list) -> None:
        try:
            async for raw in it:
                m = self._parse(raw)
                kind = m.WhichOneof("body")
                now = self.now()
                agent = self.book.seen(sess.site_id, sess.session, now)
                if agent is None:
                    break
                if kind == "heartbeat":
                    sess.push(lease_pb2.BrokerMessage(heartbeat=lease_pb2.Heartbeat(
                        seq=m.heartbeat.seq, sent_unix_ms=int(self.wall() * 1000))))
                    self._renew_pass(sess)
                elif kind == "usage":
                    self._usage(sess, m.usage, now)
                elif kind == "transfer":
                    t = m.transfer
                    agent.transfers.append((t.round, t.bytes, t.deadline_unix_ms, t.workers))
                elif kind == "round":
                    r = m.round
                    agent.rounds.append((r.round, r.committed, r.participants, r.tokens, r.bytes_sent,
                                         r.wall_ms, r.wait_ms))
                elif kind == "released":
                    seq = self.book.release_seq(sess.site_id, m.released.lease_id)
                    if seq is None:
                        self.refused_usage["release-earlier-epoch"] = self.refused_usage.get("release-earlier-epoch", 0) + 1
                        continue
                    self.released += 1
                    if self.on_release:
                        self.on_release(sess.site_id, seq, m.released.reason[:64])
                elif kind == "register":
                    raise BadRequest("register sent twice on one stream")
        except BadRequest as exc:
            if exc.reason.startswith("usage-"):
                self.refused_usage[exc.reason] = self.refused_usage.get(exc.reason, 0) + 1
            log.warning("site %s: agent message refused: %s", sess.site_id, exc)
            error.append(exc)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - stream torn down by the peer
            log.info("site %s: agent stream ended: %s", sess.site_id, exc)
        sess.close()

    def _usage(self, sess: _Session, u: lease_pb2.UsageReport, now: float) -> None:
        """Into the accounting, or counted as refused: a malformed report (BadRequest) ends the stream, a
        well-formed one on a lease this session may not report on (UsageRefused) is dropped."""
        check_usage(u)
        site = self.cfg.site(sess.site_id)
        try:
            self.book.record_usage(sess.site_id, sess.session, u, now, self.wall(), site.gpu_sms if site else 0)
        except UsageRefused as exc:
            self.refused_usage[exc.reason] = self.refused_usage.get(exc.reason, 0) + 1
            sess.refused += 1
            if sess.refused <= REFUSALS_LOGGED or sess.refused % 1000 == 0:
                log.warning("site %s: usage report refused (%s, %d on this stream): %s", sess.site_id, exc.reason,
                            sess.refused, exc)
