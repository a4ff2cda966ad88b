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
  (cost demotion), or at once when overrun p99 exceeds the guard (safety demotion, which also blocks
  promotion for `quiet_s`);
- no throughput-driven switch within `cooldown_s` of the previous one.

User SLOs (`agent.job.SLOs`, stated by the job or its config) come after the safety rules and before
the cost and throughput rules. Each stated objective is measured on the device the mode trains on, over
the window: `min_tokens_per_s` (mean tokens/s, >= SLO_MIN_SAMPLES samples), `max_step_s` (p95 of the
wall time between optimizer steps, or the time since the last step when longer, so a step that never
comes breaches it too) and `round_deadline_s` (mean cross-site round wall time, >= 2 rounds). A breach
switches to the other preferred mode (promotion honours the usable device and the safety quiet time)
unless that device is remembered to breach the same SLO; the switch names the SLO (`ModeSwitch.slo`).
Leaving a device remembers what it measured per SLO, conservatively (the lowest tokens/s, the longest
step and round seen, for SLO_MEMORY_WINDOWS windows), so when neither device meets an objective the agent stays put (`slo_breach` says
so) instead of flapping; a throughput switch never moves to a device remembered to breach a stated SLO.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from agent.config import ModeConfig
from agent.job import SLOs

CPU, GPU = "cpu", "gpu"            # where training runs: fallback cores, or the leased device
MIN_OVERRUN_SAMPLES = 50           # windows needed before an overrun p99 means anything
SLO_MIN_SAMPLES = 3                # throughput samples / step intervals before an SLO is judged
SLO_MEMORY_WINDOWS = 10            # a device's remembered SLO values last this many windows


@dataclass(frozen=True)
class ModeSwitch:
    at: float
    from_mode: str
    to_mode: str
    device: str                    # where training runs after the switch: "gpu" (leased) | "cpu"
    reason: str
    slo: str = ""                  # the user SLO that caused it (an agent.job.SLOs field), "" = another rule


def device_of(mode: str) -> str:
    return GPU if mode in ("gpu", "gpu_preferred") else CPU


