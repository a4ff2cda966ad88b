"""The site agent: one process per DU GPU (or CPU-only site) that holds leases and trains inside them.

Threads: the lease client owns the gRPC stream; the inspection server answers the CLI; everything
else happens on the caller's thread in `run()`, one loop that reads top to bottom:

    drain lease events -> enforcer (grant / revoke / disconnect = revoke all)
    leased device:  ask the enforcer -> micro-batch | optimizer step | idle until the next deadline or event
    fallback cores: micro-batches back to back, no lease (modes cpu / cpu_preferred)
    closed windows -> UsageReport to the broker, lease history, mode controller
    maybe validate / checkpoint / switch mode

Validation runs as leased work too (forward-only chunks sized like micro-batches), and so does the
warm-up (the first launch of the first lease), so nothing but host-side bookkeeping and checkpoint
writes happens outside a lease.
"""
from __future__ import annotations

import contextlib
import gc
import logging
import math
import threading
import time
from collections import deque
from dataclasses import dataclass, replace

import torch

from agent.checkpoint import CheckpointInfo, CheckpointStore
from agent.config import AgentConfig
from agent.enforcer import (
    CPU_TIME,
    EXPIRED,
    PERIOD,
    REPLACED,
    REVOKED,
    WALL,
    BudgetEnforcer,
    Idle,
    Launch,
    LeaseTerms,
    StepNow,
    WindowReport,
    window_waterfall,
)
from agent.job import JobContext, job_slos, load_job
from agent.lease_client import (
    Connected,
    CrossSiteChanged,
    Disconnected,
    LeaseClient,
    LeaseGranted,
    LeaseRevoked,
)
from agent.metrics import AgentMetrics
from agent.modes import CPU, GPU, ModeController, ModeSwitch
from agent.monitors import DeviceFacts, detect_device, used_units_ms
from agent.partition import GreenContextPool
from agent.trainer import Trainer
from schemas.proto.weaver.v1 import lease_pb2

log = logging.getLogger("weaver.agent")

REFUSED = "refused"       # a lease the agent cannot run inside its SMs (LeaseReleased.reason)
IDLE_TICK_S = 0.05        # longest idle wait: bounds how stale the status and the mode loop get
# Longest idle wait while host work runs on another thread (a cross-site exchange): its CPU is charged to
# the window each process-CPU reading falls in, pro rata over the time since the last one; read every 50 ms,
# an exchange that landed just after a period boundary had its CPU charged mostly to the window before,
# and the next window's full budget ran on top of it (115 SMs of an 80-SM lease in one metered period).
HOST_WORK_TICK_S = 0.005
# On a CPU-only site the agent's own host work is CPU the platform meters as the site's GPU, so it is
# reserved inside the lease first (`reserve_host`). A checkpoint's CPU is learned (peak tracker, from this
# first guess); an exchange reserves the whole budget while in flight (one or two periods a round): its CPU
# varied from 7 to ~20 ms between rounds (quorum, gloo, torchft's checkpoint server; a joiner heals in it),
# beyond any estimate from the rounds before it.
CHECKPOINT_CPU_GUESS_S = 0.01
HOST_WORK_DECAY = 0.7
MODE_EVERY_S = 1.0


@dataclass
class LeaseRecord:
    lease_id: str
    sm_count: int
    received_unix_ms: int
    granted_ms: float = 0.0
    used_ms: float = 0.0
    overrun_ms: float = 0.0
    end: str = "active"

    def to_proto(self) -> lease_pb2.LeaseRecord:
        return lease_pb2.LeaseRecord(lease_id=self.lease_id, sm_count=self.sm_count, granted_ms=self.granted_ms,
                                     used_ms=self.used_ms, overrun_ms=self.overrun_ms,
                                     received_unix_ms=self.received_unix_ms, end=self.end)


