"""The supervisor: the agent's network side, and the kernel bound on its training worker.

`weaver-agent run` is this process. It holds the lease stream to the broker (agent.lease_client, with
the site's credential), the AgentInspect service and /metrics, and it never touches the GPU nor runs
job code: the job runs in the worker (agent.worker), a child it starts inside a cgroup of its own
(agent.confine) before the worker executes anything, so every thread, loader process and child of the
job is inside it too. The worker's loop still plans its work inside each lease (agent.enforcer); the
kernel is the bound:

    lease granted          -> the cgroup's CPU quota := the lease's cores, thawed, then the lease is passed on
    revoked / disconnected -> frozen (the kernel says so), then the event is passed on
    the lease's hard end   -> frozen, unless a newer lease arrived
    nothing held           -> frozen

Because a frozen tree executes nothing, the supervisor itself acknowledges a revocation or an expiry
to the broker (LeaseReleased) once the freeze is complete, and drops the worker's later release of the
same lease. `LeaseGate` is that rule as a state machine (no I/O); `Supervisor` wires it to the cgroup,
the broker and the worker. On a GPU the lease's SMs are the worker's green context (agent.partition);
its cgroup then holds the worker's host CPU to `confine.worker_cores`, and frozen is still frozen.

Without a writable cgroup the agent refuses to train, unless `--cooperative` says the operator accepts
the worker's good manners as the only bound (reported in status and in the registration).
"""
from __future__ import annotations

import contextlib
import ctypes
import json
import logging
import math
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass, replace

from agent import worker_link as wl
from agent.config import LOOPBACK
from agent.confine import (
    ConfinementError,
    WorkerCgroup,
    detect,
    online_cpus,
    parse_cpu_list,
    sweep_stale,
)
from agent.enforcer import LeaseTerms
from agent.lease_client import (
    Connected,
    CrossSiteChanged,
    Disconnected,
    LeaseClient,
    LeaseGranted,
    LeaseRevoked,
)
from agent.monitors import DeviceFacts
from schemas.proto.weaver.v1 import lease_pb2

log = logging.getLogger("weaver.agent.supervisor")

HELLO_TIMEOUT_S = 600.0    # building a large job (tokenizer, weights from disk) may take minutes
STOP_GRACE_S = 20.0        # a stopping worker's final checkpoint
PUMP_WAIT_S = 0.05         # longest wait for a lease event between hard-end checks
COOPERATIVE = "cooperative"
OUTBOX_COALESCE = 64       # messages queued for a (frozen) worker before older leases are dropped
PR_SET_PDEATHSIG = 1       # prctl(2)


# --- the rule ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Run:
    cores: float            # the worker tree's CPU quota


@dataclass(frozen=True)
class Freeze:
    lease_id: str           # the lease that ends ("" = none was held)
    reason: str