class ModeController:
    def __init__(self, config: ModeConfig, now: float = 0.0, leased_device_usable: bool = True,
                 slos: SLOs | None = None):
        self.config = config
        self.slos = slos or SLOs()
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
        self.switches: list[ModeSwitch] = []
        self.steps: deque[float] = deque([now])                 # optimizer-step times (start: the first interval)
        self.round_walls: deque[tuple[float, float]] = deque()  # (at, wall s) of cross-site rounds
        self.slo_memory: dict[tuple[str, str], tuple[float, float]] = {}   # (device, SLO) -> (value, at)
        self.slo_breach = ""                                    # a breach no switch can fix, "" = none

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

    def observe_step(self, now: float) -> None:
        """An optimizer step was applied (on the current device)."""
        self.steps.append(now)

    def observe_round(self, now: float, wall_s: float) -> None:
        """A cross-site round ended after `wall_s` seconds."""
        self.round_walls.append((now, wall_s))

    # --- decision --------------------------------------------------------------------------------
    def _trim(self, now: float) -> None:
        horizon = now - self.config.window_s
        for dq in (self.leases, self.overruns, self.tput[CPU], self.tput[GPU], self.round_walls):
            while dq and dq[0][0] < horizon:
                dq.popleft()
        while len(self.steps) > 1 and self.steps[1] < horizon:   # keep the step an interval starts at
            self.steps.popleft()

    @staticmethod
    def _mean(dq) -> float | None:
        return sum(v for _, v in dq) / len(dq) if dq else None

    def _switch(self, now: float, to: str, reason: str, slo: str = "") -> ModeSwitch:
        for name, value in self._slo_values(now).items():   # what this device did, for the way back
            old = self._remembered_slo(now, self.device, name)
            worse = min if name == "min_tokens_per_s" else max
            self.slo_memory[(self.device, name)] = (value if old is None else worse(old, value), now)
        sw = ModeSwitch(now, self.mode, to, device_of(to), reason, slo)
        self.mode, self.last_switch = to, now
        self.switches.append(sw)
        # The other device's samples describe a different configuration; start the windows afresh.
        self.tput = {CPU: deque(), GPU: deque()}
        self.overruns.clear()
        self.steps = deque([now])           # the first step interval on the new device starts here
        self.round_walls.clear()
        return sw

    # --- user SLOs -------------------------------------------------------------------------------
    def _slo_values(self, now: float) -> dict[str, float]:
        """Each stated SLO's measured value on the current device, where there is enough data."""
        out: dict[str, float] = {}
        tput = self.tput[self.device]
        if self.slos.min_tokens_per_s and len(tput) >= SLO_MIN_SAMPLES:
            out["min_tokens_per_s"] = self._mean(tput)
        if self.slos.max_step_s and self.steps:
            gaps = sorted(b - a for a, b in zip(self.steps, list(self.steps)[1:], strict=False))
            waiting = now - self.steps[-1]    # a step that does not come breaches it too
            p95 = gaps[min(len(gaps) - 1, int(0.95 * len(gaps)))] if len(gaps) >= SLO_MIN_SAMPLES else 0.0
            if len(gaps) >= SLO_MIN_SAMPLES or waiting > self.slos.max_step_s:
                out["max_step_s"] = max(p95, waiting)
        if self.slos.round_deadline_s and len(self.round_walls) >= 2:
            out["round_deadline_s"] = self._mean(self.round_walls)
        return out

    def _meets(self, name: str, value: float) -> bool:
        target = getattr(self.slos, name)
        return value >= target if name == "min_tokens_per_s" else value <= target

    def _remembered_slo(self, now: float, device: str, name: str) -> float | None:
        """What `device` measured for SLO `name` when last left; forgotten after SLO_MEMORY_WINDOWS
        windows, so one bad episode (a lease drought) does not bar a device for good."""
        got = self.slo_memory.get((device, name))
        if got is None or now - got[1] > SLO_MEMORY_WINDOWS * self.config.window_s:
            return None
        return got[0]

    def _known_to_breach(self, now: float, device: str) -> str:
        """A stated SLO `device` is remembered to breach ("" = none)."""
        for name in self.slos.stated():
            v = self._remembered_slo(now, device, name)
            if v is not None and not self._meets(name, v):
                return name
        return ""

    def _slo_rule(self, now: float) -> ModeSwitch | None:
        self.slo_breach = ""
        to = "gpu_preferred" if self.mode == "cpu_preferred" else "cpu_preferred"
        other = device_of(to)
        for name, value in self._slo_values(now).items():
            if self._meets(name, value):
                continue
            unit = {"min_tokens_per_s": "tok/s", "max_step_s": "s/step", "round_deadline_s": "s/round"}[name]
            op = ">=" if name == "min_tokens_per_s" else "<="
            what = f"slo {name}: {value:.4g} {unit} on {self.device} breaches {op} {getattr(self.slos, name):g}"
            there = self._remembered_slo(now, other, name)
            blocked = (to == "gpu_preferred" and (not self.usable or now < self.quiet_until)) or \
                (there is not None and not self._meets(name, there))
            if blocked or now - self.last_switch < self.config.cooldown_s:
                self.slo_breach = what + ("" if not blocked else f"; {other} cannot do better")
                continue
            seen = "unknown" if there is None else f"{there:.4g} {unit}"
            verb = "promote" if to == "gpu_preferred" else "demote"
            return self._switch(now, to, f"{what}; {verb} ({other}: {seen})", slo=name)
        return None

    def evaluate(self, now: float) -> ModeSwitch | None:
        c = self.config
        self._trim(now)
        if self.mode not in ("cpu_preferred", "gpu_preferred"):
            return None
        if self.mode == "gpu_preferred":
            over = sorted(v for _, v in self.overruns)
            if len(over) >= MIN_OVERRUN_SAMPLES:
                p99 = over[min(len(over) - 1, int(0.99 * len(over)))]
                if p99 > c.overrun_guard_ms:
                    self.quiet_until = now + c.quiet_s
                    return self._switch(now, "cpu_preferred",
                                        f"safety: overrun p99 {p99:.1f} ms > guard {c.overrun_guard_ms:.1f} ms")
        if (sw := self._slo_rule(now)) is not None:
            return sw
        if self.mode == "gpu_preferred" and now - self.last_usable_lease >= c.demote_after_s:
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
            if self._known_to_breach(now, GPU):
                return None
            if cpu is None or predicted is None or predicted >= (1 + c.margin) * cpu:
                why = ("leased-device goodput unknown" if predicted is None else
                       f"predicted {predicted:.0f} tok/s >= (1+{c.margin}) x CPU {cpu:.0f} tok/s")
                return self._switch(now, "gpu_preferred", f"promote: {why} (mean share {share:.2f})")
            return None
        gpu = self._mean(self.tput[GPU])
        if gpu is not None and cpu is not None and gpu * (1 + c.margin) <= cpu and not self._known_to_breach(now, CPU):
            return self._switch(now, "cpu_preferred",
                                f"demote: leased {gpu:.0f} tok/s x (1+{c.margin}) <= CPU {cpu:.0f} tok/s")
        return None