class SiteAgent:
    def __init__(self, config: AgentConfig, *, device: DeviceFacts | None = None, trainer: Trainer | None = None,
                 clock=time.monotonic, mode_evidence: str = "", client_factory=LeaseClient):
        self.config = config
        self.clock = clock
        self.device = device or detect_device(config.device, config.cores)
        # The job is built (and checked) before anything connects: a bad job registers nothing.
        job = trainer.job if trainer is not None else load_job(config.job, JobContext(config.train))
        self.modes = ModeController(config.modes, now=clock(), slos=job_slos(job).merged(config.job.slos))
        self.mode_evidence = mode_evidence     # why it started in its mode (agent.modeid), shown and registered
        # Training state lives where training runs: the GPU only in the leased-device modes.
        self.trainer = trainer or Trainer(config.train, device=self._training_device(), job=job)
        # a CPU stand-in is metered by its CPU time: the enforcer charges that, not the wall time a
        # preempted launch takes (the lease's budget is the process's CPU time; see _charges_host)
        self.enforcer = BudgetEnforcer(config.enforcer, meter=CPU_TIME if self.device.kind == "cpu" else WALL)
        # On CUDA, leased work runs only in a green context of at most the lease (see partition.py).
        self.partitions = GreenContextPool(self.device.sm_count, self.device.granularity,
                                           enabled=self.device.kind == "cuda" and self.device.green_contexts)
        self.store = CheckpointStore(config.checkpoint_dir, config.train.keep_last)
        # the lease stream: gRPC to the broker, or in a confined worker the link to its supervisor
        self.client = client_factory(config.lease, self.device, mode=self.modes.mode)
        self.client.job, self.client.mode_evidence = config.job.name, mode_evidence
        self.mode_reason = "" if self.modes.mode == config.modes.mode else "leased device unusable"
        self.history: deque[LeaseRecord] = deque(maxlen=256)
        self._records: dict[str, LeaseRecord] = {}   # the adopted leases in `history`, by id
        self.last_checkpoint: CheckpointInfo | None = None
        self.stop_event = threading.Event()
        self.window_reports: deque[WindowReport] = deque(maxlen=1024)
        self.yield_latencies_ms: deque[float] = deque(maxlen=256)
        self.work_log: deque[tuple[float, float, str]] = deque(maxlen=4096)   # (start, end, kind) of leased work
        self.refused: dict[str, int] = {}      # leases refused, by reason
        # histograms for /metrics (agent.metrics); a confined worker's lease ends are its supervisor's to time
        self.metrics = AgentMetrics(config.lease.site_id, yields=not config.enforcer.kernel_bound)
        self._busy_until = -math.inf           # agent clock when the last leased work ended
        self._held: LeaseTerms | None = None   # the newest lease adopted and not yet released
        self._warmed = False                   # the throw-away warm-up micro-batch has run (_warm_up)
        self._lock = threading.Lock()
        self._ckpt_requests: list[tuple[threading.Event, list]] = []
        self._threads = 0
        self._tokens_at: deque[tuple[float, int]] = deque(maxlen=64)
        self._evaluating = 0        # held-out samples still to evaluate in the current validation
        self._eval_sample_s: float | None = None   # measured wall time of one validation sample (peak-tracked)
        self._eval_sum = 0.0
        self._next_eval_step = config.train.eval_every
        self._next_ckpt_step = config.train.checkpoint_every
        self._checkpoint_due = False
        self.cross_site: lease_pb2.CrossSiteConfig | None = None
        self.checkpoint_cpu_s = CHECKPOINT_CPU_GUESS_S   # learned CPU of one checkpoint write
        self._host_work: set[str] = set()   # host work about to run or running: "checkpoint", "exchange"
        self.stepped_tokens = 0         # tokens, steps and loss sum of applied optimizer steps
        self.stepped_steps = 0
        self.stepped_loss_sum = 0.0

    # --- public API (used by the inspection server and tests) ---------------------------------
    def status(self) -> lease_pb2.AgentStatus:
        now = self.clock()
        with self._lock:
            lease = self.enforcer.lease
            window = self.enforcer.window
            msg = lease_pb2.AgentStatus(
                site_id=self.config.lease.site_id, agent_id=self.client.agent_id, mode=self.modes.mode,
                mode_reason=self.mode_reason,
                device=self.device.kind if self.modes.device == GPU else "cpu",
                step=self.trainer.step, tokens=self.trainer.tokens_seen,
                loss=self.trainer.last_loss, val_loss=self.trainer.last_val_loss,
                last_checkpoint=str(self.last_checkpoint.path) if self.last_checkpoint else "",
                last_checkpoint_step=self.last_checkpoint.step if self.last_checkpoint else 0,
                connected=self.client.connected, broker=self.config.lease.broker,
                tokens_per_s=self._tokens_per_s(), job=self.config.job.name, mode_evidence=self.mode_evidence)
            if lease is not None:
                msg.lease.CopyFrom(lease_pb2.Lease(
                    lease_id=lease.lease_id, site_id=self.config.lease.site_id, sm_count=lease.sm_count,
                    period_ms=round(lease.period_s * 1e3), valid_for_ms=round(lease.valid_for_s * 1e3),
                    epoch=lease.epoch, seq=lease.seq, duty=lease.duty, reason=lease.reason))
                msg.lease_remaining_ms = max(0.0, (lease.expires_at - now) * 1e3)
                msg.period_ms = round(lease.period_s * 1e3)
                msg.budget_ms_in_period = lease.budget_s * 1e3
            if window is not None:
                msg.used_ms_in_period = window.busy_s * 1e3
        return msg

    def leases(self, limit: int = 0) -> list[lease_pb2.LeaseRecord]:
        with self._lock:
            recs = list(self.history)
        recs = recs[-limit:] if limit else recs
        return [r.to_proto() for r in recs]

    def request_checkpoint(self, timeout: float = 30.0) -> CheckpointInfo:
        """Ask the loop for a checkpoint at its next micro-batch boundary and wait for it."""
        done, box = threading.Event(), []
        with self._lock:
            self._ckpt_requests.append((done, box))
        if not done.wait(timeout):
            raise TimeoutError("the training loop did not take the checkpoint in time")
        return box[0]

    def stop(self) -> None:
        self.stop_event.set()

    # --- the loop -----------------------------------------------------------------------------
    def resume(self) -> CheckpointInfo | None:
        info = self.store.latest()
        if info is not None:
            self.trainer.load_state_dict(self.store.load(info))
            self.last_checkpoint = info
            self._next_eval_step = self.trainer.step + self.config.train.eval_every
            self._next_ckpt_step = self.trainer.step + self.config.train.checkpoint_every
            log.info("resumed from %s (step %d)", info.path, info.step)
        return info

    def _warm_up(self) -> float:
        """One throw-away micro-batch of one sample, the agent's first training work: first calls pay
        one-off costs (allocator, kernel selection, lazy CUDA/cuBLAS init) that would otherwise land in
        the step-time fit as a 2-3x outlier. Gradients are discarded; the data position is restored.
        Returns its CPU seconds.

        It is training work like any other, so it runs where training runs, never before a lease: in
        the leased-device modes as the first launch of the first lease (`_launch`: planned by the
        enforcer, accounted with `record_other`, kept out of the fit), on a GPU and on a CPU-only site
        alike (there the leased cores are the DU's); in the fallback modes as the first fallback
        iteration, on the fallback cores and CPU tensors, which need no lease. Nothing trained before
        it, so no pending gradient is lost."""
        t = self.trainer
        pos, tokens = t.samples_seen, t.tokens_seen
        cpu_s = t.micro_batch(1).cpu_s
        t.discard_pending()
        t.samples_seen, t.tokens_seen = pos, tokens
        self._warmed = True
        # Move everything alive now (torch's import-time heap, the model, the corpus: ~280 k objects)
        # out of the cyclic GC's reach. A full collection over it took up to 150 ms and, landing inside
        # a micro-batch, was the overrun tail (`weaver bench agent`: launches at 2-3x their prediction).
        gc.freeze()
        return cpu_s

    def run(self, max_seconds: float | None = None) -> None:
        if self.resume() is None and self.config.train.eval_every:
            # a fresh run validates the untrained model first, so the loss curve has its true start
            self._evaluating, self._eval_sum = self.config.train.eval_samples, 0.0
        self.client.start()
        deadline = None if max_seconds is None else self.clock() + max_seconds
        next_mode_eval = self.clock() + MODE_EVERY_S
        try:
            while not self.stop_event.is_set() and (deadline is None or self.clock() < deadline):
                self._iteration()
                if self.clock() >= next_mode_eval:
                    next_mode_eval = self.clock() + MODE_EVERY_S
                    self._evaluate_mode()
        finally:
            with self._lock:
                if self._held is not None:
                    self._settle()
                    self._release(self._held.lease_id, "shutdown", self.clock(), held_sm_count=0)
            self.client.stop()                     # lets the release out first
            self._checkpoint()                     # on shutdown, as of the last optimizer step
            self._serve_checkpoint_requests()

    def _iteration(self) -> None:
        """One pass of the loop (the cross-site agent adds its round tick between launches)."""
        self._handle(self.client.poll(0.0))
        self._serve_checkpoint_requests()
        if self.modes.device == GPU:
            self._leased_iteration()
        else:
            self._fallback_iteration()
        self._report_closed()

    def _leased_iteration(self) -> None:
        c = self.config.train
        with self._lock:
            self._note_host_cpu()
            self._apply_host_reserve()        # against the lease held now
            d = self.enforcer.decide(self.clock(), self.trainer.pending_samples, c.step_samples)
        if not isinstance(d, Idle):
            self.metrics.launched(self.clock())   # the first leased work, a micro-batch or a step
        if isinstance(d, Launch):
            self._use_threads(self.enforcer.lease.sm_count)
            with self._partition(self.enforcer.lease.sm_count):
                self._launch(d)
            self._busy_until = self.clock()
        elif isinstance(d, StepNow):
            t0, cpu0 = self.clock(), time.process_time()
            with self._partition(self.enforcer.lease.sm_count):
                self._optimizer_step()
                self._settle()   # the step's kernels are queued, not done: time it (and end it) done
            t1 = self._busy_until = self.clock()
            self.work_log.append((t0, t1, "step"))
            with self._lock:
                self.enforcer.record_step(t0, t1, time.process_time() - cpu0)
        else:
            self._wait(d)

    def _launch(self, d: Launch) -> None:
        t0 = self.clock()
        if not self._warmed or self._evaluating:
            # Leased work outside the step-time fit: the warm-up (one sample, at most the planned launch)
            # first, then validation, in chunks of as many full-length samples as the measured time of one
            # fits the planned launch (one until measured, or while the fit predicts nothing: a forward-only
            # sample is not ~1/3 of a training one for every job, and a chunk sized so overran its lease).
            if not self._warmed:
                kind, cpu = "warm-up", self._warm_up()
            else:
                per = self._eval_sample_s
                n = math.floor(d.predicted_s / per) if per and d.predicted_s > 0 else 1
                n = min(self._evaluating, max(1, n))
                kind, cpu = "eval", self._eval_chunk(n)
                took = (self.clock() - t0) / n
                self._eval_sample_s = took if per is None else max(took, 0.7 * per + 0.3 * took)
            t1 = self.clock()
            self.work_log.append((t0, t1, kind))
            with self._lock:
                self.enforcer.record_other(t0, t1, cpu)
        else:
            r = self.trainer.micro_batch(d.size, d.fraction)
            self.work_log.append((t0, t0 + r.wall_s, "micro-batch"))
            with self._lock:
                self.enforcer.record_micro_batch(d.size, t0, t0 + r.wall_s, r.cpu_s, d.fraction)

    def _fallback_iteration(self) -> None:
        """Unleased CPU training on the fallback cores (one thread unless configured)."""
        self._use_threads(max(1, self.config.train.threads or 1))
        if not self._warmed:
            self._warm_up()
            return
        if self._evaluating:
            self._eval_chunk(min(self._evaluating, 64))
            return
        self.trainer.micro_batch(min(16, self.config.train.max_micro_batch))
        if self.trainer.pending_samples >= self.config.train.step_samples:
            self._optimizer_step()
        if self._checkpoint_due:
            self._checkpoint()

    def _wait(self, d: Idle) -> None:
        # On a CPU-only site the write is host CPU the platform meters as the site GPU: it waits for an idle
        # moment inside a lease whose budget can hold it, where its reserve kept room for it (a site with no
        # such lease trains nothing new; the shutdown checkpoint writes what is left).
        if self._checkpoint_due and (not self._charges_host() or self._lease_holds_checkpoint()):
            cpu0 = time.process_time()
            self._checkpoint()
            self.learn_checkpoint(time.process_time() - cpu0)
        self._handle(self.client.poll(self._idle_timeout(d)))

    def _idle_timeout(self, d: Idle) -> float:
        tick = HOST_WORK_TICK_S if "exchange" in self._host_work and self._charges_host() else IDLE_TICK_S
        return tick if d.until is None else min(tick, max(0.0, d.until - self.clock()))

    def _optimizer_step(self) -> None:
        with self._lock:
            tokens = self.trainer.pending_tokens
            r = self.trainer.optimizer_step()
            self._tokens_at.append((self.clock(), self.trainer.tokens_seen))
        c = self.config.train
        if r is None:
            return
        if r.applied:   # what a cross-site round counts: tokens whose gradients entered a step
            self.stepped_tokens += tokens
            self.stepped_steps += 1
            self.stepped_loss_sum += r.loss
        if r.applied:
            self.modes.observe_step(self.clock())
        if c.eval_every and self.trainer.step >= self._next_eval_step:
            self._next_eval_step = self.trainer.step + c.eval_every
            self._evaluating, self._eval_sum = c.eval_samples, 0.0
        if c.checkpoint_every and not self._checkpoint_due and self.trainer.step >= self._next_ckpt_step:
            # Written at the next idle moment, not here: a checkpoint is host I/O (tens of ms with the
            # fsync) and must not be counted into, or overrun, a lease window. The next one is due
            # checkpoint_every steps after the step it holds (`_checkpoint`), so a write delayed by a busy
            # stretch never brings the next one closer.
            self._checkpoint_due = True
            self.reserve_host("checkpoint")

    def _eval_chunk(self, n: int) -> float:
        cpu0 = time.process_time()
        total = self.config.train.eval_samples
        start = total - self._evaluating
        self._eval_sum += self.trainer.eval_loss(start, n) * n
        self._evaluating -= n
        if self._evaluating == 0:
            self.trainer.last_val_loss = self._eval_sum / total
            log.info("step %d: val loss %.4f", self.trainer.step, self.trainer.last_val_loss)
        return time.process_time() - cpu0

    def _use_threads(self, n: int) -> None:
        # CPU duty cycle over the leased cores: one intra-op thread per leased core.
        if self.device.kind == "cpu" or self.modes.device == CPU:
            n = max(1, min(n, self.device.sm_count if self.device.kind == "cpu" else n))
            if n != self._threads:
                torch.set_num_threads(n)
                self._threads = n

    def _checkpoint(self) -> CheckpointInfo:
        self._checkpoint_due = False
        self.reserve_host("checkpoint", False)
        with self._lock:
            state = self.trainer.state_dict()
        state["agent"] = {"site_id": self.config.lease.site_id, "agent_config": self.config.to_dict()}
        info = self.store.save(state, state["train_state"]["step"])
        self.last_checkpoint = info
        if self.config.train.checkpoint_every:
            self._next_ckpt_step = info.step + self.config.train.checkpoint_every
        return info

    def _serve_checkpoint_requests(self) -> None:
        with self._lock:
            reqs, self._ckpt_requests = self._ckpt_requests, []
        if reqs:
            info = self._checkpoint()
            for done, box in reqs:
                box.append(info)
                done.set()

    # --- events and reports -------------------------------------------------------------------
    def _handle(self, events) -> None:
        for ev in events:
            with self._lock:
                if isinstance(ev, LeaseGranted):
                    self._on_lease(ev.terms)
                elif isinstance(ev, LeaseRevoked):
                    self._settle()
                    if self.enforcer.on_revoke(ev.at, ev.lease_id, ev.reason, self._busy_until):
                        to_idle_s = self.clock() - ev.at
                        self.yield_latencies_ms.append(to_idle_s * 1e3)
                        self.metrics.lease_ended("revoked", to_idle_s)
                        log.info("lease %s revoked: %s", ev.lease_id or "(all)", ev.reason)
                        if self._held is not None:
                            self._release(self._held.lease_id, REVOKED, ev.at, held_sm_count=0)
                elif isinstance(ev, Disconnected):
                    # Connection loss: launch nothing more under any lease we held. No release can be
                    # sent on a closed stream: the broker counts those leases until their hard end.
                    if self.enforcer.on_revoke(ev.at, "", "disconnected", self._busy_until):
                        self.metrics.lease_ended("disconnected", self.clock() - ev.at)
                    self._held = None
                elif isinstance(ev, Connected):
                    self.cross_site = ev.cross_site
                elif isinstance(ev, CrossSiteChanged):
                    self.cross_site = ev.config

    def _on_lease(self, terms: LeaseTerms) -> None:
        if terms.expires_at <= terms.received_at:
            # Its hard end passed in transit (or queueing): it grants nothing.
            self._refuse(terms, EXPIRED)
            return
        if self.device.kind == "cuda" and terms.sm_count > 0 and self.partitions.acquire(terms.sm_count) == 0:
            # No green context of at most the lease's SMs (unsupported, or creation failed for every
            # size that fits): running on the whole GPU instead would take SMs the RAN was promised.
            self._refuse(terms, REFUSED)
            return
        t = self._effective_terms(terms)
        if self.enforcer.on_lease(t):
            self.metrics.lease_started(t.received_at)
            last = next(reversed(self._records.values()), None)   # the lease adopted before
            if last is None or last.lease_id != t.lease_id:
                if last is not None and last.end == "active":
                    last.end = REPLACED            # the newest lease replaces it at receipt
                self._records[t.lease_id] = self._remember(LeaseRecord(t.lease_id, t.sm_count,
                                                                       int(time.time() * 1e3)))
            self.modes.observe_lease(t.received_at, t.duty * t.sm_count / max(1, self.device.sm_count))
            if self._held is not None and self._held.lease_id != t.lease_id:
                # Events are handled between launches: whatever ran under the old lease has returned,
                # and the next launch enters the new lease's partition.
                self._settle()
                self._release(self._held.lease_id, REPLACED, t.received_at, self._held_units(t))
            self._held = t

    def _refuse(self, terms: LeaseTerms, reason: str) -> None:
        """Run nothing under `terms`; being the newest lease it also ends the ones before it, so the
        release (with `reason`) covers them all."""
        if not self.enforcer.on_refused(terms, reason):
            return   # stale: a newer lease was already seen, and its fate covers this one
        self.refused[reason] = self.refused.get(reason, 0) + 1
        self._remember(LeaseRecord(terms.lease_id, terms.sm_count, int(time.time() * 1e3), end="refused"))
        log.warning("lease %s (%d units) refused: %s", terms.lease_id, terms.sm_count, reason)
        self._settle()
        self._release(terms.lease_id, reason, terms.received_at, held_sm_count=0)

    def _remember(self, rec: LeaseRecord) -> LeaseRecord:
        """Append to the bounded history; the record it pushes out leaves `_records` too (one lease a
        period: an unbounded map would grow for as long as the agent runs)."""
        if len(self.history) == self.history.maxlen:
            old = self.history[0]
            if self._records.get(old.lease_id) is old:
                del self._records[old.lease_id]
        self.history.append(rec)
        return rec

    def _held_units(self, t: LeaseTerms) -> int:
        """Units of the partition leased work runs in under `t`: 0 when it runs none there (an empty
        lease, or training on the fallback cores)."""
        if t.sm_count == 0 or self.modes.device != GPU:
            return 0
        return self.partition_units(t.sm_count)

    def _settle(self) -> None:
        """Wait for the device's queued work, so a release's 'in-flight work has finished' holds and
        `_busy_until` is when it really did. On CPU every launch has returned by now."""
        if self.trainer.device.type == "cuda":
            torch.cuda.synchronize(self.trainer.device)
            self._busy_until = max(self._busy_until, self.clock())

    def _release(self, lease_id: str, reason: str, since: float, held_sm_count: int) -> None:
        """Tell the broker nothing more runs under `lease_id` (nor any earlier lease). Called between
        launches (after `_settle`), so the work launched under it has finished; `overrun_ms` is how long
        that work ran past `since` (when it should have stopped: the event's receipt, or the expiry)."""
        self._held = None
        overrun_ms = max(0.0, self._busy_until - since) * 1e3
        self.client.send_release(lease_id, reason, overrun_ms, held_sm_count)

    def partition_units(self, sm_count: int) -> int:
        """Units the leased work runs on: leased cores as threads (CPU), or on CUDA the green-context
        partition (the whole GPU only for a lease covering it; 0 = none, such a lease is refused)."""
        if self.device.kind == "cpu":
            return max(1, min(sm_count, self.device.sm_count))
        if sm_count >= self.device.sm_count:
            return self.device.sm_count
        return self.partitions.size_for(sm_count) if self.partitions.enabled else 0

    def _partition(self, sm_count: int):
        """Where leased work of `sm_count` runs: the lease's green context on CUDA (never the whole
        GPU for a smaller lease: PartitionUnavailable instead), the leased cores' threads on CPU."""
        if self.device.kind == "cuda":
            return self.partitions.scope(sm_count)
        return contextlib.nullcontext(self.partition_units(sm_count))

    def _effective_terms(self, t):
        """The broker's duty is the lease's share of the whole device (sm_count / device units). Work
        confined to a partition of P units may be busy for duty x device / P of each period, so the
        granted unit-time is the same whichever way the share is enforced (space or time)."""
        if self.device.core_share < 1.0 and t.sm_count > 0:
            # a fractional CPU stand-in: the whole GPU is a share of its thread's time
            return replace(t, duty=t.duty * self.device.core_share)
        units = self.partition_units(t.sm_count)
        if t.sm_count == 0 or units == 0 or units >= self.device.sm_count:
            return t
        return replace(t, duty=min(1.0, t.duty * self.device.sm_count / units))

    def _report_closed(self) -> None:
        """Publish every window closed by now (period ends, expiries, lease events)."""
        with self._lock:
            self._note_host_cpu()
            closed = self.enforcer.close_windows(self.clock())
        self._publish(closed)

    def _charges_host(self) -> bool:
        """Host CPU counts against the lease: a CPU-only site training in the leased-device modes."""
        return self.device.kind == "cpu" and self.modes.device == GPU

    def _lease_holds_checkpoint(self) -> bool:
        """The current lease's budget per period covers a checkpoint write (its learned CPU)."""
        lease = self.enforcer.lease
        return self.enforcer.window is not None and lease is not None and lease.budget_s >= self.checkpoint_cpu_s

    def reserve_host(self, kind: str, on: bool = True) -> None:
        """Host work of `kind` ("checkpoint" due, "exchange" in flight) is about to run (on=False: it ran):
        on a CPU-only site it is kept out of the lease's busy budget meanwhile, so that it runs inside it."""
        if on:
            self._host_work.add(kind)
        else:
            self._host_work.discard(kind)
        self._apply_host_reserve()

    def _apply_host_reserve(self) -> None:
        """The enforcer's reserve against the lease held now: an exchange in flight takes the whole budget; a
        due checkpoint its learned CPU, only where the budget holds it (it waits for such a lease, so
        reserving it in a smaller one would only stop training)."""
        lease = self.enforcer.lease
        if lease is None or not self._charges_host() or self.config.enforcer.kernel_bound:
            reserve = 0.0    # (kernel-bound: host work runs under the worker's quota like any other)
        elif "exchange" in self._host_work:
            reserve = lease.budget_s
        elif "checkpoint" in self._host_work and self._lease_holds_checkpoint():
            reserve = self.checkpoint_cpu_s
        else:
            reserve = 0.0
        self.enforcer.host_reserve_s = reserve

    def learn_checkpoint(self, cpu_s: float) -> None:
        """What a checkpoint write took this time (peak tracker: a larger one is expected at once)."""
        self.checkpoint_cpu_s = max(cpu_s, HOST_WORK_DECAY * self.checkpoint_cpu_s + (1 - HOST_WORK_DECAY) * cpu_s)

    def _note_host_cpu(self) -> None:
        """On a CPU-only site the lease grants the whole process's CPU time (all threads: gRPC, lease
        client, checkpoints, cross-site host work), which is what the platform meters: give the enforcer
        the process CPU clock so it charges host CPU to the lease. On a GPU host CPU is no GPU SM."""
        if self._charges_host():
            self.enforcer.note_process_cpu(self.clock(), time.process_time(), max(1, self._threads))

    def _publish(self, reports: list[WindowReport]) -> None:
        for r in reports:
            if r.end == EXPIRED and self._held is not None and r.lease_id == self._held.lease_id:
                with self._lock:
                    self._settle()
                    self.metrics.lease_ended("expired", self._busy_until - self._held.expires_at)
                    self._release(r.lease_id, EXPIRED, self._held.expires_at, held_sm_count=0)
            self.window_reports.append(r)
            self.metrics.window_closed(r)
            units = self.partition_units(r.sm_count)
            used_ms = used_units_ms(self.device, r.busy_s, r.cpu_s, units)
            with self._lock:
                rec = self._records.get(r.lease_id)
                if rec is not None:
                    rec.granted_ms += r.granted_s * 1e3 * units
                    rec.used_ms += used_ms
                    rec.overrun_ms = max(rec.overrun_ms, r.overrun_s * 1e3)
                    if r.end != PERIOD:
                        rec.end = r.end
                self.modes.observe_overrun(self.clock(), r.overrun_s * 1e3)
            self.client.send_usage(lease_pb2.UsageReport(
                lease_id=r.lease_id, sm_ms_used=used_ms, sm_ms_granted=r.granted_s * 1e3 * units,
                overrun_ms=r.overrun_s * 1e3, steps=r.steps, tokens=r.samples * self.trainer.tokens_per_sample,
                loss=self.trainer.last_loss, mode=self.modes.mode, mode_reason=self.mode_reason,
                window_ms=r.length_s * 1e3,
                device=self.device.kind, val_loss=self.trainer.last_val_loss,
                **window_waterfall(r, units, used_ms, self.work_log)))

    def _tokens_per_s(self) -> float:
        if len(self._tokens_at) < 2:
            return 0.0
        (t0, n0), (t1, n1) = self._tokens_at[0], self._tokens_at[-1]
        return (n1 - n0) / (t1 - t0) if t1 > t0 else 0.0

    def _evaluate_mode(self) -> None:
        now = self.clock()
        tps = self._tokens_per_s()
        lease = self.enforcer.lease
        share = lease.duty * lease.sm_count / max(1, self.device.sm_count) if lease else 0.0
        if tps > 0 and not math.isnan(tps):
            self.modes.observe_throughput(now, self.modes.device, tps, share)
        sw = self.modes.evaluate(now)
        if sw is not None:
            self._apply_switch(sw)

    def _apply_switch(self, sw: ModeSwitch) -> None:
        log.warning("mode %s -> %s: %s", sw.from_mode, sw.to_mode, sw.reason)
        self.client.mode = sw.to_mode      # registered with the new mode on the next (re)connect
        self.mode_reason = sw.reason       # and reported on every UsageReport and status from now
        self._tokens_at.clear()
        self._place_training()

    def _training_device(self) -> str:
        return "cuda" if self.device.kind == "cuda" and self.modes.device == GPU else "cpu"

    def _place_training(self) -> None:
        """Move the model, optimizer state and pending gradients to where the mode trains (Gaia): a
        demoted agent's fallback loop then runs on CPU tensors only, launching nothing on the GPU,
        which it holds no lease for; promotion moves them back. Called between launches."""
        want = self._training_device()
        if self.trainer.device.type == want:
            return
        with self._lock:
            self.trainer.to(want)
        if want == "cpu" and torch.cuda.is_available():
            torch.cuda.empty_cache()     # and hand the memory back too
        log.info("training state moved to %s", want)
