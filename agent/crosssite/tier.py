"""The inter-site tier: time-boxed, token-weighted rounds on torchft's Manager and Lighthouse.

It wraps a trainer the way torchtitan's FaultTolerantTrainer does: the trainer owns the model, its
inner optimiser and its budget; the agent's lease loop calls `due`/`begin`/`poll` between launches
and never stops training for the wide area (`run_round(local_work)` serves callers without a loop).
Without this tier the trainer runs alone.

Per round (compute-and-training-facts.md §6.2), overlapped with compute (Streaming DiLoCo):
  1. at the start of the round's transfer window the loop thread snapshots the weights (`begin`) and
     announces a TransferPlan (bytes, window, deadline); local training goes on;
  2. on the exchange thread, on the site leader: `start_quorum()` (joiners live-heal the global
     state from a healthy peer here) and a MAX all-reduce agreeing on the round index;
  3. SUM all-reduce of the statistics (tokens, steps) of the work up to the snapshot;
  4. SUM all-reduce of t_i·Δ_i, Δ_i = global − snapshot_i (FedNova-normalised when step counts
     differ widely);
  5. `should_commit()`; on success the outer Nesterov step, and the round's tokens count;
  6. back on the loop thread, once landed (`poll`): the weights become the new global weights plus
     what the site trained since its snapshot (a failed round is discarded everywhere: onto the old
     global weights).
torchft's own DiLoCo class is not used: it syncs every H steps, which is the lockstep we avoid.

The tier's state and arithmetic live on the host, whatever device the model trains on: the global
weights, the outer optimizer, the deltas, the compression residuals and the collectives (gloo) are
CPU tensors. The model's parameters cross only as copies (never kernels): device-to-host at the
snapshot (`flatten`), device-to-host and host-to-device per parameter at the merge, whose sum is
formed on the host (`unflatten_into`, step 6).
"""
from __future__ import annotations

import contextlib
import hashlib
import math
import os
import socket
import threading
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import timedelta

import torch
from torch.distributed import ReduceOp, TCPStore

from agent.crosssite.aggregate import ErrorFeedback, SiteReducer, wire_bytes
from agent.crosssite.rounds import (
    N_STATS,
    LocalWork,
    OuterOptimizer,
    RoundPolicy,
    RoundStats,
    TokenLedger,
    contribution_ok,
    flatten,
    gradient_ok,
    merged,
    outer_gradient,
    payload_row_ok,
    slotted,
    stats_row_ok,
    stats_tensor,
    unflatten_into,
    use_fednova,
    weighted_delta,
)
from schemas.tierpass import TierIdentity, TierPass, public_key

Clock = Callable[[], float]   # unix seconds; only the shell reads the real one
Sleep = Callable[[float], None]