class LeaseGate:
    """Which state the worker's cgroup must be in, from the lease stream (sans-IO).

    `cores_for(terms)`: the CPU a lease allows the worker tree. A CPU stand-in's leased cores are the
    lease's share of the whole stand-in (duty = sm_count / gpu_sms, as the broker grants it); on a GPU the
    worker's host cores.

    Quota writes are spaced `spacing_s` apart (one metered window). The kernel answers every write of a
    CFS quota by refilling the period's quota and forgiving each CPU's overrun (`tg_set_cfs_bandwidth`):
    measured here, rewriting the same bound every 20 ms let a busy tree run 16 ms a 100 ms window beyond
    it, every 100 ms 6 ms, never 4 ms. So a larger quota waits for the spacing (the tree runs on at the
    smaller one), and a smaller one that comes too soon freezes the tree until it may be written: no
    window sees two writes, and none runs above the lease it holds."""

    def __init__(self, device: DeviceFacts, worker_cores: float, spacing_s: float = 0.1) -> None:
        self.device = device
        self.worker_cores = worker_cores
        self.spacing_s = spacing_s
        self.held: LeaseTerms | None = None
        self.applied: float | None = None       # the quota last written (cores)
        self.applied_at = -math.inf
        self.pending: float | None = None       # the quota the held lease allows, written at `pending_at`

    @property
    def pending_at(self) -> float:
        return self.applied_at + self.spacing_s

    def cores_for(self, t: LeaseTerms) -> float:
        if self.device.kind == "cpu":
            whole = self.device.cores if 0 < self.device.cores < self.device.sm_count else self.device.sm_count
            return t.duty * whole
        return self.worker_cores

    def grant(self, t: LeaseTerms, now: float) -> Run | Freeze:
        if t.sm_count == 0 or t.expires_at <= now or self.cores_for(t) <= 0:
            return self.end(now, t.lease_id, "empty" if t.sm_count == 0 else "expired")
        self.held = t
        want = self.cores_for(t)
        if want == self.applied or now >= self.pending_at:
            return self._write(want, now)
        self.pending = want
        if self.applied is not None and self.applied < want:
            return Run(self.applied)            # the smaller quota holds until the larger may be written
        return Freeze("", "spacing")            # nothing above the new lease, until its quota is written

    def _write(self, cores: float, now: float) -> Run:
        if cores != self.applied:
            self.applied, self.applied_at = cores, now
        self.pending = None
        return Run(cores)

    def end(self, now: float, lease_id: str = "", reason: str = "revoked") -> Freeze | None:
        """A revocation of `lease_id` ("" = all) or a lost stream. None: it names a lease already ended."""
        held = self.held
        if lease_id and held is not None and lease_id != held.lease_id:
            return None
        self.held, self.pending = None, None
        return Freeze(held.lease_id if held else "", reason)

    def expired(self, now: float) -> Freeze | Run | None:
        """What is due at `now`: the hard end of the held lease, or its quota held back by the spacing."""
        if self.held is not None and now >= self.held.expires_at:
            return self.end(now, "", "expired")
        if self.pending is not None and now >= self.pending_at:
            return self._write(self.pending, now)
        return None

    def next_deadline(self) -> float | None:
        if self.held is None:
            return None
        return min(self.held.expires_at, self.pending_at) if self.pending is not None else self.held.expires_at


class WorkerRefused(RuntimeError):
    """The worker refused its job or config before it started (it printed why)."""


@dataclass(frozen=True)
class CheckpointRef:
    path: str
    step: int


# --- the process ---------------------------------------------------------------------------------
@dataclass
class _Snapshot:
    status: lease_pb2.AgentStatus
    leases: list[lease_pb2.LeaseRecord]
    metrics: str = ""
    at: float = 0.0


