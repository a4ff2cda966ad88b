"""The broker's bookkeeping, with no gRPC in it: who is connected for which site, which lease each site
holds, what agents report. `xapp.broker` is the gRPC shell around it; the control loop reads it.

Validation lives here too so that a bad message is refused the same way however it arrives:
`check_register` / `check_usage` raise `BadRequest` (the shell maps it to INVALID_ARGUMENT, or
UNAUTHENTICATED for a token mismatch) naming the offending field.
Times: `now` is the caller's monotonic seconds; `now_unix` is wall-clock seconds for the persisted ledger.
"""
from __future__ import annotations

import hmac
import math
from collections import deque
from dataclasses import dataclass, field

from schemas.proto.weaver.v1 import lease_pb2

MODES = ("", "cpu", "cpu_preferred", "gpu_preferred", "gpu")
MAX_ID = 128


def lease_id(site_id: str, epoch: int, seq: int) -> str:
    return f"{site_id}.{epoch}.{seq}"


class BadRequest(ValueError):
    """An agent message that breaks the contract; `code` is "invalid" or "unauthenticated"."""

    def __init__(self, message: str, code: str = "invalid") -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True, kw_only=True)
class Registration:
    site_id: str
    agent_id: str
    kind: str
    sm_count: int
    granularity: int
    capabilities: tuple[str, ...]
    mode: str


def _ident(value: str, name: str) -> str:
    if not value or len(value) > MAX_ID or not value.isprintable():
        raise BadRequest(f"{name}: must be 1..{MAX_ID} printable characters, got {value[:40]!r}")
    return value


def check_register(msg: lease_pb2.Register, known_sites: set[str], token: str | None,
                   metadata_token: str | None = None) -> Registration:
    if token is not None:
        given = msg.token or metadata_token or ""
        if not hmac.compare_digest(given.encode(), token.encode()):
            raise BadRequest("bad or missing bearer token", code="unauthenticated")
    site = _ident(msg.site_id, "register.site_id")
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
    if msg.mode not in MODES:
        raise BadRequest(f"register.mode: expected one of {MODES[1:]}, got {msg.mode!r}")
    caps = tuple(_ident(c, "register.capabilities[]") for c in msg.capabilities)
    return Registration(site_id=site, agent_id=agent, kind=d.kind, sm_count=d.sm_count, granularity=d.granularity,
                        capabilities=caps, mode=msg.mode)


def check_usage(u: lease_pb2.UsageReport) -> None:
    for name in ("sm_ms_used", "sm_ms_granted", "overrun_ms", "window_ms"):
        v = getattr(u, name)
        if not math.isfinite(v) or v < 0:
            raise BadRequest(f"usage.{name}: expected a finite number >= 0, got {v}")
    if not u.lease_id or len(u.lease_id) > MAX_ID:
        raise BadRequest("usage.lease_id: required, at most 128 characters")


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


@dataclass(frozen=True, kw_only=True)
class LeaseIssued:
    lease: lease_pb2.Lease
    issued_unix: float
    valid_until_unix: float


class AgentBook:
    """Agents by site (the latest registration for a site wins) and each site's current lease."""

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
        self._sessions = 0

    # connections
    def connect(self, reg: Registration, now: float) -> tuple[int, AgentState | None]:
        """Returns (session id, the agent it replaced or None)."""
        self._sessions += 1
        old = self.agents.get(reg.site_id)
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
        limit = self.heartbeat_ms / 1000.0 * self.timeout_heartbeats
        return [s for s, a in self.agents.items() if now - a.last_seen > limit]

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
            lease_id=lease_id(site_id, self.epoch, seq), site_id=site_id, sm_count=sm_count,
            period_ms=self.period_ms, valid_for_ms=valid_ms, epoch=self.epoch, seq=seq,
            duty=min(1.0, sm_count / gpu_sms) if gpu_sms else 0.0, reason=reason,
            sent_unix_ms=int(now_unix * 1000), basis=basis)
        issued = LeaseIssued(lease=lease, issued_unix=now_unix, valid_until_unix=now_unix + valid_ms / 1000.0)
        self.leases[site_id] = issued
        return issued

    def release_seq(self, site_id: str, lease: str) -> int:
        """The seq a LeaseReleased names; BadRequest unless it is a lease issued to this site this epoch."""
        prefix = f"{site_id}.{self.epoch}."
        tail = lease[len(prefix):] if lease.startswith(prefix) else ""
        if not tail.isdigit() or not 0 < int(tail) <= self.seq.get(site_id, 0):
            raise BadRequest(f"released.lease_id: {lease[:64]!r} is not a lease issued to {site_id} in epoch "
                             f"{self.epoch}")
        return int(tail)

    def revoke(self, site_id: str) -> LeaseIssued | None:
        return self.leases.pop(site_id, None)

    def record_usage(self, site_id: str, u: lease_pb2.UsageReport, now: float, gpu_sms: int = 0) -> bool:
        """Keep a usage report; False (and not kept) when it names a lease this site never had in this epoch.

        `gpu_sms`: SMs of the site GPU the leases are cut from (0: unknown, the report is taken as is)."""
        a = self.agents.get(site_id)
        if a is None:
            return False
        prefix = f"{site_id}.{self.epoch}."
        if not u.lease_id.startswith(prefix):
            return False
        # A CPU agent (testbed, CI) stands in for the site GPU: its duty cycle over all its cores maps to the
        # lease's share of the GPU, so its core·ms convert to site SM·ms at gpu_sms / cores.
        scale = 1.0
        if a.reg.kind == "cpu" and a.reg.sm_count > 0 and gpu_sms > 0:
            scale = gpu_sms / a.reg.sm_count
        sample = UsageSample(now, u.sm_ms_used, u.sm_ms_granted, u.overrun_ms, u.steps, u.tokens, u.loss, u.mode,
                             u.window_ms, u.val_loss, u.device, u.mode_reason, scale)
        a.usage.append(sample)
        a.reports += 1
        self.used_sm_ms[site_id] = self.used_sm_ms.get(site_id, 0.0) + sample.site_sm_ms_used
        return True
