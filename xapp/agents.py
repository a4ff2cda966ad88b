"""The broker's bookkeeping, with no gRPC in it: who is connected for which site, which lease each site
holds, what agents report. `xapp.broker` is the gRPC shell around it; the control loop reads it.

Validation lives here too so that a bad message is refused the same way however it arrives:
`check_register` / `check_usage` raise `BadRequest` (the shell maps it to INVALID_ARGUMENT, or
UNAUTHENTICATED for a credential mismatch, or ALREADY_EXISTS for a site that has a live session) naming
the offending field. `BadRequest.reason` is the label refusals are counted under in /metrics.

Identity: with a broker secret configured, a site's credential is HMAC-SHA256(secret, site_id) in hex
(`site_credential`), so the credential an agent holds registers that one site and no other, and the
xApp keeps one secret instead of a token list. One live session per site: a second Register is refused
until the first stream has closed or has been silent past the heartbeat expiry.

Usage reports count only when they name a lease issued to the reporting session, arrive while that lease
is current or within `usage_grace_s` after it ended, and claim no more than the lease's partition could
do in one period (x (1 + USAGE_TOLERANCE)); anything else raises `UsageRefused` and never reaches the
ledger or the per-site SM·ms totals.
Times: `now` is the caller's monotonic seconds; `now_unix` is wall-clock seconds for the persisted ledger.
"""
from __future__ import annotations

import hmac
import math
from collections import OrderedDict, deque
from dataclasses import dataclass, field

from schemas.credential import PROOF_FRESH_MS, parse_proof, proof_mac, site_credential
from schemas.proto.weaver.v1 import lease_pb2
from xapp.state import LeaseRecord, lease_key
from xapp.waterfall import AGENT_FIELDS, UsageTotals

MODES = ("", "cpu", "cpu_preferred", "gpu_preferred", "gpu")
MAX_ID = 128
MAX_SHOWN = 2048    # longest registration text kept for display (job, mode evidence)
# A report may claim up to twice what the lease's partition could do in one full period: the window's
# last micro-batch may run past its end (the agent plans it within edge_batch_fraction of the period,
# and a preempted one runs longer), and that overrun is real usage we want to see, not to refuse. A claim
# beyond this is not physics but a broken or hostile agent.
USAGE_TOLERANCE = 1.0
LEASES_KEPT = 16          # leases per session a report may still name (the current one and its predecessors)


class ProofBook:
    """The registration proofs a broker took (schemas.credential), sans-IO: each proof once, only fresh, only
    made after this broker started (a Register captured before an xApp restart is not welcomed after it), and
    only under a credential that has not expired. A bare credential (a bearer token) is refused: it would be
    as good to whoever saw it on the wire."""

    def __init__(self, started_unix_ms: int, fresh_ms: int = PROOF_FRESH_MS, capacity: int = 65536) -> None:
        self.started_unix_ms = started_unix_ms
        self.fresh_ms = fresh_ms
        self.capacity = capacity
        self._seen: OrderedDict[tuple[str, str], int] = OrderedDict()   # (site, nonce) -> proof unix ms

    def check(self, token: str, site: str, agent_id: str, secret: str, now_unix_ms: int) -> None:
        p = parse_proof(token)
        if p is None:
            raise BadRequest(f"bad or missing token for site {site[:40]!r}: expected a registration proof made "
                             "with the site's credential (schemas.credential; a bare credential is refused)",
                             code="unauthenticated")
        cred = site_credential(secret, site, p.expiry_unix)
        if not hmac.compare_digest(p.mac, proof_mac(cred, site, agent_id, p)):
            raise BadRequest(f"bad or missing token for site {site[:40]!r}: the proof is not the site's "
                             "credential's", code="unauthenticated")
        if p.expiry_unix and p.expiry_unix * 1000 <= now_unix_ms:
            raise BadRequest(f"token for site {site[:40]!r}: the credential expired at {p.expiry_unix} "
                             "(re-issue it: weaver-xapp site-token SITE)", code="unauthenticated")
        if abs(now_unix_ms - p.unix_ms) > self.fresh_ms or p.unix_ms < self.started_unix_ms:
            raise BadRequest(f"token for site {site[:40]!r}: a stale proof (made at {p.unix_ms}; this broker "
                             f"takes proofs made since it started, within {self.fresh_ms} ms of its clock)",
                             code="unauthenticated")
        while self._seen and next(iter(self._seen.values())) < now_unix_ms - 2 * self.fresh_ms:
            self._seen.popitem(last=False)
        key = (site, p.nonce)
        if key in self._seen:
            raise BadRequest(f"token for site {site[:40]!r}: a proof already used (a replay)", code="unauthenticated")
        if len(self._seen) >= self.capacity:
            self._seen.popitem(last=False)
        self._seen[key] = p.unix_ms