class Supervisor:
    def __init__(self, cfg, *, mode: str | None = None, config_path: str | None = None,
                 cooperative: bool = False, python: str = sys.executable) -> None:
        self.cfg = cfg
        self.mode_flag, self.config_path = mode, config_path
        self.python = python
        self.stop_event = threading.Event()
        self.cgroup: WorkerCgroup | None = None
        self.confinement = COOPERATIVE
        self.confinement_why = ""
        try:
            host = detect()
            sweep_stale(host)
            self.cgroup = WorkerCgroup(host)
            self.confinement = f"cgroup-v{host.version}"
            self._host = host
        except (ConfinementError, OSError) as exc:
            if not cooperative:
                raise ConfinementError(f"no kernel confinement for the training worker: {exc}; "
                                       "pass --cooperative to train with the worker's own accounting as the only bound") from None
            self.confinement_why = str(exc)
        self.worker: subprocess.Popen | None = None
        self.client: LeaseClient | None = None
        self.gate: LeaseGate | None = None
        self.device: DeviceFacts | None = None
        self.hello: dict = {}
        self.snapshot: _Snapshot | None = None
        self.frozen_since: float | None = None
        self._freezer = threading.Lock()      # the freezer's and the quota's state
        from prometheus_client import CollectorRegistry

        from agent.metrics import yield_histogram
        self.registry = CollectorRegistry()
        self.yields = yield_histogram(self.registry, "the worker frozen (the kernel's word)")
        self.released_seq = -1                      # the supervisor released every lease up to this seq
        self._seq_of: dict[str, int] = {}           # lease id -> seq, of the leases granted lately
        self.worker_exit: str = ""
        self._sock: socket.socket | None = None
        self._outbox: deque = deque()            # to the worker, sent by its own thread (_send_to_worker)
        self._outbox_cv = threading.Condition()
        self._lock = threading.Lock()
        self._ckpt: dict[int, tuple[threading.Event, list]] = {}
        self._ckpt_id = 0
        self._cpu0 = self._reported_cpu = time.process_time()

    def _bound_self(self, host) -> None:
        """The supervisor's own CPU is bounded too (a sibling cgroup with `confine.supervisor_cores`), so its
        work (heartbeats, the lease stream, inspection, metrics) is measured and capped apart from the lease."""
        self._own_cg = WorkerCgroup(host, name="supervisor").create()
        self._own_cg.set_cores(self.cfg.confine.supervisor_cores)
        self._home = {c: host.base(c) / "cgroup.procs" for c in self._own_cg.dirs}
        self._own_cg.add(os.getpid())

    def _unbound_self(self) -> None:
        """Back to the cgroups it started in, so its own can be removed."""
        if getattr(self, "_own_cg", None) is None:
            return
        for f in dict.fromkeys(self._home.values()):
            with contextlib.suppress(OSError):
                f.write_text(str(os.getpid()))
        self._own_cg = None

    # --- start ---------------------------------------------------------------------------------
    def _worker_cpus(self) -> set[int]:
        c = self.cfg.confine
        cpus = parse_cpu_list(c.worker_cpus) if c.worker_cpus else online_cpus()
        return cpus - (parse_cpu_list(c.ran_cores) if c.ran_cores else set())

    def start(self) -> dict:
        """Start the worker and wait for its hello (its job built); then freeze it and connect."""
        ours, theirs = socket.socketpair()
        self._sock = ours
        cfg_json = json.dumps(replace(self.cfg, lease=replace(self.cfg.lease, token="")).to_dict())
        argv = [self.python, "-m", "agent.worker", "--link-fd", str(theirs.fileno()), "--config-json", cfg_json]
        if self.mode_flag:
            argv += ["--mode", self.mode_flag]
        if self.config_path:
            argv += ["--config", self.config_path]
        if self.cgroup is not None:
            argv.append("--kernel-bound")
        procs = []
        if self.cgroup is not None:
            c = self.cfg.confine
            self.cgroup.create(cpus=self._worker_cpus(), memory_limit_bytes=c.memory_mb << 20)
            self.cgroup.set_cores(self._startup_cores())
            procs = [str(p) for p in self.cgroup.procs_files()]
            if c.supervisor_cores > 0:
                self._bound_self(self._host)
        env = {k: v for k, v in os.environ.items() if k != "WEAVER_AGENT_TOKEN"}   # the credential stays here

        def enter_cgroup():   # in the child, before exec: the worker runs nothing outside its cgroup
            # and the kernel kills it when the supervisor dies (SIGKILL included): no hard-end timer, no
            # worker; a lease's SMs are never used by an orphan past its end
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
            for f in procs:
                with open(f, "w") as fh:
                    fh.write(str(os.getpid()))
        libc = ctypes.CDLL(None, use_errno=True)
        self.worker = subprocess.Popen(argv, pass_fds=(theirs.fileno(),), env=env, preexec_fn=enter_cgroup)
        theirs.close()
        dec = wl.FrameDecoder(wl.TO_SUPERVISOR)
        ours.settimeout(HELLO_TIMEOUT_S)
        pending: list[dict] = []
        while not pending:
            try:
                data = ours.recv(1 << 16)
            except TimeoutError:
                raise RuntimeError(f"the worker said nothing in {HELLO_TIMEOUT_S:.0f} s") from None
            if not data:
                rc = self.worker.wait()
                if rc == 2:    # a bad job or config: the worker said why, in one line
                    raise WorkerRefused()
                raise RuntimeError(f"the worker exited ({rc}) before its job was built")
            pending = dec.feed(data)
        ours.settimeout(None)
        hello = pending.pop(0)
        if hello["t"] == "refused":
            self.worker.wait()
            raise WorkerRefused(str(hello.get("why", "")))
        if hello["t"] != "hello":
            raise wl.LinkError(f"the worker's first message was {hello['t']!r}, not hello")
        self.hello = hello
        self.device = DeviceFacts(**hello["device"])
        self.gate = LeaseGate(self.device, self.cfg.confine.worker_cores or float(len(self._worker_cpus())),
                              spacing_s=self.cfg.confine.quota_spacing_ms / 1e3)
        self._freeze("", "")                    # no lease yet
        self.client = LeaseClient(self.cfg.lease, self.device, mode=hello["mode"])
        self.client.job, self.client.mode_evidence = hello["job"], hello["mode_evidence"]
        self.client.confinement = self.confinement
        for m in pending:
            self._from_worker(m)
        threading.Thread(target=self._read_worker, args=(dec,), name="worker-link", daemon=True).start()
        threading.Thread(target=self._send_to_worker, name="to-worker", daemon=True).start()
        self.client.start()
        return hello

    def _startup_cores(self) -> float:
        """The job is built before any lease (model, data): at most the stand-in's whole GPU, or the
        worker's host cores on a GPU site. Nothing is connected yet, so nothing is leased either."""
        c = self.cfg.confine
        if c.startup_cores:
            return c.startup_cores
        return self.cfg.cores if self.cfg.cores else float(len(self._worker_cpus()))

    # --- the kernel side ---------------------------------------------------------------------------
    def _freeze(self, lease_id: str, reason: str) -> float:
        took = 0.0
        with self._freezer:
            if self.cgroup is not None and not self.cgroup.frozen:
                took = self.cgroup.freeze()
        if self.frozen_since is None:
            self.frozen_since = time.monotonic()
        return took

    def _run(self, cores: float) -> None:
        with self._freezer:
            if self.cgroup is not None:
                self.cgroup.set_cores(cores)
                if self.cgroup.frozen:
                    self.cgroup.thaw()
        self.frozen_since = None

    def _apply(self, action, at: float) -> None:
        if isinstance(action, Run):
            self._run(action.cores)
        elif isinstance(action, Freeze):
            took = self._freeze(action.lease_id, action.reason)
            if action.lease_id and action.reason in ("revoked", "expired", "disconnected"):
                since = at if action.reason != "expired" else time.monotonic() - took
                self.yields.labels(self.cfg.lease.site_id, action.reason).observe(max(0.0, time.monotonic() - since))
            if action.lease_id and action.reason in ("revoked", "expired", "shutdown") and self.client.connected:
                # frozen: nothing runs under it (nor any earlier lease) any more, which is what a release says
                self.released_seq = max(self.released_seq, self._seq_of.get(action.lease_id, -1))
                overrun_ms = took * 1e3 if action.reason == "expired" else max(0.0, time.monotonic() - at) * 1e3
                self.client.send_release(action.lease_id, action.reason, overrun_ms, 0)

    def _pump(self) -> None:
        """Lease events -> the kernel first, then the worker; the hard-end timer in between."""
        while not self.stop_event.is_set():
            deadline = self.gate.next_deadline()     # the hard-end timer: woken at it, or at least every 50 ms
            wait = PUMP_WAIT_S if deadline is None else max(0.0, min(PUMP_WAIT_S, deadline - time.monotonic()))
            events = self.client.poll(wait)
            now = time.monotonic()
            with self._lock:
                exp = self.gate.expired(now)
                if exp is not None:
                    self._apply(exp, now)
                for ev in events:
                    self._on_event(ev)
            if self.worker is not None and self.worker.poll() is not None:
                self.worker_exit = f"worker exited with {self.worker.returncode}"
                self.stop_event.set()

    def _on_event(self, ev) -> None:
        now = time.monotonic()
        if isinstance(ev, LeaseGranted):
            t = ev.terms
            self._seq_of[t.lease_id] = t.seq
            if len(self._seq_of) > 256:
                del self._seq_of[next(iter(self._seq_of))]
            self._apply(self.gate.grant(t, now), now)
            self._to_worker({"t": "lease", "terms": wl.terms_to_json(t)})
        elif isinstance(ev, LeaseRevoked):
            action = self.gate.end(now, ev.lease_id, "revoked")
            if action is not None:
                self._apply(action, ev.at)
            self._to_worker({"t": "revoke", "at": ev.at, "lease_id": ev.lease_id, "reason": ev.reason})
        elif isinstance(ev, Disconnected):
            self._apply(self.gate.end(now, "", "disconnected"), ev.at)
            # the session's leases end with it (frozen): the next session's broker issued none of them, and a
            # restarted xApp's takes no release of its predecessor's (it waits out their hard ends itself)
            self._seq_of.clear()
            self.released_seq = -1
            self._to_worker({"t": "disconnected", "at": ev.at, "reason": ev.reason})
        elif isinstance(ev, Connected):
            self._to_worker({"t": "connected", "at": ev.at, "site_id": ev.site_id, "epoch": ev.epoch,
                             "heartbeat_ms": ev.heartbeat_ms,
                             "cross_site": wl.pb(ev.cross_site) if ev.cross_site is not None else ""})
        elif isinstance(ev, CrossSiteChanged):
            self._to_worker({"t": "cross_site", "at": ev.at, "pb": wl.pb(ev.config)})

    # --- the worker side -----------------------------------------------------------------------------
    def _to_worker(self, msg: dict) -> None:
        """Queue `msg` for the worker. A frozen worker reads nothing, so the lease loop never writes to its
        socket itself (a full socket would stall the hard-end timer); while it is frozen, only the newest
        lease waits for it (an older one is superseded by it anyway)."""
        with self._outbox_cv:
            if msg["t"] == "lease" and len(self._outbox) >= OUTBOX_COALESCE:
                self._outbox = deque(m for m in self._outbox if m["t"] != "lease")
            self._outbox.append(msg)
            self._outbox_cv.notify()

    def _send_to_worker(self) -> None:
        while True:
            with self._outbox_cv:
                while not self._outbox:
                    self._outbox_cv.wait()
                msg = self._outbox.popleft()
            try:
                self._sock.sendall(wl.encode(msg))
            except OSError:
                return   # it is gone: _pump sees the exit

    def _read_worker(self, dec: wl.FrameDecoder) -> None:
        try:
            wl.read_frames(self._sock, dec, self._from_worker)
        except (OSError, wl.LinkError) as exc:
            if not self.stop_event.is_set():
                log.error("worker link broken: %s; stopping the worker", exc)
                if self.cgroup is not None:
                    self.cgroup.kill_all()
        self.stop_event.set()

    def _from_worker(self, m: dict) -> None:
        t, c = m["t"], self.client
        if t == "usage":
            report = wl.unpb(lease_pb2.UsageReport, m["pb"])
            cpu = time.process_time()       # the supervisor's own CPU since the last report, beside it
            report.supervisor_cpu_ms, self._reported_cpu = (cpu - self._reported_cpu) * 1e3, cpu
            c.send_usage(report)
        elif t == "release":
            seq = self._seq_of.get(str(m["lease_id"]))
            if seq is None or seq <= self.released_seq:
                # a lease of a session that has ended (the worker was frozen when it did), or one the supervisor
                # already released (or a later one), frozen
                return
            c.send_release(str(m["lease_id"]), str(m["reason"]), float(m["overrun_ms"]), int(m["held_sm_count"]))
        elif t == "transfer":
            c.send_transfer_plan(int(m["round"]), int(m["bytes"]), int(m["deadline_unix_ms"]), int(m["workers"]))
        elif t == "round":
            c.send_round_report(int(m["round"]), bool(m["committed"]), int(m["participants"]), int(m["tokens"]),
                                int(m["bytes_sent"]), float(m["wall_ms"]), float(m["wait_ms"]))
        elif t == "mode":
            c.mode = str(m["mode"])
        elif t == "snapshot":
            leases = list(wl.unpb(lease_pb2.LeaseHistory, m["leases"]).leases)
            metrics = m.get("metrics") or (self.snapshot.metrics if self.snapshot else "")
            self.snapshot = _Snapshot(wl.unpb(lease_pb2.AgentStatus, m["status"]), leases, metrics, time.monotonic())
        elif t == "checkpoint_done":
            with self._lock:
                slot = self._ckpt.pop(int(m["id"]), None)
            if slot is not None:
                slot[1].append(m)
                slot[0].set()

    # --- what AgentInspect asks (agent.inspect_service) -----------------------------------------------
    def status(self) -> lease_pb2.AgentStatus:
        st = lease_pb2.AgentStatus()
        if self.snapshot is not None:
            st.CopyFrom(self.snapshot.status)
        else:   # nothing trained or validated yet (not 0: a loss of 0 would read as a perfect model)
            st.loss = st.val_loss = math.nan
            st.site_id, st.job, st.mode = self.cfg.lease.site_id, self.hello.get("job", ""), self.hello.get("mode", "")
        st.connected = bool(self.client and self.client.connected)
        st.agent_id = self.client.agent_id if self.client else ""
        st.confinement = self.confinement
        st.worker_frozen = self.frozen_since is not None
        st.supervisor_cpu_s = time.process_time() - self._cpu0
        if self.cgroup is not None:
            try:
                st.worker_cpu_s = self.cgroup.usage_ns() / 1e9
            except OSError:
                pass
        # the lease is the one the kernel lets the worker act on (the worker's snapshot may be older)
        held = self.gate.held if self.gate is not None else None
        st.ClearField("lease")
        st.lease_remaining_ms = 0.0
        if held is not None:
            st.lease.CopyFrom(lease_pb2.Lease(
                lease_id=held.lease_id, site_id=self.cfg.lease.site_id, sm_count=held.sm_count,
                period_ms=round(held.period_s * 1e3), valid_for_ms=round(held.valid_for_s * 1e3),
                epoch=held.epoch, seq=held.seq, duty=held.duty, reason=held.reason))
            st.lease_remaining_ms = max(0.0, (held.expires_at - time.monotonic()) * 1e3)
        return st

    def leases(self, limit: int = 0) -> list[lease_pb2.LeaseRecord]:
        recs = list(self.snapshot.leases) if self.snapshot else []
        return recs[-limit:] if limit else recs

    def request_checkpoint(self, timeout: float = 30.0):
        done, box = threading.Event(), []
        with self._lock:
            self._ckpt_id += 1
            self._ckpt[self._ckpt_id] = (done, box)
            cid = self._ckpt_id
        self._to_worker({"t": "checkpoint", "id": cid, "timeout": timeout})
        if not done.wait(timeout):
            with self._lock:
                self._ckpt.pop(cid, None)
            frozen = " (the worker is frozen: no lease; it is taken at the next one)" if self.frozen_since else ""
            raise TimeoutError(f"the training worker did not take the checkpoint in time{frozen}")
        m = box[0]
        if "error" in m:
            raise TimeoutError(str(m["error"]))
        return CheckpointRef(m["path"], int(m["step"]))

    def metrics_text(self) -> str:
        """The worker's exposition (as of its last snapshot) and the supervisor's own families."""
        from prometheus_client import CollectorRegistry, generate_latest
        from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily
        site = self.cfg.lease.site_id
        fams = [CounterMetricFamily("weaver_agent_supervisor_cpu_seconds", "CPU of the supervisor (lease stream, "
                                    "inspection, metrics): outside the worker's cgroup", labels=["site"]),
                GaugeMetricFamily("weaver_agent_worker_frozen", "1 while the worker's cgroup is frozen (no lease)",
                                  labels=["site"])]
        fams[0].add_metric([site], time.process_time() - self._cpu0)
        fams[1].add_metric([site], 1.0 if self.frozen_since is not None else 0.0)
        if self.cgroup is not None:
            with contextlib.suppress(OSError):
                w = CounterMetricFamily("weaver_agent_worker_cpu_seconds", "CPU the worker's cgroup executed "
                                        "(every thread and child)", labels=["site"])
                w.add_metric([site], self.cgroup.usage_ns() / 1e9)
                fams.append(w)

        class _Own:
            def collect(self):
                return fams
        reg = CollectorRegistry()
        reg.register(_Own())
        reg.register(self.registry)      # the yield histogram
        worker = self.snapshot.metrics if self.snapshot and self.snapshot.metrics else ""
        return worker + generate_latest(reg).decode()

    # --- stop ----------------------------------------------------------------------------------------
    def run(self, max_seconds: float | None = None) -> None:
        if max_seconds is not None:
            timer = threading.Timer(max_seconds, self.stop_event.set)
            timer.daemon = True
            timer.start()
        try:
            self._pump()
        finally:
            self.shutdown()

    def stop(self) -> None:
        self.stop_event.set()

    def shutdown(self) -> None:
        """Release what is held (frozen first), let the worker write its last checkpoint at the shutdown
        quota, then remove the cgroup (killing whatever is left) and close the stream."""
        self.stop_event.set()
        with self._lock:
            if self.gate is not None and self.gate.held is not None and self.client is not None:
                self._apply(self.gate.end(time.monotonic(), "", "shutdown"), time.monotonic())
        if self.worker is not None and self.worker.poll() is None:
            self._to_worker({"t": "stop"})
            self._run(self.cfg.confine.shutdown_cores or max(0.05, 0.1 * (self.cfg.cores or 1.0)))
            try:
                self.worker.wait(STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                log.warning("the worker did not stop in %.0f s: killed", STOP_GRACE_S)
                self.worker.kill()
                self.worker.wait()
        self._unbound_self()
        if self.cgroup is not None:
            self.cgroup.remove()      # the whole subtree: worker and supervisor
        if self.client is not None:
            self.client.stop()


def serve_supervisor_metrics(sup: Supervisor, addr: str = "127.0.0.1:0"):
    """`/metrics` of the worker (its last snapshot) and of the supervisor, on localhost."""
    from wsgiref.simple_server import make_server

    from prometheus_client.exposition import CONTENT_TYPE_LATEST

    from agent.metrics import _Quiet, _Server
    host, _, port = addr.rpartition(":")
    if host not in LOOPBACK:   # as AgentInspect: the site host's own scraper
        raise ValueError(f"the agent's /metrics listens on localhost only, got {addr!r}")

    def app(environ, start_response):
        if environ.get("PATH_INFO") != "/metrics":
            start_response("404 Not Found", [("Content-Type", "text/plain; charset=utf-8")])
            return [b"only /metrics is served here\n"]
        start_response("200 OK", [("Content-Type", CONTENT_TYPE_LATEST)])
        return [sup.metrics_text().encode()]

    server = make_server(host, int(port), app, server_class=_Server, handler_class=_Quiet)
    threading.Thread(target=server.serve_forever, name="metrics", daemon=True).start()
    return server, f"{host}:{server.server_address[1]}"
