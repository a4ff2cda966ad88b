"""The site agent with the cross-site tier: SiteAgent's lease loop, with rounds that overlap it.

As torchtitan's FaultTolerantTrainer subclasses its Trainer, `CrossSiteAgent` subclasses `SiteAgent`
and adds one thing to its loop. Once the lease stream has delivered a `CrossSiteConfig` naming a
Lighthouse, every pass of the one lease loop (lease events, micro-batches, optimizer steps, usage
reports) also ticks the tier between launches: at the start of a round's transfer window it hands
the tier a snapshot of the weights and the work trained since the last one, and when the round's
exchange has landed (on the tier's own thread) it merges the new global weights under the local
progress made meanwhile. Training never stops for the wide area; the published transfer windows
stay (the transport still gets its schedulable window). Without that config (or when the
coordinator clears it) it is exactly a SiteAgent.

Leases stay the only thing that lets it compute: with no lease the loop idles on lease events and
the round contributes zero tokens, but the site stays in the quorum. The tokens a round reports are
those of samples whose gradients entered an optimizer step between its snapshot and the one before.
"""
from __future__ import annotations

import json
import logging
import math
import threading
from collections import deque

import torch

from agent.crosssite.rounds import LocalWork, flatten
from agent.crosssite.tier import CrossSiteTier, RoundRecord, TierConfig, lease_stream_callbacks, preload
from agent.site_agent import SiteAgent

log = logging.getLogger("weaver.agent.crosssite")


class _Join:
    """Builds a CrossSiteTier on its own thread: torchft's Manager connects to the Lighthouse in its
    constructor (seconds when it is slow or away), and the lease loop must not stall for that."""

    def __init__(self, build) -> None:
        self.result: CrossSiteTier | BaseException | None = None
        self.done = threading.Event()
        self._abandoned = False
        self._lock = threading.Lock()
        threading.Thread(target=self._run, args=(build,), name="crosssite-join", daemon=True).start()

    def _run(self, build) -> None:
        try:
            result = build()
        except Exception as exc:  # noqa: BLE001 - handed to the loop thread, which decides
            result = exc
        with self._lock:
            if self._abandoned and isinstance(result, CrossSiteTier):
                result.close()
            self.result = result
        self.done.set()

    def abandon(self) -> None:
        """The config changed or the agent stops: close the tier if it is (or once it is) built."""
        with self._lock:
            self._abandoned = True
            if isinstance(self.result, CrossSiteTier):
                self.result.close()


