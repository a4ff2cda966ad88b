"""Transport between the sites and the training cloud: an optical circuit switch scheduled from the
announced aggregate windows, an always-on circuit per site, and packet transport of per-UE flows.
Pure: times are seconds on the bench's clock, inputs are lists, outputs are what happened.

Optical circuit switch (`CircuitSwitch`): `n_circuits` circuits of `gbps` each at the cloud; pointing
one at another site takes `reconfig_s` (from microseconds for research OCS to tens or hundreds of
milliseconds for MEMS/piezo switches). Transfers are placed in order of earliest start (then deadline)
on the circuit that finishes them first. A circuit is set up just in time: its reconfiguration starts
`reconfig_s` before the transfer's earliest start, or as soon as the circuit is free. It is booked for
a site from the moment it is up; it is released after the transfer unless the site's next transfer on
it follows within `reconfig_s` (keeping it is then cheaper than giving it back and setting it up
again). A circuit that still points at a site needs no reconfiguration to serve it again. Nothing is
ever placed before its earliest start, and the reconfiguration and transfer intervals of one circuit
never overlap. A transfer that no circuit can finish by its deadline is not booked at all when
`packet_fallback` is on (the default): it is returned as a fallback, for the site's packet backhaul,
and takes no circuit time; with the fallback off it is placed at its earliest finish and flagged late.
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, kw_only=True)
class CircuitConfig:
    n_circuits: int = 1
    gbps: float = 10.0
    reconfig_s: float = 1e-3
    propagation_s: float = 2.5e-4   # ~50 km of metro fibre
    packet_fallback: bool = True    # a transfer no circuit can deliver in time goes over packet instead

    def __post_init__(self) -> None:
        if self.n_circuits < 1:
            raise ValueError(f"CircuitConfig.n_circuits must be >= 1, got {self.n_circuits}")
        if not self.gbps > 0:
            raise ValueError(f"CircuitConfig.gbps must be > 0, got {self.gbps}")
        if not 0 <= self.reconfig_s <= 10 or not 0 <= self.propagation_s <= 1:
            raise ValueError("CircuitConfig.reconfig_s must be in [0, 10] s and propagation_s in [0, 1] s")

    def duration_s(self, nbytes: int) -> float:
        return nbytes * 8 / (self.gbps * 1e9)


@dataclass(frozen=True)
class Transfer:
    key: tuple            # (site, round)
    site: str
    nbytes: int
    earliest_s: float
    deadline_s: float     # by when the last byte must have arrived at the cloud


@dataclass(frozen=True)
class Placed:
    key: tuple
    circuit: int
    start_s: float
    end_s: float          # last byte leaves the site
    arrive_s: float       # last byte at the cloud (inf for a fallback: the packet path decides)
    on_time: bool
    fallback: bool = False  # not booked: to be sent over packet transport (circuit -1)


@dataclass
class Booking:
    circuit: int
    site: str
    setup_s: float        # reconfiguration time spent before it was up (0: already pointing there)
    up_s: float
    release_s: float
    busy_s: float = 0.0   # seconds carrying bytes


@dataclass
class _Circuit:
    site: str | None = None
    free_s: float = float("-inf")   # end of its last reconfiguration or transfer
    booking: Booking | None = None


@dataclass
class CircuitSwitch:
    cfg: CircuitConfig
    circuits: list[_Circuit] = field(default_factory=list)
    bookings: list[Booking] = field(default_factory=list)
    placed: list[Placed] = field(default_factory=list)
    intervals: list[tuple[int, float, float, str]] = field(default_factory=list)  # circuit, t0, t1, kind

    def __post_init__(self) -> None:
        self.circuits = [_Circuit() for _ in range(self.cfg.n_circuits)]

    def _plan(self, c: _Circuit, t: Transfer) -> tuple[float, float, bool]:
        """(setup start, transfer start, keeps the open booking) for `t` on circuit `c`."""
        r = self.cfg.reconfig_s
        if c.site == t.site:
            keep = c.booking is not None and t.earliest_s - c.free_s <= r
            return max(c.free_s, t.earliest_s), max(c.free_s, t.earliest_s), keep
        setup = max(c.free_s, t.earliest_s - r)
        return setup, setup + r, False

    def schedule(self, transfers: list[Transfer]) -> list[Placed]:
        out = []
        for t in sorted(transfers, key=lambda t: (t.earliest_s, t.deadline_s, str(t.key))):
            dur = self.cfg.duration_s(t.nbytes)
            best = min(range(len(self.circuits)), key=lambda i: (self._plan(self.circuits[i], t)[1] + dur, i))
            c = self.circuits[best]
            setup, start, keep = self._plan(c, t)
            if self.cfg.packet_fallback and start + dur + self.cfg.propagation_s > t.deadline_s + 1e-12:
                out.append(Placed(key=t.key, circuit=-1, start_s=t.earliest_s, end_s=t.earliest_s,
                                  arrive_s=float("inf"), on_time=False, fallback=True))
                continue
            if not keep:
                self._release(c)
                reconf = start - setup if c.site != t.site else 0.0
                if reconf > 0:
                    self.intervals.append((best, setup, start, "setup"))
                c.booking = Booking(circuit=best, site=t.site, setup_s=reconf, up_s=start, release_s=start)
                c.site = t.site
            end = start + dur
            self.intervals.append((best, start, end, "transfer"))
            c.booking.busy_s += dur
            c.booking.release_s = end
            c.free_s = end
            arrive = end + self.cfg.propagation_s
            p = Placed(key=t.key, circuit=best, start_s=start, end_s=end, arrive_s=arrive,
                       on_time=arrive <= t.deadline_s + 1e-12)
            out.append(p)
        self.placed += out
        return out

    def _release(self, c: _Circuit) -> None:
        if c.booking is not None:
            self.bookings.append(c.booking)
            c.booking = None

    def finish(self) -> list[Booking]:
        """Release every circuit still booked; all bookings of the run."""
        for c in self.circuits:
            self._release(c)
        return self.bookings


def always_on(transfers: list[Transfer], cfg: CircuitConfig) -> list[Placed]:
    """One circuit per site, up for the whole run: each site's transfers back to back from their
    earliest start (the baseline that needs no announcements and no reconfiguration)."""
    free: dict[str, float] = {}
    out = []
    for t in sorted(transfers, key=lambda t: (t.earliest_s, str(t.key))):
        start = max(t.earliest_s, free.get(t.site, float("-inf")))
        end = start + cfg.duration_s(t.nbytes)
        free[t.site] = end
        arrive = end + cfg.propagation_s
        out.append(Placed(key=t.key, circuit=-1, start_s=start, end_s=end, arrive_s=arrive,
                          on_time=arrive <= t.deadline_s + 1e-12))
    return out


@dataclass(frozen=True)
class Flow:
    key: tuple
    site: str
    nbytes: int
    start_s: float


def packet_flows(flows: list[Flow], gbps: float, propagation_s: float) -> dict[tuple, float]:
    """Per-UE flows over each site's packet backhaul of `gbps`, shared equally by the flows in progress
    (processor sharing, the fluid limit of TCP fairness); returns when each flow's last byte reaches the
    cloud."""
    rate = gbps * 1e9 / 8
    out: dict[tuple, float] = {}
    by_site: dict[str, list[Flow]] = {}
    for f in flows:
        by_site.setdefault(f.site, []).append(f)
    for fs in by_site.values():
        fs.sort(key=lambda f: f.start_s)
        active: dict[tuple, float] = {}   # key -> bytes left
        t, i = float("-inf"), 0
        while i < len(fs) or active:
            nxt_arrival = fs[i].start_s if i < len(fs) else float("inf")
            if not active:
                t = nxt_arrival
            else:
                share = rate / len(active)
                k_min = min(active, key=active.get)
                t_done = t + active[k_min] / share
                if t_done <= nxt_arrival:
                    for k in active:
                        active[k] -= share * (t_done - t)
                    t = t_done
                    out[k_min] = t + propagation_s
                    del active[k_min]
                    continue
                for k in active:
                    active[k] -= share * (nxt_arrival - t)
                t = nxt_arrival
            while i < len(fs) and fs[i].start_s <= t:
                active[fs[i].key] = float(fs[i].nbytes)
                i += 1
    return out