class BadRequest(ValueError):
    """An agent message that breaks the contract; `code` is "invalid", "unauthenticated" or
    "already_exists" (the gRPC status the shell answers with); `reason` labels it in /metrics."""

    def __init__(self, message: str, code: str = "invalid", reason: str = "") -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason or code


class UsageRefused(BadRequest):
    """A well-formed UsageReport that is not taken into the accounting (the stream stays up)."""


@dataclass(frozen=True, kw_only=True)
class Registration:
    site_id: str
    agent_id: str
    kind: str
    sm_count: int
    granularity: int
    capabilities: tuple[str, ...]
    mode: str
    job: str = ""               # the training job it runs (shown, never acted on)
    mode_evidence: str = ""     # why it runs in `mode` (the agent's Execution Mode Identifier)
    cores: float = 0.0          # a CPU stand-in's fractional cores (0 = sm_count)
    confinement: str = ""       # what bounds its training worker: cgroup-v1 | cgroup-v2 | cooperative ("" = not said)


CONFINEMENTS = ("", "cgroup-v1", "cgroup-v2", "cooperative")


def _ident(value: str, name: str) -> str:
    if not value or len(value) > MAX_ID or not value.isprintable():
        raise BadRequest(f"{name}: must be 1..{MAX_ID} printable characters, got {value[:40]!r}")
    return value


def check_register(msg: lease_pb2.Register, known_sites: set[str], secret: str | None,
                   metadata_token: str | None = None, *, proofs: ProofBook | None = None,
                   now_unix_ms: int = 0) -> Registration:
    """`secret`: the broker secret (None: no credential required, the dev mode); the Register must then
    carry a proof made with the site's credential (`schemas.credential`) in `token` or as `authorization:
    Bearer` metadata, which `proofs` takes once."""
    site = _ident(msg.site_id, "register.site_id")
    if secret is not None:
        given = msg.token or metadata_token or ""
        # checked before the site is looked up, so an unauthenticated peer learns nothing of the site list
        if proofs is None:
            raise ValueError("check_register: a broker with a secret keeps a ProofBook")
        proofs.check(given, site, msg.agent_id, secret, now_unix_ms)
    if site not in known_sites:
        raise BadRequest(f"register.site_id: unknown site {site!r} (known: {sorted(known_sites)})")
    agent = _ident(msg.agent_id, "register.agent_id")
    d = msg.device
    if d.kind not in ("cuda", "cpu"):
        raise BadRequest(f"register.device.kind: expected 'cuda' or 'cpu', got {d.kind!r}")
    if not 0 < d.sm_count <= 4096:
        raise BadRequest(f"register.device.sm_count: expected 1..4096, got {d.sm_count}")
    if not 0 < d.granularity <= d.sm_count:
        raise BadRequest(f"register.device.granularity: expected 1..sm_count, got {d.granularity}")
    if d.cores and not (d.kind == "cpu" and 0.01 <= d.cores <= d.sm_count):
        raise BadRequest(f"register.device.cores: expected 0 or 0.01..sm_count on a cpu device, got {d.cores}")
    if msg.mode not in MODES:
        raise BadRequest(f"register.mode: expected one of {MODES[1:]}, got {msg.mode!r}")
    caps = tuple(_ident(c, "register.capabilities[]") for c in msg.capabilities)
    if msg.confinement not in CONFINEMENTS:
        raise BadRequest(f"register.confinement: expected one of {CONFINEMENTS[1:]} or empty, got {msg.confinement[:40]!r}")
    return Registration(site_id=site, agent_id=agent, kind=d.kind, sm_count=d.sm_count, granularity=d.granularity,
                        capabilities=caps, mode=msg.mode, cores=d.cores,
                        job=msg.job[:MAX_SHOWN], mode_evidence=msg.mode_evidence[:MAX_SHOWN],
                        confinement=msg.confinement)


