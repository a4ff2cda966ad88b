"""Execution modes after Gaia (compute-and-training-facts.md §7): cpu, cpu_preferred, gpu_preferred, gpu.

"GPU" here means the *leased device*: the site GPU, or on a CPU-only site the DU cores the xApp
leases. "CPU" means the agent's unleased fallback cores. `cpu` and `gpu` are pinned; only the two
preferred modes switch, and every switch is a `ModeSwitch` value with its reason (logged and reported
by the caller). Pure and clock-free: every method takes `now`.

Rules (defaults in `ModeConfig`):
- promote cpu_preferred -> gpu_preferred when, over the window, at least `min_leases` non-empty leases
  arrived (else: thin data, no decision) and the predicted leased goodput (remembered full-device
  tokens/s x mean granted share; unknown counts as promising, as in Gaia) >= (1 + margin) x CPU tokens/s;
- demote gpu_preferred -> cpu_preferred when measured leased goodput x (1 + margin) <= CPU tokens/s
  (the same margin the other way: a hysteresis band), or when no usable lease came for `demote_after_s`
  (cost demotion), or at once when overrun p99 exceeds the guard or the xApp reports a RAN deadline
  miss (safety demotion, which also blocks promotion for `quiet_s`);
- no throughput-driven switch within `cooldown_s` of the previous one.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from agent.config import ModeConfig

CPU, GPU = "cpu", "gpu"            # where training runs: fallback cores, or the leased device
MIN_OVERRUN_SAMPLES = 50           # windows needed before an overrun p99 means anything


@dataclass(frozen=True)
class ModeSwitch:
    at: float
    from_mode: str
    to_mode: str
    device: str                    # where training runs after the switch: "gpu" (leased) | "cpu"
    reason: str


def device_of(mode: str) -> str:
    return GPU if mode in ("gpu", "gpu_preferred") else CPU


class ModeController:
    def __init__(self, config: ModeConfig, now: float = 0.0, leased_device_usable: bool = True):
        self.config = config
        self.mode = config.mode
        if not leased_device_usable and self.mode in ("gpu", "gpu_preferred"):
            self.mode = "cpu_preferred" if self.mode == "gpu_preferred" else "cpu"
        self.usable = leased_device_usable
        self.last_switch = now
        self.last_usable_lease = now
        self.quiet_until = -float("inf")
        self.leases: deque[tuple[float, float]] = deque()       # (at, granted share 0..1) of non-empty leases
        self.tput: dict[str, deque[tuple[float, float]]] = {CPU: deque(), GPU: deque()}
        self.remembered: dict[str, float] = {}                  # device -> tokens/s at full device (conservative)
        self.overruns: deque[tuple[float, float]] = deque()
        self.ran_miss = False
        self.switches: list[ModeSwitch] = []

    @property
    def device(self) -> str:
        return device_of(self.mode)

    # --- observations ----------------------------------------------------------------------------
    def observe_lease(self, now: float, share: float) -> None:
        """A lease arrived granting `share` (0..1) of the leased device (duty x sm_count / device SMs)."""
        if share > 0:
            self.leases.append((now, share))
            self.last_usable_lease = now

    def observe_throughput(self, now: float, device: str, tokens_per_s: float, share: float = 1.0) -> None:
        """Measured tokens/s on `device`; on the leased device also the share it had, to scale to full."""
        self.tput[device].append((now, tokens_per_s))
        if device == GPU and share > 0:
            full = tokens_per_s / share
            self.remembered[GPU] = min(self.remembered.get(GPU, full), full)
        elif device == CPU:
            self.remembered[CPU] = tokens_per_s if CPU not in self.remembered else min(self.remembered[CPU], tokens_per_s)

    def observe_overrun(self, now: float, overrun_ms: float) -> None:
        self.overruns.append((now, overrun_ms))

    def observe_ran_miss(self, now: float) -> None:
        self.ran_miss = True

    # --- decision --------------------------------------------------------------------------------
    def _trim(self, now: float) -> None:
        horizon = now - self.config.window_s
        for dq in (self.leases, self.overruns, self.tput[CPU], self.tput[GPU]):
            while dq and dq[0][0] < horizon:
                dq.popleft()

    @staticmethod
    def _mean(dq) -> float | None:
        return sum(v for _, v in dq) / len(dq) if dq else None

    def _switch(self, now: float, to: str, reason: str) -> ModeSwitch:
        sw = ModeSwitch(now, self.mode, to, device_of(to), reason)
        self.mode, self.last_switch = to, now
        self.switches.append(sw)
        # The other device's samples describe a different configuration; start the windows afresh.
        self.tput = {CPU: deque(), GPU: deque()}
        self.overruns.clear()
        return sw

    def evaluate(self, now: float) -> ModeSwitch | None:
        c = self.config
        self._trim(now)
        if self.mode not in ("cpu_preferred", "gpu_preferred"):
            return None
        if self.mode == "gpu_preferred":
            if self.ran_miss:
                self.ran_miss = False
                self.quiet_until = now + c.quiet_s
                return self._switch(now, "cpu_preferred", "safety: RAN deadline miss attributed to training")
            over = sorted(v for _, v in self.overruns)
            if len(over) >= MIN_OVERRUN_SAMPLES:
                p99 = over[min(len(over) - 1, int(0.99 * len(over)))]
                if p99 > c.overrun_guard_ms:
                    self.quiet_until = now + c.quiet_s
                    return self._switch(now, "cpu_preferred",
                                        f"safety: overrun p99 {p99:.1f} ms > guard {c.overrun_guard_ms:.1f} ms")
            if now - self.last_usable_lease >= c.demote_after_s:
                return self._switch(now, "cpu_preferred",
                                    f"cost: no usable lease for {now - self.last_usable_lease:.0f} s")
        if now - self.last_switch < c.cooldown_s:
            return None
        if len(self.leases) < c.min_leases:
            return None   # thin data: no throughput decision
        cpu = self.remembered.get(CPU) if not self.tput[CPU] else self._mean(self.tput[CPU])
        share = self._mean(self.leases)
        if self.mode == "cpu_preferred":
            if not self.usable or now < self.quiet_until:
                return None
            full = self.remembered.get(GPU)
            predicted = None if full is None else full * share
            if cpu is None or predicted is None or predicted >= (1 + c.margin) * cpu:
                why = ("leased-device goodput unknown" if predicted is None else
                       f"predicted {predicted:.0f} tok/s >= (1+{c.margin}) x CPU {cpu:.0f} tok/s")
                return self._switch(now, "gpu_preferred", f"promote: {why} (mean share {share:.2f})")
            return None
        gpu = self._mean(self.tput[GPU])
        if gpu is not None and cpu is not None and gpu * (1 + c.margin) <= cpu:
            return self._switch(now, "cpu_preferred",
                                f"demote: leased {gpu:.0f} tok/s x (1+{c.margin}) <= CPU {cpu:.0f} tok/s")
        return None
