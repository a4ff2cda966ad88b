"""A model agent's place in the cross-site tier (issue 27 item 3): the Lighthouse's quorums without torch's work.

A real agent's tier (`agent.crosssite.tier`) runs torchft's Manager, whose server heartbeats the Lighthouse and
asks it for every round's quorum at the round boundary. A model agent keeps exactly those two calls, through
torchft's own `LighthouseClient`, and drops the rest (weights, store, collectives), so that `weaver up
--agents-model` puts a region's sites into the Lighthouse's quorums. A gated tier is reached the way a real site
reaches it: through the site's own `gate.Egress`, with the tier pass its lease stream handed it, so that the
Lighthouse host's gate checks every site's hello. The config, the round boundaries and the pass are the real
agent's (`TierConfig.from_proto`).

Per site it measures, at every round boundary: whether its request got a quorum, how long it waited (request ->
quorum) and how many sites that quorum held. Heartbeats go out from a few shared threads (`Heartbeats`), at a
third of the Lighthouse's heartbeat timeout, as a Manager sends them, and they go on while a site waits for a
quorum.
"""
from __future__ import annotations

import logging
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from datetime import timedelta

log = logging.getLogger("weaver.agent.tiermodel")

HEARTBEAT_THREADS = 4
MAX_ERROR = 200      # characters of an error kept for the figures


def preload_tier() -> None:
    """Import the tier's modules (agent.crosssite.tier, and with it torch; torchft's client): 2-3 s of CPU that a
    process pays before its sites connect, not on the loop that serves their lease streams at the first join."""
    import torchft._torchft  # noqa: F401

    import agent.crosssite.tier  # noqa: F401


@dataclass
class TierFigures:
    requests: int = 0
    quorums: int = 0
    failures: int = 0
    heartbeats: int = 0
    heartbeat_failures: int = 0
    wait_ms: list[float] = field(default_factory=list)
    members: list[int] = field(default_factory=list)     # sites in each quorum this site got
    last_error: str = ""


class TierMember:
    """One site in the tier: a thread that asks for a quorum at every round boundary until `stop`."""

    def __init__(self, config, clock=time.time):
        """`config`: the site's `agent.crosssite.tier.TierConfig` (its lease stream's CrossSiteConfig)."""
        self.config, self.clock = config, clock
        self.figures = TierFigures()
        self.client = None
        self.egress = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name=f"tier:{config.site_id}")

    def start(self) -> TierMember:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self.egress is not None:
            self.egress.close()

    def renew(self, config) -> None:
        """The broker renewed the site's pass (same epoch): connections made from now on carry it."""
        if self.egress is not None and config.identity is not None:
            self.egress.renew(config.identity)
        self.config = config

    def _error(self, exc: BaseException) -> None:
        self.figures.last_error = f"{type(exc).__name__}: {exc}"[:MAX_ERROR]

    def _connect(self):
        from torchft._torchft import LighthouseClient

        from agent.crosssite import gate

        c = self.config
        addr = c.lighthouse_addr
        if c.gated:
            self.egress = gate.Egress(c.identity, timeout_s=c.timeout_s)
            u = urllib.parse.urlsplit(c.lighthouse_addr)
            addr = f"http://127.0.0.1:{self.egress.port_for(u.hostname, u.port, 'lighthouse')}"
        return LighthouseClient(addr, timedelta(seconds=c.timeout_s))

    def heartbeat(self) -> None:
        client = self.client
        if client is None or self._stop.is_set():
            return
        try:
            client.heartbeat(self.config.site_id, timedelta(seconds=self.config.timeout_s))
            self.figures.heartbeats += 1
        except Exception as exc:  # noqa: BLE001 - torchft raises RuntimeError and others: counted, never fatal
            self.figures.heartbeat_failures += 1
            self._error(exc)

    def _run(self) -> None:
        while not self._stop.is_set() and self.client is None:
            try:
                self.client = self._connect()
            except Exception as exc:  # noqa: BLE001 - a Lighthouse not up yet: again in a round
                self.figures.failures += 1
                self._error(exc)
                self._stop.wait(self.config.round_s)
        last = -1
        while not self._stop.is_set():
            c, now = self.config, self.clock()
            k = max(c.next_round(now), last + 1)
            if self._stop.wait(max(0.0, c.boundary(k) - now)):
                return
            t0 = self.clock()
            self.figures.requests += 1
            try:
                q = self.client.quorum(replica_id=c.site_id, timeout=timedelta(seconds=c.quorum_timeout_s),
                                       address=c.site_id, store_address="", step=k, world_size=1)
            except Exception as exc:  # noqa: BLE001 - a timeout or a Lighthouse gone: counted, the next round asks again
                self.figures.failures += 1
                self._error(exc)
            else:
                self.figures.quorums += 1
                self.figures.wait_ms.append((self.clock() - t0) * 1e3)
                self.figures.members.append(len(q.participants))
            last = k