def check_usage(u: lease_pb2.UsageReport) -> None:
    for name in ("sm_ms_used", "sm_ms_granted", "overrun_ms", "window_ms"):
        v = getattr(u, name)
        if not math.isfinite(v) or v < 0:
            raise BadRequest(f"usage.{name}: expected a finite number >= 0, got {v}", reason="usage-invalid")
    for name in AGENT_FIELDS:   # the waterfall's terms (signed: host starvation and the closing term may be < 0)
        v = getattr(u, name)
        if not math.isfinite(v):
            raise BadRequest(f"usage.{name}: expected a finite number, got {v}", reason="usage-invalid")
    if not u.lease_id or len(u.lease_id) > MAX_ID:
        raise BadRequest("usage.lease_id: required, at most 128 characters", reason="usage-invalid")


@dataclass(frozen=True)
class UsageSample:
    """One UsageReport as received (`t`: broker's monotonic seconds)."""
    t: float
    sm_ms_used: float
    sm_ms_granted: float
    overrun_ms: float
    steps: int
    tokens: int
    loss: float
    mode: str
    window_ms: float
    val_loss: float
    device: str
    mode_reason: str = ""
    sm_scale: float = 1.0                # site SMs per reported unit (gpu_sms / cores for a CPU agent, else 1)

    @property
    def site_sm_ms_used(self) -> float:
        """`sm_ms_used` in site SM·ms (a CPU agent reports core·ms)."""
        return self.sm_ms_used * self.sm_scale

    @property
    def used_sms(self) -> float | None:
        """Mean site SMs in use over the report window (SM·ms / ms); None without a window."""
        return self.site_sm_ms_used / self.window_ms if self.window_ms > 0 else None


@dataclass(frozen=True, kw_only=True)
class LeaseIssued:
    lease: lease_pb2.Lease
    issued_unix: float
    valid_until_unix: float

    def ledger_record(self, ended: str = "") -> LeaseRecord:
        """Its entry in the SDL lease ledger (`ended`: "" while it may be acted on, or why it ended)."""
        lease = self.lease
        return LeaseRecord(lease_id=lease.lease_id, site_id=lease.site_id, sm_count=lease.sm_count,
                           epoch=lease.epoch, seq=lease.seq, issued_unix=self.issued_unix,
                           valid_until_unix=self.valid_until_unix, reason=lease.reason, ended=ended)


@dataclass
class SessionLease:
    """A lease as the session it was issued to knows it; `ended_unix`: when it stopped being current
    (revoked, or superseded by the next one), None while it is."""
    issued: LeaseIssued
    ended_unix: float | None = None
    used_site_sm_ms: float = 0.0       # usage reported on it so far, in site SM·ms (bounded by its whole life)

    def end_unix(self) -> float:
        v = self.issued.valid_until_unix
        return v if self.ended_unix is None else min(v, self.ended_unix)


@dataclass
class AgentState:
    reg: Registration
    session: int                         # increases per connection, so a replaced stream is recognisable
    connected_at: float
    last_seen: float
    usage: deque = field(default_factory=lambda: deque(maxlen=256))
    rounds: deque = field(default_factory=lambda: deque(maxlen=64))
    transfers: deque = field(default_factory=lambda: deque(maxlen=64))
    reports: int = 0
    leases: OrderedDict = field(default_factory=OrderedDict)   # lease_id -> SessionLease, the last LEASES_KEPT