@dataclass(frozen=True)
class TierConfig:
    """Everything a site needs to join; all of it arrives in the lease stream (CrossSiteConfig)."""

    lighthouse_addr: str
    site_id: str
    round_ms: int = 1000
    round_epoch_ms: int = 0            # unix ms of round 0's start: sites agree on boundaries
    heartbeat_timeout_ms: int = 400    # enforced by the Lighthouse; here it sizes the heartbeat interval
    compression: str = "none"          # wide-area wire format: none | bf16 (SUM all-reduce)
    # The tail of each round is the transfer window: local work stops this much before the
    # boundary, the all-reduces run inside it, and every member opens the next quorum at the boundary
    # itself. Opening quorums together matters: the Lighthouse issues a "fast quorum" as soon as the
    # previous members are back, so a site asking a few ms late would be left out for a round.
    # The Lighthouse's join timeout must exceed one round (see docs/crosssite.md).
    transfer_window_fraction: float = 0.15
    min_work_fraction: float = 0.3     # at least this much of a round is trained before a (first or next) snapshot
    timeout_s: float = 10.0            # collectives and should_commit
    quorum_timeout_s: float = 60.0
    policy: RoundPolicy = field(default_factory=RoundPolicy)
    # the heal path (agent.crosssite.transport): the key the broker hands admitted sites, the interface the
    # state server binds, and the bound on the global weights a peer may hand over
    tier_key: bytes = field(default=b"", repr=False)
    tier_epoch: int = 0                # the epoch tier_key and the pass are of (the gates' hello says it)
    # a gated tier: this site's pass (schemas.tierpass), the CA key every gate checks passes with, the site's
    # signing key, and its pass; a renewed pass is the same config (the tier takes it without a rejoin)
    tier_ca: bytes = b""
    tier_site_key: bytes = field(default=b"", repr=False, compare=False)
    tier_pass_expiry_unix: int = field(default=0, compare=False)
    tier_pass_signature: bytes = field(default=b"", repr=False, compare=False)
    bind_host: str = "127.0.0.1"
    max_weight_norm: float = 1e4
    # robust aggregation (rounds.contribution_ok / gradient_ok): no site's round delta is larger than this
    max_delta_norm: float = 1e3

    def __post_init__(self) -> None:
        if self.tier_key and len(self.tier_key) < 16:
            raise ValueError("TierConfig.tier_key must be at least 16 bytes (or empty: no peer's state is taken)")
        if not self.max_delta_norm > 0:
            raise ValueError(f"TierConfig.max_delta_norm must be positive, got {self.max_delta_norm}")
        if not self.max_weight_norm > 0:
            raise ValueError(f"TierConfig.max_weight_norm must be positive, got {self.max_weight_norm}")
        if not self.lighthouse_addr.startswith(("http://", "https://", "gate://")):
            raise ValueError(f"TierConfig.lighthouse_addr must be an http(s) or gate:// URL, got {self.lighthouse_addr!r}")
        if self.gated and not (self.tier_key and self.identity is not None):
            raise ValueError("a gated tier (lighthouse_addr gate://) needs the tier key and the site's tier pass: the "
                             "broker hands both to admitted sites")
        if not self.site_id:
            raise ValueError("TierConfig.site_id must not be empty")
        if self.round_ms < 50:
            raise ValueError(f"TierConfig.round_ms must be >= 50, got {self.round_ms}")
        if self.heartbeat_timeout_ms < 10:
            raise ValueError(f"TierConfig.heartbeat_timeout_ms must be >= 10, got {self.heartbeat_timeout_ms}")
        if self.compression not in ("none", "bf16"):
            raise ValueError(f"TierConfig.compression must be 'none' or 'bf16', got {self.compression!r}")
        if not 0.0 < self.transfer_window_fraction < 1.0:
            raise ValueError(f"TierConfig.transfer_window_fraction must be in (0, 1), got {self.transfer_window_fraction}")
        if not 0.0 <= self.min_work_fraction < 1.0 - self.transfer_window_fraction:
            raise ValueError(f"TierConfig.min_work_fraction must be in [0, 1 - transfer window), got {self.min_work_fraction}")

    @classmethod
    def from_proto(cls, msg, site_id: str, **overrides) -> TierConfig | None:
        """From a `weaver.v1.CrossSiteConfig`; None when the coordinator disabled the tier."""
        if not msg.lighthouse_addr:
            return None
        kw = dict(lighthouse_addr=msg.lighthouse_addr, site_id=site_id,
                  round_ms=msg.round_ms or 1000, round_epoch_ms=msg.round_epoch_ms,
                  heartbeat_timeout_ms=msg.heartbeat_timeout_ms or 400, tier_key=bytes(msg.tier_key),
                  tier_epoch=msg.tier_epoch, tier_ca=bytes(msg.tier_ca), tier_site_key=bytes(msg.tier_site_key),
                  tier_pass_expiry_unix=msg.tier_pass_expiry_unix, tier_pass_signature=bytes(msg.tier_pass_signature))
        kw.update(overrides)
        return cls(**kw)

    @classmethod
    def with_identity(cls, identity: TierIdentity, **kw) -> TierConfig:
        """A config holding `identity` (its epoch, CA key, site key and pass)."""
        p = identity.tier_pass
        return cls(tier_epoch=p.epoch, tier_ca=identity.ca_public, tier_site_key=identity.site_key,
                   tier_pass_expiry_unix=p.expiry_unix, tier_pass_signature=p.ca_signature, **kw)

    @property
    def identity(self) -> TierIdentity | None:
        """This site's tier pass with its key, or None (none was handed, or it is not well formed)."""
        if len(self.tier_ca) != 32 or len(self.tier_site_key) != 32 or len(self.tier_pass_signature) != 64:
            return None
        try:
            p = TierPass(self.site_id, self.tier_epoch, self.tier_pass_expiry_unix, public_key(self.tier_site_key),
                         self.tier_pass_signature)
        except ValueError:
            return None
        return TierIdentity(p, self.tier_site_key, self.tier_ca)

    @property
    def gated(self) -> bool:
        """Every tier service of this site answers only through a gate (agent.crosssite.gate)."""
        return self.lighthouse_addr.startswith("gate://")

    @property
    def round_s(self) -> float:
        return self.round_ms / 1000.0

    def boundary(self, k: int) -> float:
        """Unix time at which round k starts."""
        return self.round_epoch_ms / 1000.0 + k * self.round_s

    def next_round(self, now: float) -> int:
        """The round to open now: the current one if its start is at most a few ms past, else the next."""
        k = math.floor((now - self.round_epoch_ms / 1000.0) / self.round_s)
        return k if now - self.boundary(k) <= 0.02 * self.round_s else k + 1

    def work_deadline(self, now: float) -> tuple[int, float]:
        """(round, end of local work) for a quorum that returned at `now`: the first round whose work
        phase still has min_work_fraction of a round left."""
        k = math.floor((now - self.round_epoch_ms / 1000.0) / self.round_s)
        while True:
            end = self.boundary(k + 1) - self.transfer_window_fraction * self.round_s
            if end - now >= self.min_work_fraction * self.round_s:
                return k, end
            k += 1