class Heartbeats:
    """The members' heartbeats from a few threads, each member every `interval_s` (members added at any time)."""

    def __init__(self, interval_s: float, threads: int = HEARTBEAT_THREADS):
        self.interval_s = interval_s
        self._members: list[list[TierMember]] = [[] for _ in range(threads)]
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._next = 0
        self._threads = [threading.Thread(target=self._run, args=(i,), daemon=True, name=f"tier-heartbeats:{i}")
                         for i in range(threads)]
        for t in self._threads:
            t.start()

    def add(self, member: TierMember) -> None:
        with self._lock:
            self._members[self._next % len(self._members)].append(member)
            self._next += 1

    def remove(self, member: TierMember) -> None:
        with self._lock:
            for group in self._members:
                if member in group:
                    group.remove(member)

    def _run(self, i: int) -> None:
        while not self._stop.is_set():
            t0 = time.monotonic()
            with self._lock:
                group = list(self._members[i])
            for m in group:
                m.heartbeat()
            self._stop.wait(max(0.0, self.interval_s - (time.monotonic() - t0)))

    def stop(self) -> None:
        self._stop.set()


class Tiers:
    """A process's sites in the tier: each site's member, made, renewed or dropped as its lease stream's
    CrossSiteConfig says, and the heartbeat threads they share (started with the first member)."""

    def __init__(self, clock=time.time):
        self.clock = clock
        self.members: dict[str, TierMember] = {}
        self.gone: list[TierMember] = []       # members a config change replaced: their figures still count
        self.refused: dict[str, str] = {}      # site -> why its last config was not joined
        self.heartbeats: Heartbeats | None = None

    def configure(self, site_id: str, msg) -> None:
        """`msg`: the site's `weaver.v1.CrossSiteConfig` (no Lighthouse named: the site leaves the tier)."""
        from agent.crosssite.tier import TierConfig  # torch and torchft load only where a site joins

        round_s = max(msg.round_ms, 50) / 1000.0
        try:
            # a real agent's bounds (CrossSiteAgent._config_of): a slow Lighthouse never holds a site for long
            cfg = TierConfig.from_proto(msg, site_id, timeout_s=max(5.0, 2 * round_s),
                                        quorum_timeout_s=max(10.0, 3 * round_s))
            self.refused.pop(site_id, None)
        except ValueError as exc:
            cfg, self.refused[site_id] = None, str(exc)[:MAX_ERROR]
        held = self.members.get(site_id)
        if held is not None and cfg is not None and cfg == held.config:
            held.renew(cfg)      # the same config but for the pass's expiry, which TierConfig does not compare
            return
        if held is not None:
            held.stop()
            self.heartbeats.remove(held)
            self.gone.append(self.members.pop(site_id))
        if cfg is None:
            return
        if self.heartbeats is None:    # a Manager's pace: a third of the Lighthouse's heartbeat timeout
            self.heartbeats = Heartbeats(cfg.heartbeat_timeout_ms / 3000.0)
        self.members[site_id] = TierMember(cfg, self.clock).start()
        self.heartbeats.add(self.members[site_id])

    def stop(self) -> None:
        for m in self.members.values():
            m.stop()
        if self.heartbeats is not None:
            self.heartbeats.stop()

    def figures(self) -> dict:
        """The tier's figures over this process's sites (every member it had)."""
        members = [*self.members.values(), *self.gone]
        waits = sorted(w for m in members for w in m.figures.wait_ms)
        sizes = sorted(n for m in members for n in m.figures.members)

        def pct(xs: list, q: float):
            return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else None

        errors = [m.figures.last_error for m in members if m.figures.last_error] + list(self.refused.values())
        return {"sites_joined": len(self.members), "sites_refused": len(self.refused),
                "sites_in_a_quorum": len({m.config.site_id for m in members if m.figures.quorums}),
                "quorum_requests": sum(m.figures.requests for m in members),
                "quorums": sum(m.figures.quorums for m in members),
                "quorum_failures": sum(m.figures.failures for m in members),
                "heartbeats": sum(m.figures.heartbeats for m in members),
                "heartbeat_failures": sum(m.figures.heartbeat_failures for m in members),
                "quorum_wait_ms_p50": pct(waits, 0.5), "quorum_wait_ms_p99": pct(waits, 0.99),
                "quorum_sites_min": sizes[0] if sizes else None, "quorum_sites_median": pct(sizes, 0.5),
                "quorum_sites_max": sizes[-1] if sizes else None, "an_error": errors[0] if errors else ""}
