"""The site agent with the cross-site tier: SiteAgent's lease loop, inside time-boxed rounds.

As torchtitan's FaultTolerantTrainer subclasses its Trainer, `CrossSiteAgent` subclasses `SiteAgent`
and changes one thing. Once the lease stream has delivered a `CrossSiteConfig` naming a Lighthouse,
each pass of the agent loop is one `CrossSiteTier.run_round`, whose local work is the ordinary leased
iterations (lease events, micro-batches, optimizer steps, usage reports) until the round's work
deadline. The tier then combines the sites' updates and resets the model to the committed global
weights. Without that config (or when the coordinator clears it) it is exactly a SiteAgent.

Leases stay the only thing that lets it compute: with no lease the work phase idles on lease events
until the deadline and the round contributes zero tokens, but the site stays in the quorum. The
tokens a round reports are those of samples whose gradients entered an optimizer step this round;
gradients still pending at the deadline belong to weights the round is about to replace, so they
are dropped and not counted.

The tier's blocking phases (quorum, all-reduces, the wait for the next boundary) run no training,
so a lease held meanwhile is unused, never overrun: that is the transfer window's cost.
"""
from __future__ import annotations

import json
import logging
import math
import threading
import time
from collections import deque

import torch

from agent.crosssite.rounds import LocalWork, flatten
from agent.crosssite.tier import CrossSiteTier, RoundRecord, TierConfig, lease_stream_callbacks
from agent.modes import GPU
from agent.site_agent import IDLE_TICK_S, SiteAgent

log = logging.getLogger("weaver.agent.crosssite")


class _WorkFailed(Exception):
    """Training itself raised inside a round: not a tier failure, so it is not swallowed."""


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
        self.tier: CrossSiteTier | None = None
        self.tier_config: TierConfig | None = None
        self.rounds: deque[RoundRecord] = deque(maxlen=256)
        self.tier_failures = 0
        self._join: _Join | None = None        # a tier being built (connecting) off the loop thread
        self._failures_in_a_row = 0
        self._bad_config: str = ""
        self._retry_at = -math.inf
        self._stop_at: float | None = None
        self._round_eval_step = 0               # validate after the first committed round this step is reached

    # --- the loop: one round per pass while the tier is on --------------------------------------
    def run(self, max_seconds: float | None = None) -> None:
        self._stop_at = None if max_seconds is None else self.clock() + max_seconds
        try:
            super().run(max_seconds)
        finally:
            self._close_tier()

    def _leased_iteration(self) -> None:
        if self._current_tier() is None:
            super()._leased_iteration()
        else:
            self._round()

    def _fallback_iteration(self) -> None:
        if self._current_tier() is None:
            super()._fallback_iteration()
        else:
            self._round()

    def _stopping(self) -> bool:
        return self.stop_event.is_set() or (self._stop_at is not None and self.clock() >= self._stop_at)

    # --- tier lifecycle -------------------------------------------------------------------------
    def _wanted_config(self) -> TierConfig | None:
        msg = self.cross_site
        if msg is None or not msg.lighthouse_addr:
            return None
        round_s = max(msg.round_ms, 50) / 1000.0
        try:
            # A dead Lighthouse or peer must not block the lease loop for long: bound connects and
            # collectives to two rounds and the quorum wait to three (it legitimately waits up to the
            # join timeout, 1.5 rounds). Seconds-long floors: a loaded host deschedules processes.
            return TierConfig.from_proto(msg, self.config.lease.site_id, timeout_s=max(5.0, 2 * round_s),
                                         quorum_timeout_s=max(10.0, 3 * round_s))
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
            return self.tier
        if self._join is None:
            if self.clock() >= self._retry_at:
                on_plan, _ = lease_stream_callbacks(self.client)
                self._join = _Join(lambda: CrossSiteTier(self.trainer.model, wanted, sleep=self._sleep,
                                                         on_transfer_plan=on_plan, on_round=self._on_round))
            return None
        if not self._join.done.is_set():
            return None           # still connecting: keep training alone under the leases
        result, self._join = self._join.result, None
        if isinstance(result, BaseException):
            self._tier_failed(f"could not join {wanted.lighthouse_addr}", result, wanted.round_s)
            return None
        # Its copy of the weights was taken on the joining thread, possibly mid optimizer step: take
        # it again here, on the loop thread. (A first quorum with healthier peers replaces it anyway.)
        with torch.no_grad():
            result.global_flat.copy_(flatten(result.params))
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

    # --- one round --------------------------------------------------------------------------------
    def _round(self) -> None:
        if self._stopping():   # no new round once stopping; the base loop ends within a tick
            self._handle(self.client.poll(IDLE_TICK_S))
            return
        tier = self.tier
        try:
            tier.run_round(self._local_work)
        except _WorkFailed as exc:
            raise exc.__cause__ from None
        except Exception as exc:  # noqa: BLE001 - quorum / collective failures: the next round retries
            self._tier_failed("round failed", exc, tier.config.round_s)

    def _local_work(self, deadline_unix_s: float) -> LocalWork:
        """The lease loop until the round's work deadline (unix s, converted to the agent's clock)."""
        t = self.trainer
        end = self.clock() + (deadline_unix_s - time.time())
        tokens0, step0 = t.tokens_seen, t.step
        # The deadline is one more hard end for the enforcer: it plans nothing (micro-batch, validation
        # chunk, step) to end after it, and idles until it once nothing fits.
        with self._lock:
            self.enforcer.deadline = end
        try:
            while not self._stopping() and self.clock() < end:
                self._handle(self.client.poll(0.0))
                self._serve_checkpoint_requests()
                if self.modes.device == GPU:
                    super()._leased_iteration()
                else:
                    super()._fallback_iteration()
                self._report_closed()
            # What arrived during the last launch (a revoke, a replacement) is acknowledged now, not
            # after the round's collectives, which may block for seconds.
            self._handle(self.client.poll(0.0))
        except Exception as exc:
            raise _WorkFailed() from exc
        finally:
            with self._lock:
                self.enforcer.deadline = None
        steps = t.step - step0
        # Tokens actually trained: a cut micro-batch (Launch.fraction < 1) trains only a prefix of each
        # sample, so samples x block_size would over-count the round's (token-weighted) contribution.
        pending = t.pending_tokens
        if t.pending_samples:
            t.discard_pending()
        tokens = t.tokens_seen - tokens0 - pending if steps else 0
        return LocalWork(tokens, steps, t.last_loss if steps else math.nan)

    def _sleep(self, seconds: float) -> None:
        """The tier's wait for the next round boundary: nothing is launched, but lease events are
        handled (and released) and closed windows reported meanwhile, as in the idle lease loop."""
        end = self.clock() + seconds
        while (left := end - self.clock()) > 0:
            self._handle(self.client.poll(min(left, IDLE_TICK_S)))
            self._report_closed()

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