@dataclass(frozen=True)
class TransferPlan:
    """The aggregate this site will put on the wide-area link: size and when it must have arrived."""

    site_id: str
    round: int
    bytes: int
    window_start_unix_ms: int
    deadline_unix_ms: int
    workers: int


@dataclass(frozen=True)
class RoundRecord:
    """Everything measured about one round at one site (a superset of weaver.v1.RoundReport)."""

    site_id: str
    round: int               # wall-clock round index (same on every site)
    step: int                # committed rounds before this one (torchft step)
    committed: bool
    participants: int
    tokens: int              # this site's tokens, all its workers (counted only if committed)
    round_tokens: int        # all sites' tokens in this round
    steps: int
    contributors: int
    fednova: bool
    healed: bool
    bytes_sent: int
    wall_ms: float
    work_ms: float
    quorum_ms: float
    wait_ms: float           # blocked at the end of the round waiting for the slowest site
    idle_ms: float           # before the round: waiting for its boundary (the rest of the last transfer window)
    committed_total: int     # global committed tokens after this round
    loss: float
    checksum: str            # of the global weights after the round
    dropped_own: bool = False   # this site's weights were not fit to send (non-finite, beyond the delta bound)
    dropped_peers: int = 0      # gathered rows of this round that could not be an honest site's, left out
    refused: str = ""           # why the reduced sum, or the step it gave, was refused ("" = it was not)

    def to_json(self) -> dict:
        return asdict(self)


def checksum(flat: torch.Tensor) -> str:
    return hashlib.sha256(flat.detach().cpu().contiguous().numpy().tobytes()).hexdigest()[:16]


@dataclass(frozen=True)
class _Snapshot:
    """What the loop thread hands the exchange at the start of a transfer window."""

    round: int
    window_start: float      # unix s: the announced window's start (the work deadline of the schedule)
    taken_at: float          # unix s: when the loop thread took it (at its first iteration after the start)
    local_flat: torch.Tensor  # the site's weights then (CPU float32 copy)
    work: LocalWork          # what the site trained since the previous snapshot, based on `global_flat`


@dataclass
class _Exchange:
    """One round's collectives, run on the exchange thread; the loop thread reads it once `done`."""

    snap: _Snapshot
    done: threading.Event = field(default_factory=threading.Event)
    round: int = 0
    participants: int = 0
    step: int = 0
    site_tokens: int = 0
    stats: RoundStats | None = None
    fednova: bool = False
    committed: bool = False
    healed: bool = False
    dropped_own: bool = False
    dropped_peers: int = 0
    refused: str = ""
    t_quorum: float = 0.0
    t_done: float = 0.0
    error: BaseException | None = None


def preload() -> None:
    """Import torchft now. Its first import costs ~0.13 s of CPU (more than a whole lease period of a CPU
    stand-in's budget); an agent pays it at start-up, before it connects, instead of on its joining thread
    in the middle of its first leases, where on a CPU-only site it would be executed beyond them."""
    import torchft.manager  # noqa: F401
    import torchft.process_group  # noqa: F401