class CrossSiteAgent(SiteAgent):
    def __init__(self, config, **kw):
        super().__init__(config, **kw)
        preload()                               # before the agent connects, not in its first leases
        self.tier: CrossSiteTier | None = None
        self.tier_config: TierConfig | None = None
        self.rounds: deque[RoundRecord] = deque(maxlen=256)
        self.tier_failures = 0
        self._join: _Join | None = None        # a tier being built (connecting) off the loop thread
        self._failures_in_a_row = 0
        self._bad_config: str = ""
        self._wanted_for: tuple = (None, None)   # (the CrossSiteConfig message, the TierConfig made of it)
        self._retry_at = -math.inf
        self._round_eval_step = 0               # validate after the first committed round this step is reached
        self._mark = self._work_counters()      # the counters at the last snapshot (or at joining)

    # --- the loop: SiteAgent's, with the tier ticked between launches ---------------------------
    def run(self, max_seconds: float | None = None) -> None:
        try:
            super().run(max_seconds)
        finally:
            self._close_tier()

    def _iteration(self) -> None:
        super()._iteration()
        tier = self._current_tier()
        if tier is None:
            return
        try:
            if tier.in_flight:
                landed = tier.landed
                tier.poll()                    # merge a round that has landed (calls _on_round)
                if landed:
                    self._exchange_done()
            if tier.due() and not self.stop_event.is_set() and self._exchange_fits():
                # The exchange's CPU (quorum, all-reduces, outer step, other threads) is host work: the
                # lease's budget is reserved for it while it is in flight (SiteAgent.reserve_host).
                self.reserve_host("exchange")
                tier.begin(self._work_since_snapshot())
        except Exception as exc:  # noqa: BLE001 - quorum / collective failures: the next round retries
            self._exchange_done()
            self._tier_failed("round failed", exc, tier.config.round_s)

    def _exchange_fits(self) -> bool:
        """On a CPU-only site an exchange begins where a window's work may (its phase), before that work
        (at the latest a period later), so that the budget reserved for it is still unspent: begun after the
        window's work, its CPU would run beyond the lease; begun before the phase, next to the previous
        window's work (one metered period held both: 26 SMs beyond the lease). Without a lease there is
        nothing to hold it in."""
        w, lease = self.enforcer.window, self.enforcer.lease
        if not self._charges_host() or w is None or lease is None or lease.budget_s <= 0:
            return True
        return w.busy_s == 0 and self.clock() >= self.enforcer.work_start()

    def _exchange_done(self) -> None:
        self.reserve_host("exchange", False)

    def _work_counters(self) -> tuple[int, int, float]:
        return self.stepped_tokens, self.stepped_steps, self.stepped_loss_sum

    def _work_since_snapshot(self) -> LocalWork:
        tokens, steps, loss_sum = self._work_counters()
        t0, s0, l0 = self._mark
        self._mark = (tokens, steps, loss_sum)
        n = steps - s0
        if n <= 0 or tokens <= t0:
            return LocalWork(0, 0)
        return LocalWork(tokens - t0, n, (loss_sum - l0) / n)

    # --- tier lifecycle -------------------------------------------------------------------------
    def _wanted_config(self) -> TierConfig | None:
        msg = self.cross_site
        if msg is None or not msg.lighthouse_addr:
            return None
        if self._wanted_for[0] is msg:          # built once per message: a gated config checks its pass
            return self._wanted_for[1]
        self._wanted_for = (msg, self._config_of(msg))
        return self._wanted_for[1]

    def _config_of(self, msg) -> TierConfig | None:
        round_s = max(msg.round_ms, 50) / 1000.0
        try:
            # A dead Lighthouse or peer must not block the lease loop for long: bound connects and
            # collectives to two rounds and the quorum wait to three (it legitimately waits up to the
            # join timeout, 1.5 rounds). Seconds-long floors: a loaded host deschedules processes.
            return TierConfig.from_proto(msg, self.config.lease.site_id, timeout_s=max(5.0, 2 * round_s),
                                         quorum_timeout_s=max(10.0, 3 * round_s), bind_host=self.config.tier_host)
        except ValueError as exc:
            if str(exc) != self._bad_config:
                self._bad_config = str(exc)
                log.warning("cross-site config refused, training alone: %s", exc)
            return None

    def _current_tier(self) -> CrossSiteTier | None:
        """The tier for the coordinator's current config, (re)built between rounds; None = train alone."""
        wanted = self._wanted_config()
        if wanted != self.tier_config:
            self._close_tier()
            self.tier_config = wanted
            self._retry_at, self._failures_in_a_row = -math.inf, 0
        if wanted is None:
            return None
        if self.tier is not None:
            if wanted.tier_pass_expiry_unix != self.tier.config.tier_pass_expiry_unix:
                self.tier.renew(wanted)          # the broker renewed the pass: the same tier, a new pass
            return self.tier
        if self._join is None:
            if self.clock() >= self._retry_at:
                on_plan, _ = lease_stream_callbacks(self.client)
                self._join = _Join(lambda: CrossSiteTier(self.trainer.model, wanted,
                                                         on_transfer_plan=on_plan, on_round=self._on_round))
            return None
        if not self._join.done.is_set():
            return None           # still connecting: keep training alone under the leases
        result, self._join = self._join.result, None
        if isinstance(result, BaseException):
            self._tier_failed(f"could not join {wanted.lighthouse_addr}", result, wanted.round_s)
            return None
        # Its copy of the weights was taken on the joining thread, possibly mid optimizer step: take
        # it again here, on the loop thread: the work from now on is based on it.
        with torch.no_grad():
            result.global_flat.copy_(flatten(result.params))
        self._mark = self._work_counters()
        self.tier = result
        # validation follows committed rounds (global weights), not local optimizer steps
        self._next_eval_step = math.inf
        log.info("cross-site tier on: lighthouse %s, rounds of %d ms", wanted.lighthouse_addr, wanted.round_ms)
        return self.tier

    def _close_tier(self) -> None:
        join, self._join = self._join, None
        if join is not None:
            join.abandon()
        tier, self.tier = self.tier, None
        self.reserve_host("exchange", False)
        if tier is not None:
            tier.close()
            c = self.config.train
            self._next_eval_step = self.trainer.step + c.eval_every if c.eval_every else 0
            log.info("cross-site tier off")

    def _tier_failed(self, what: str, exc: Exception, round_s: float) -> None:
        # A Lighthouse that stays away is retried with exponential backoff (1, 2, 4 ... rounds, at most
        # a minute): each try holds a torchft Manager and its threads for up to the connect timeout.
        self.tier_failures += 1
        self._failures_in_a_row += 1
        backoff = min(60.0, round_s * 2 ** min(self._failures_in_a_row - 1, 10))
        log.warning("cross-site: %s: %s: %s; training alone for %.1f s", what, type(exc).__name__, exc, backoff)
        self._close_tier()
        self._retry_at = self.clock() + backoff

    def _on_round(self, rec: RoundRecord) -> None:
        self.rounds.append(rec)
        self.modes.observe_round(self.clock(), rec.wall_ms / 1e3)   # the round-deadline SLO
        self._failures_in_a_row = 0
        _, report = lease_stream_callbacks(self.client)
        report(rec)
        c = self.config.train
        if c.eval_every and rec.committed and not self._evaluating and self.trainer.step >= self._round_eval_step:
            # The model now holds the new global weights: validate those, at the start of the next work
            # phase, every eval_every of this site's optimizer steps. A validation still in flight is
            # never restarted: on a site with little budget it would then never finish, and since it
            # runs before training, the site would never train (it may span two global models instead).
            self._round_eval_step = self.trainer.step + c.eval_every
            self._evaluating, self._eval_sum = c.eval_samples, 0.0
        log.info("round %s", json.dumps({k: v for k, v in rec.to_json().items() if not isinstance(v, float)
                                         or math.isfinite(v)}))