class AgentBook:
    """Agents by site (one live session per site) and each site's current lease."""

    def __init__(self, *, epoch: int, period_ms: int, valid_periods: int, heartbeat_ms: int,
                 timeout_heartbeats: int) -> None:
        self.epoch = epoch
        self.period_ms = period_ms
        self.valid_periods = valid_periods
        self.heartbeat_ms = heartbeat_ms
        self.timeout_heartbeats = timeout_heartbeats
        self.agents: dict[str, AgentState] = {}
        self.leases: dict[str, LeaseIssued] = {}        # site -> current (last issued) lease
        self.seq: dict[str, int] = {}
        self.used_sm_ms: dict[str, float] = {}          # site -> SM·ms the agents reported using, this run
        self.usage_totals: dict[str, UsageTotals] = {}  # site -> the held -> used waterfall (xapp.waterfall)
        self._sessions = 0

    @property
    def expiry_s(self) -> float:
        """Silence after which a session counts as gone (`lost`), and a new Register may replace it."""
        return self.heartbeat_ms / 1000.0 * self.timeout_heartbeats

    @property
    def usage_grace_s(self) -> float:
        """How long after a lease ended a report on it is still taken: the agent closes the window and
        queues its report at its next loop turn, which may wait out a micro-batch and a busy host."""
        return max(1.0, 2 * self.period_ms * self.valid_periods / 1000.0)

    # connections
    def connect(self, reg: Registration, now: float) -> tuple[int, AgentState | None]:
        """Returns (session id, the expired agent it replaced or None). A site whose session is alive (heard
        from within `expiry_s`) is not taken over: BadRequest("already_exists")."""
        old = self.agents.get(reg.site_id)
        if old is not None and now - old.last_seen <= self.expiry_s:
            raise BadRequest(f"site {reg.site_id!r} already has a live agent session (agent {old.reg.agent_id!r}, "
                             f"heard from {now - old.last_seen:.1f} s ago); a new registration is accepted once "
                             f"that stream closes or is silent for {self.expiry_s:g} s",
                             code="already_exists", reason="already-connected")
        self._sessions += 1
        self.agents[reg.site_id] = AgentState(reg=reg, session=self._sessions, connected_at=now, last_seen=now)
        return self._sessions, old

    def disconnect(self, site_id: str, session: int) -> bool:
        a = self.agents.get(site_id)
        if a is not None and a.session == session:
            del self.agents[site_id]
            return True
        return False

    def seen(self, site_id: str, session: int, now: float) -> AgentState | None:
        a = self.agents.get(site_id)
        if a is None or a.session != session:
            return None
        a.last_seen = now
        return a

    def lost(self, now: float) -> list[str]:
        """Sites whose agent has been silent for `timeout_heartbeats` heartbeat intervals."""
        return [s for s, a in self.agents.items() if now - a.last_seen > self.expiry_s]

    def connected_sites(self) -> set[str]:
        return set(self.agents)

    # leases
    def issue(self, site_id: str, sm_count: int, gpu_sms: int, reason: str, now_unix: float, *, seq: int = 0,
              basis: str = "") -> LeaseIssued:
        """`seq`: the loop's lease sequence number (xapp.invariant), 0 = the next one here. `now_unix`
        is the decision instant: the lease's hard end is that plus valid_for, however late it is sent."""
        seq = seq or self.seq.get(site_id, 0) + 1
        self.seq[site_id] = max(seq, self.seq.get(site_id, 0))
        valid_ms = self.period_ms * self.valid_periods
        lease = lease_pb2.Lease(
            lease_id=lease_key(site_id, self.epoch, seq), site_id=site_id, sm_count=sm_count,
            period_ms=self.period_ms, valid_for_ms=valid_ms, epoch=self.epoch, seq=seq,
            duty=min(1.0, sm_count / gpu_sms) if gpu_sms else 0.0, reason=reason,
            sent_unix_ms=int(now_unix * 1000), basis=basis)
        issued = LeaseIssued(lease=lease, issued_unix=now_unix, valid_until_unix=now_unix + valid_ms / 1000.0)
        self.leases[site_id] = issued
        a = self.agents.get(site_id)
        if a is not None:                      # the session it goes to: only it may report on it
            self._end_leases(a, now_unix)
            a.leases[lease.lease_id] = SessionLease(issued)
            while len(a.leases) > LEASES_KEPT:
                a.leases.popitem(last=False)
        return issued

    @staticmethod
    def _end_leases(a: AgentState, now_unix: float) -> None:
        for held in a.leases.values():
            if held.ended_unix is None:
                held.ended_unix = now_unix

    def release_seq(self, site_id: str, lease: str) -> int | None:
        """The seq a LeaseReleased names; None for a lease of this site from an earlier epoch (an agent that
        reconnected to a restarted xApp releasing what the killed one issued: nothing to do, its hard end
        bounds it); BadRequest unless it is a lease issued to this site this epoch."""
        prefix = f"{site_id}.{self.epoch}."
        epoch, _, seq = lease[len(site_id) + 1:].partition(".") if lease.startswith(f"{site_id}.") else ("", "", "")
        if epoch.isdigit() and seq.isdigit() and int(epoch) < self.epoch:
            return None
        tail = lease[len(prefix):] if lease.startswith(prefix) else ""
        if not tail.isdigit() or not 0 < int(tail) <= self.seq.get(site_id, 0):
            raise BadRequest(f"released.lease_id: {lease[:64]!r} is not a lease issued to {site_id} in epoch "
                             f"{self.epoch}")
        return int(tail)

    def revoke(self, site_id: str, now_unix: float | None = None) -> LeaseIssued | None:
        """`now_unix`: when the revocation was decided (reports on the lease are then taken for
        `usage_grace_s` more); None: the lease's validity alone bounds them."""
        a = self.agents.get(site_id)
        if a is not None and now_unix is not None:
            self._end_leases(a, now_unix)
        return self.leases.pop(site_id, None)

    def check_report(self, a: AgentState, u: lease_pb2.UsageReport, now_unix: float) -> SessionLease:
        """The lease a (field-checked) report is on; UsageRefused unless it is one issued to this session, still
        current or within the grace, and the report claims no more than the lease's partition could do."""
        held = a.leases.get(u.lease_id)
        if held is None:
            raise UsageRefused(f"usage.lease_id: {u.lease_id[:64]!r} is not a lease issued to this session",
                               reason="usage-unknown-lease")
        late = now_unix - held.end_unix()
        if late > self.usage_grace_s:
            raise UsageRefused(f"usage.lease_id: {u.lease_id[:64]!r} ended {late:.1f} s ago (reports are taken "
                               f"up to {self.usage_grace_s:g} s after a lease ends)", reason="usage-late")
        lease = held.issued.lease
        if u.window_ms > lease.period_ms + 1.0:   # + 1 ms: float rounding of the agent's window length
            raise UsageRefused(f"usage.window_ms: {u.window_ms:g} exceeds the lease period {lease.period_ms} ms",
                               reason="usage-exceeds-lease")
        # In the agent's own units (SMs, or cores for a CPU agent): leased work runs on a partition of at most
        # the lease's SMs and at most the device (agent.site_agent.partition_units).
        units = min(lease.sm_count, a.reg.sm_count)
        bound = units * lease.period_ms * (1.0 + USAGE_TOLERANCE)
        for name in ("sm_ms_used", "sm_ms_granted", *AGENT_FIELDS):
            v = abs(getattr(u, name))
            if v > bound:
                raise UsageRefused(f"usage.{name}: {v:g} exceeds what lease {u.lease_id[:64]!r} allows "
                                   f"({units} x {lease.period_ms} ms x {1 + USAGE_TOLERANCE:g} = {bound:g})",
                                   reason="usage-exceeds-lease")
        return held

    def record_usage(self, site_id: str, session: int, u: lease_pb2.UsageReport, now: float, now_unix: float,
                     gpu_sms: int = 0) -> bool:
        """Keep a usage report of `session` (received at `now`, `now_unix` on the wall clock); False when that
        session is no longer the site's. A report `check_report` refuses raises UsageRefused and is not kept.

        `gpu_sms`: SMs of the site GPU the leases are cut from (0: unknown, the report is taken as is)."""
        a = self.agents.get(site_id)
        if a is None or a.session != session:
            return False
        held = self.check_report(a, u, now_unix)
        # A CPU agent (testbed, CI) stands in for the site GPU: its duty cycle over all its cores maps to the
        # lease's share of the GPU, so its core·ms convert to site SM·ms at gpu_sms / cores.
        scale = 1.0
        cores = a.reg.cores if 0 < a.reg.cores < a.reg.sm_count else a.reg.sm_count   # fractional stand-in
        if a.reg.kind == "cpu" and cores > 0 and gpu_sms > 0:
            scale = gpu_sms / cores
        # The bound in site SM·ms, from the broker's own record of the lease (its SMs and life), whatever the
        # agent declared its device to be (a stand-in that registered 0.01 cores scales its reports 100x):
        # per report at most the lease's SMs over the window, per lease at most its SMs over its whole life.
        lease = held.issued.lease
        site_used = u.sm_ms_used * scale
        per_report = lease.sm_count * (u.window_ms or lease.period_ms) * (1.0 + USAGE_TOLERANCE)   # 0: a period
        per_lease = lease.sm_count * lease.valid_for_ms * (1.0 + USAGE_TOLERANCE)
        if site_used > per_report + 1e-9 or held.used_site_sm_ms + site_used > per_lease + 1e-9:
            raise UsageRefused(f"usage.sm_ms_used: {site_used:g} site SM·ms is more than lease {u.lease_id[:64]!r} "
                               f"({lease.sm_count} SMs, {lease.valid_for_ms} ms) allows, with "
                               f"{held.used_site_sm_ms:g} reported on it already", reason="usage-exceeds-lease")
        held.used_site_sm_ms += site_used
        sample = UsageSample(now, u.sm_ms_used, u.sm_ms_granted, u.overrun_ms, u.steps, u.tokens, u.loss, u.mode,
                             u.window_ms, u.val_loss, u.device, u.mode_reason, scale)
        a.usage.append(sample)
        a.reports += 1
        self.used_sm_ms[site_id] = self.used_sm_ms.get(site_id, 0.0) + sample.site_sm_ms_used
        self.usage_totals.setdefault(site_id, UsageTotals()).add(u, scale)
        return True