_BIND_LOCK = threading.Lock()


@contextlib.contextmanager
def _manager_bound_to(host: str, on_bound: Callable[[int], None] | None = None):
    """torchft's Manager binds its ManagerServer (quorum, checkpoint metadata, and an unauthenticated Kill)
    to every interface ("[::]:port", fixed in Manager.__init__); its server is created with the configured
    interface instead, so only what can reach that interface can reach it. `on_bound(port)` learns the port.
    The Manager's client of its own store resolves a gated site's advertised name (agent.crosssite.gate)."""
    import torchft.manager as tfm

    from agent.crosssite import gate

    real_server, real_store = tfm.ManagerServer, tfm.TCPStore

    def bound(*args, bind: str, **kwargs):
        srv = real_server(*args, bind=f"{host}:{bind.rsplit(':', 1)[1]}", **kwargs)
        if on_bound is not None:
            on_bound(int(srv.address().rsplit(":", 1)[1]))
        return srv

    def store(host_name: str, port: int, *args, **kwargs):
        h, p = gate.connect_address(host_name, port, "store")
        return real_store(h, p, *args, **kwargs)
    with _BIND_LOCK:
        tfm.ManagerServer, tfm.TCPStore = bound, store
        try:
            yield
        finally:
            tfm.ManagerServer, tfm.TCPStore = real_server, real_store


_CLIENTS_LOCK = threading.Lock()


def _install_gated_clients() -> None:
    """torchft's Manager dials a ManagerServer by the address the quorum names (its own, and a heal source's):
    through agent.crosssite.gate's resolver, which passes an ungated address unchanged. Once per process."""
    import torchft.manager as tfm

    from agent.crosssite import gate

    with _CLIENTS_LOCK:
        if getattr(tfm.ManagerClient, "weaver_gated", False):
            return
        real = tfm.ManagerClient

        def client(addr: str, *args, **kwargs):
            u = urllib.parse.urlsplit(addr)
            if u.hostname and u.port and gate.parse_advertised(u.hostname):
                h, p = gate.connect_address(u.hostname, u.port, "manager")
                addr = f"http://{h}:{p}"
            return real(addr, *args, **kwargs)
        client.weaver_gated = True
        tfm.ManagerClient = client


_GLOO_LOCK = threading.Lock()


def _gloo(timeout: timedelta, host: str):
    """torchft's gloo process group: its rendezvous (the quorum's store address) goes through the gate's
    resolver, and its pairwise connections listen on the tier's interface only (gloo's default device
    listens on whatever the machine's hostname resolves to)."""
    import torchft.process_group as tpg

    from agent.crosssite import gate

    class GatedGloo(tpg.ProcessGroupGloo):
        def configure(self, store_addr: str, *args, **kwargs):
            addr, _, prefix = store_addr.partition("/")
            h, _, port = addr.rpartition(":")
            h, p = gate.connect_address(h.strip("[]"), int(port), "store")
            return super().configure(f"{h}:{p}/{prefix}", *args, **kwargs)

        def _create_pg(self, store, rank: int, world_size: int):
            real = tpg.BaseProcessGroupGloo

            def on_host(store, rank, size, timeout):
                opts = real._Options()
                opts._timeout = timeout
                opts._devices = [real.create_device(hostname=host)]
                return real(store, rank, size, opts)
            on_host.create_device = real.create_device
            with _GLOO_LOCK:
                tpg.BaseProcessGroupGloo = on_host
                try:
                    return super()._create_pg(store, rank, world_size)
                finally:
                    tpg.BaseProcessGroupGloo = real
    return GatedGloo(timeout=timeout)


class CrossSiteTier:
    """One site's membership in the cross-site tier (the Manager lives on the site leader only).

    Rounds overlap compute (Streaming DiLoCo's overlap, with a one-round-delayed outer step): at the
    start of round k's transfer window the loop thread snapshots the site's weights (`begin`) and
    training goes on; an exchange thread runs the quorum and the all-reduces of Δ_k = global_k −
    snapshot_k meanwhile, and the outer step gives global_{k+1}. When it has landed the loop thread
    merges (`poll`): the weights become global_{k+1} + (local_now − snapshot_k), the new global plus
    what the site trained since the snapshot, so every local step enters exactly one round's delta and
    no compute waits for the wide area. A round that fails or does not commit merges onto global_k
    (its delta is dropped everywhere, as before); a joiner that healed in the quorum restarts from the
    healed global weights (its local work was based on other weights and contributed nothing).
    `run_round` is the same protocol with the local work in front, for callers that have no loop.
    """

    def __init__(self, model: torch.nn.Module, config: TierConfig, *, clock: Clock = time.time,
                 sleep: Sleep = time.sleep, reducer: SiteReducer | None = None,
                 on_transfer_plan: Callable[[TransferPlan], None] | None = None,
                 on_round: Callable[[RoundRecord], None] | None = None):
        self.config = config
        self.clock = clock
        self.sleep = sleep
        self.reducer = reducer or SiteReducer()
        self.on_transfer_plan = on_transfer_plan
        self.on_round = on_round
        # Tied weights appear once; frozen ones (a LoRA job's base) never change, so they are not averaged.
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.global_flat = flatten(self.params).clone()
        self.outer = OuterOptimizer(self.global_flat, config.policy)
        self.ledger = TokenLedger()
        self.wan_feedback = ErrorFeedback(config.compression)
        self.wire_bytes = wire_bytes(self.global_flat.numel(), config.compression)
        self._healed = False
        self._last_snapshot_at = self.clock()
        self._inflight: _Exchange | None = None
        self.next_round, self.window_start = config.work_deadline(self.clock())
        self.manager = None
        self._store = None
        self.gate = None           # agent.crosssite.gate, in a gated tier: this site's one tier listener
        self.egress = None         # ... and its way out to the peers' gates
        self.advertised = ""
        self.dropped_contributions = 0    # rounds this site sat out: its own weights were not fit to send
        self.refused_rounds = 0           # rounds whose reduced sum, or the step it gave, was refused
        self.dropped_peer_rows = 0        # peers' gathered rows left out of a round (robust aggregation)
        if self.reducer.leader:
            self._start_manager()

    def _start_manager(self) -> None:
        from torchft.manager import Manager

        from agent.crosssite import gate
        from agent.crosssite.transport import SignedStateTransport, StateCheck

        c = self.config
        # no key from the broker (an older one): a key of its own, so this site heals from no one, rather than
        # from anyone; nothing a peer serves is ever unpickled (torchft's default transport would)
        key = c.tier_key or os.urandom(32)
        check = StateCheck(template=lambda: {"user": {"default": self._state_dict()},
                                             "torchft": {"step": 0, "batches_committed": 0}},
                           max_weight_norm=c.max_weight_norm, round_ms=c.round_ms, round_epoch_ms=c.round_epoch_ms,
                           clock=self.clock)
        # gated: every service binds loopback, the gate is the site's one listener on the tier's interface, and
        # the site names its services by the gate (the quorum carries that name to peers)
        inner, advertised, lighthouse = c.bind_host, c.bind_host, c.lighthouse_addr
        if c.gated:
            inner = "127.0.0.1"
            self.gate = gate.GateServer(c.bind_host, 0, lambda e: c.tier_ca if e == c.tier_epoch else None,
                                        name=f"gate:{c.site_id}").start()
            advertised = gate.advertise(c.bind_host, self.gate.port)
            self.egress = gate.Egress(c.identity)
            gate.register_egress(self.egress)
            u = urllib.parse.urlsplit(c.lighthouse_addr)
            lighthouse = f"http://127.0.0.1:{self.egress.port_for(u.hostname, u.port, 'lighthouse')}"
            _install_gated_clients()
        self.advertised = advertised

        def serve(service: str, port: int) -> None:
            if self.gate is not None:
                gate.register_local(advertised, service, port)
                self.gate.set_service(service, port)
        self.transport = SignedStateTransport(key, check, host=inner, advertise=advertised)
        serve("state", int(self.transport.address.rsplit(":", 1)[1]))
        # the site's own store (torchft's rendezvous): c10d binds a store to every interface unless handed a
        # socket, so it gets one on the configured interface
        sock = socket.create_server((inner, 0), backlog=64)
        self._store = TCPStore(inner, sock.getsockname()[1], is_master=True, wait_for_workers=False,
                               master_listen_fd=sock.fileno())
        sock.detach()    # the store owns the descriptor now
        serve("store", self._store.port)
        with _manager_bound_to(inner, lambda port: serve("manager", port)):
            self.manager = Manager(
                checkpoint_transport=self.transport,
                pg=_gloo(timedelta(seconds=c.timeout_s), c.bind_host),
                load_state_dict=self._load_state_dict, state_dict=self._state_dict,
                min_replica_size=1, use_async_quorum=False,
                timeout=timedelta(seconds=c.timeout_s), quorum_timeout=timedelta(seconds=c.quorum_timeout_s),
                connect_timeout=timedelta(seconds=c.timeout_s), rank=0, world_size=1,
                store_addr=advertised, store_port=self._store.port, lighthouse_addr=lighthouse,
                replica_id=c.site_id, hostname=advertised,
                heartbeat_interval=timedelta(milliseconds=max(10, min(100, c.heartbeat_timeout_ms // 4))),
                init_sync=True)

    # -- healing: a joiner receives exactly the global state, never a peer's half-trained weights --
    def _state_dict(self) -> dict:
        return {"global": self.global_flat, "outer": self.outer.heal_state(), "ledger": self.ledger.state_dict()}

    def _load_state_dict(self, state: dict) -> None:
        # validated before it gets here (transport.StateCheck: names, shapes, dtypes, finite, bounds)
        self.global_flat.copy_(state["global"])
        self.outer.load_heal_state(state["outer"])
        self.ledger.load_state_dict(state["ledger"])
        self._healed = True

    def _allreduce(self, t: torch.Tensor, op: ReduceOp) -> torch.Tensor:
        self.manager.allreduce(t, reduce_op=op).wait()
        return t

    # -- the loop thread's side: never blocks on the wide area -------------------------------------
    @property
    def in_flight(self) -> bool:
        return self._inflight is not None

    @property
    def landed(self) -> bool:
        """The round in flight has finished its exchange: the next `poll` merges it (or raises)."""
        return self._inflight is not None and self._inflight.done.is_set()

    def due(self, now: float | None = None) -> bool:
        """True when the loop should call `begin`: no round in flight and the transfer window opened."""
        return self._inflight is None and (self.clock() if now is None else now) >= self.window_start

    def begin(self, work: LocalWork) -> None:
        """Snapshot the weights for round `next_round` and start its exchange; `work` is what the site
        trained since the previous snapshot (on the weights the last merge gave it). Loop thread."""
        if self._inflight is not None:
            raise RuntimeError("a round is already in flight")
        c = self.config
        now = self.clock()
        snap = _Snapshot(self.next_round, self.window_start, now, flatten(self.params), work)
        if self.reducer.leader and self.on_transfer_plan is not None:
            self.on_transfer_plan(TransferPlan(
                site_id=c.site_id, round=snap.round, bytes=self.wire_bytes,
                window_start_unix_ms=round(snap.window_start * 1000),
                deadline_unix_ms=c.round_epoch_ms + (snap.round + 1) * c.round_ms,   # exact: integer ms
                workers=self.reducer.world_size))
        ex = self._inflight = _Exchange(snap)
        threading.Thread(target=self._exchange, args=(ex,), name="crosssite-exchange", daemon=True).start()

    def poll(self) -> RoundRecord | None:
        """Merge the round in flight if its exchange has landed and return its record (None otherwise).
        Re-raises an exchange's failure (the round then merges nothing: the local weights stay). Loop
        thread, between launches: the merge copies weights across, it runs no kernel."""
        ex = self._inflight
        if ex is None or not ex.done.is_set():
            return None
        self._inflight = None
        now = self.clock()
        self.next_round, self.window_start = self.config.work_deadline(now)
        if ex.error is not None:
            raise ex.error
        snap = ex.snap
        with torch.no_grad():
            if ex.healed:
                unflatten_into(self.global_flat, self.params)       # restart from the healed weights
            else:
                unflatten_into(merged(self.global_flat, flatten(self.params), snap.local_flat), self.params)
        t_end = self.clock()
        stats = ex.stats
        rec = RoundRecord(
            site_id=self.config.site_id, round=ex.round, step=ex.step, committed=ex.committed,
            participants=ex.participants, tokens=ex.site_tokens,
            round_tokens=stats.tokens if ex.committed else 0, steps=snap.work.steps,
            contributors=stats.contributors, fednova=ex.fednova, healed=ex.healed,
            bytes_sent=self.wire_bytes if self.reducer.leader else 0, wall_ms=(t_end - snap.taken_at) * 1000,
            idle_ms=0.0, work_ms=(snap.taken_at - self._last_snapshot_at) * 1000,
            quorum_ms=(ex.t_quorum - snap.taken_at) * 1000, wait_ms=(ex.t_done - ex.t_quorum) * 1000,
            committed_total=self.ledger.committed_total, loss=snap.work.loss, checksum=checksum(self.global_flat),
            dropped_own=ex.dropped_own, dropped_peers=ex.dropped_peers, refused=ex.refused)
        self._last_snapshot_at = snap.taken_at
        if self.on_round is not None:
            self.on_round(rec)
        return rec

    def run_round(self, local_work: Callable[[float], LocalWork]) -> RoundRecord:
        """One round for a caller without a loop of its own: local work until the next transfer
        window, then the exchange, waited for (the same protocol as begin/poll)."""
        work = local_work(self.window_start)
        left = self.window_start - self.clock()
        if left > 0:
            self.sleep(left)
        self.begin(work)
        while True:
            rec = self.poll()
            if rec is not None:
                return rec
            self._inflight.done.wait(0.05)

    # -- the exchange thread: quorum, statistics, payload, commit, outer step ----------------------
    def _exchange(self, ex: _Exchange) -> None:
        try:
            self._collectives(ex)
        except BaseException as exc:  # noqa: BLE001 - handed to the loop thread, which decides
            ex.error = exc
        finally:
            ex.t_done = self.clock()
            ex.done.set()

    def _collectives(self, ex: _Exchange) -> None:
        red, snap = self.reducer, ex.snap
        self._healed = False
        # round, window start, participants, step, errored, global ledger (float64: exact below 2**53)
        head = torch.zeros(7, dtype=torch.float64)
        if red.leader:
            self.manager.start_quorum()
            proposal = torch.tensor([snap.round, snap.window_start], dtype=torch.float64)
            self._allreduce(proposal, ReduceOp.MAX)
            head[:2] = proposal
            head[2] = self.manager.num_participants()
            head[3] = self.manager.current_step()
            head[4] = float(self.manager.errored() is not None)
            head[5], head[6] = self.ledger.committed_rounds, self.ledger.committed_total
        red.broadcast(head)
        if not red.leader:   # the leader may have healed: its workers take the global ledger too
            self.ledger.load_state_dict({"committed_rounds": int(head[5]), "committed_total": int(head[6])})
        if red.world_size > 1:   # a healed leader passes the global weights on to its workers
            red.broadcast(self.global_flat)
        healed = bool(red.broadcast(torch.tensor([float(self._healed)], dtype=torch.float64))[0]) \
            if red.world_size > 1 else self._healed
        ex.healed = healed
        ex.round, ex.participants, ex.step = int(head[0]), int(head[2]), int(head[3])
        ex.t_quorum = self.clock()
        # Work based on other weights than the healed global ones is no delta of them: it contributes
        # nothing, and a round already broken (a peer died during the quorum) is not worth sending.
        own_ok = contribution_ok(self.global_flat, snap.local_flat, self.config.max_delta_norm)
        if not own_ok:
            self.dropped_contributions += 1
        work = LocalWork(0, 0) if healed or head[4] or not own_ok else snap.work
        ex.dropped_own = not own_ok

        # Robust aggregation (issue 26 item 3): the statistics and the payload are gathered, not summed (a SUM
        # all-reduce of one slot per participant), so every site checks every site's own row and sums only the
        # rows that can be an honest site's; a peer's non-finite, out-of-bound or inconsistent row is dropped and
        # counted, and the others' round commits. Every site sees the same rows and decides the same.
        stats_t = red.reduce_stats(stats_tensor(work))
        ex.site_tokens = int(stats_t[0]) if red.leader else work.tokens   # the site's, not one worker's
        rows, kept, rank = None, [], None
        if red.leader:
            n, rank = max(1, ex.participants), self.manager.participating_rank()
            rows = self._allreduce(slotted(stats_t, rank, n), ReduceOp.SUM)
            row_ok = [stats_row_ok(rows[r]) for r in range(n)]     # None: an empty slot
            kept = [r for r in range(n) if row_ok[r]]
            ex.dropped_peers = row_ok.count(False)
            stats_t = rows[kept].sum(0) if kept else torch.zeros_like(stats_t)
        red.broadcast(stats_t)
        errored = red.leader and self.manager.errored() is not None
        try:
            stats = RoundStats.from_tensor(stats_t)
        except ValueError:   # a corrupted reduction (a peer died mid-collective): the round cannot commit
            stats, errored, stats_t = RoundStats(0, 0, 0, 0, 0, 0), True, torch.zeros_like(stats_t)
        fednova = use_fednova(stats, self.config.policy)

        payload = red.reduce_payload(weighted_delta(self.global_flat, snap.local_flat, work, fednova))
        # the verdict, and the statistics of the rows the round kept: a site's workers settle the same ledger
        verdict = torch.zeros(1 + N_STATS, dtype=torch.float64)
        verdict[1:] = stats_t
        if red.leader:
            wire = self.wan_feedback.compress(payload)
            gathered = self._allreduce(slotted(wire, rank, rows.shape[0]), ReduceOp.SUM)
            bad = [r for r in kept if not payload_row_ok(gathered[r], rows[r], self.config.max_delta_norm)]
            if bad:
                kept = [r for r in kept if r not in bad]
                ex.dropped_peers += len(bad)
                verdict[1:] = rows[kept].sum(0) if kept else 0.0
                stats = RoundStats.from_tensor(verdict[1:])
            self.dropped_peer_rows += ex.dropped_peers
            summed = gathered[kept].to(torch.float32).sum(0) if kept else torch.zeros_like(payload)
            committed = self.manager.should_commit() and not errored
            if committed:
                g = outer_gradient(summed, stats, fednova)
                if g is not None and not gradient_ok(g, self.config.max_delta_norm, fednova):
                    committed, ex.refused = False, "sum beyond what its contributions allow"
                elif g is not None:
                    before = (self.global_flat.clone(), self.outer.heal_state(copy=True))
                    self.outer.step(g)
                    if not (torch.isfinite(self.global_flat).all()
                            and float(self.global_flat.double().norm()) <= self.config.max_weight_norm):
                        self.global_flat.copy_(before[0])          # the global model never leaves its bound
                        self.outer.load_heal_state(before[1])
                        committed, ex.refused = False, "the global weights would leave their bound"
                if ex.refused:
                    self.refused_rounds += 1
            if not committed:
                self.wan_feedback.rollback()
            verdict[0] = float(committed)
        red.broadcast(verdict)
        committed = bool(verdict[0])
        if not red.leader:
            stats = RoundStats.from_tensor(verdict[1:])
        if red.world_size > 1:
            red.broadcast(self.global_flat)
        if not committed:
            red.rollback()
        self.ledger.settle(ex.site_tokens, stats.tokens, committed)
        ex.stats, ex.fednova, ex.committed = stats, fednova, committed

    def renew(self, config: TierConfig) -> None:
        """The broker renewed this site's tier pass (the same tier otherwise): new connections carry it."""
        self.config = config
        ident = config.identity
        if self.egress is not None and ident is not None and ident.tier_pass != self.egress.identity.tier_pass:
            self.egress.renew(ident)

    def close(self) -> None:
        from agent.crosssite import gate

        if self.manager is not None:
            self.manager.shutdown(wait=False)
            self.manager = None
        self._store = None
        if self.gate is not None:
            self.gate.stop()
            self.egress.close()
            gate.unregister(self.advertised, self.egress)
            self.gate = self.egress = None


def lease_stream_callbacks(client) -> tuple[Callable[[TransferPlan], None], Callable[[RoundRecord], None]]:
    """(on_transfer_plan, on_round) that forward to the agent's lease client, i.e. upstream to the xApp.

    RoundReport.wait_ms carries all the time the round spent blocked on other sites (quorum + the
    end-of-round barrier); the split stays in the RoundRecord.
    """
    def plan(p: TransferPlan) -> None:
        client.send_transfer_plan(p.round, p.bytes, p.deadline_unix_ms, p.workers)

    def done(r: RoundRecord) -> None:
        client.send_round_report(r.round, r.committed, r.participants, r.tokens, r.bytes_sent,
                                 r.wall_ms, r.quorum_ms + r.wait_ms)
    return plan, done
