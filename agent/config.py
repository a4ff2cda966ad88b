"""Configuration: one small frozen dataclass per component, validated on construction, plus presets.

Every checkpoint stores the effective `TrainConfig` (`dataclasses.asdict`), so a run can be reproduced.
Secrets (the lease-broker credential, `LeaseClientConfig.token`) are kept out of what is written or shown:
`AgentConfig.to_dict()` blanks them and `repr` omits them, so a checkpoint or a log line never holds one.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path

from agent.job import JobSpec, SLOs
from agent.model import GPTConfig

MODES = ("cpu", "cpu_preferred", "gpu_preferred", "gpu")


@dataclass(frozen=True)
class TrainConfig:
    model: GPTConfig = field(default_factory=GPTConfig)
    seed: int = 1337
    lr: float = 3e-3              # AdamW, constant: leased training has no fixed horizon for a schedule
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.99
    grad_clip: float = 1.0        # 0 disables
    step_samples: int = 32        # accumulate at least this many samples before an optimizer step
    max_micro_batch: int = 64
    eval_samples: int = 128       # held-out samples for the validation loss
    eval_every: int = 50          # optimizer steps between validations (0 = never)
    checkpoint_every: int = 100   # optimizer steps between checkpoints (0 = only on shutdown/request)
    keep_last: int = 3
    threads: int = 0              # torch intra-op threads; 0 = leased cores (CPU) / torch default

    def __post_init__(self) -> None:
        for name in ("step_samples", "max_micro_batch", "eval_samples", "keep_last"):
            if getattr(self, name) < 1:
                raise ValueError(f"TrainConfig.{name} must be >= 1, got {getattr(self, name)}")
        for name in ("eval_every", "checkpoint_every", "threads"):
            if getattr(self, name) < 0:
                raise ValueError(f"TrainConfig.{name} must be >= 0, got {getattr(self, name)}")
        if not self.lr > 0:
            raise ValueError(f"TrainConfig.lr must be > 0, got {self.lr}")


@dataclass(frozen=True)
class EnforcerConfig:
    safety: float = 0.9           # plan micro-batches to end by safety x remaining budget
    fit_window: int = 64          # recent micro-batches in the affine fit
    tail_quantile: float = 0.9    # plan with this quantile of the fit's residuals as margin
    max_batch_fraction: float = 0.5  # a micro-batch may take at most this share of the period (yield latency)
    edge_batch_fraction: float = 0.2  # the window's last micro-batch (its excess is the overrun): at most this share
    min_micro_batch: int = 1
    max_micro_batch: int = 64
    fixed_micro_batch: int = 0    # >0: baseline policy, launch this size whenever any budget remains
    # Where in each period leased work starts, as a share of the period (as late as still leaves room for
    # the budget). 0 on a DU (its GPU is its own); CPU stand-ins sharing one host's cores are staggered,
    # or they all compute at the start of every period and preempt each other (`weaver up` sets it).
    phase_fraction: float = 0.0
    # The kernel holds the worker to the lease's cores (agent.confine: a CFS quota over 5 ms periods, frozen
    # at the lease's end), so a window is no wall-clock slot the work must end in: a launch may run past
    # the window's end (its CPU is the next window's debt) and only the lease's hard end bounds it. The
    # supervisor sets it for a confined worker; the planning by CPU budget and fit stays.
    kernel_bound: bool = False

    def __post_init__(self) -> None:
        if not 0.0 < self.safety <= 1.0:
            raise ValueError(f"EnforcerConfig.safety must be in (0, 1], got {self.safety}")
        if not 0.0 < self.max_batch_fraction <= 1.0:
            raise ValueError(f"EnforcerConfig.max_batch_fraction must be in (0, 1], got {self.max_batch_fraction}")
        if not 0.0 < self.edge_batch_fraction <= 1.0:
            raise ValueError(f"EnforcerConfig.edge_batch_fraction must be in (0, 1], got {self.edge_batch_fraction}")
        if self.fit_window < 2:
            raise ValueError(f"EnforcerConfig.fit_window must be >= 2, got {self.fit_window}")
        if not 1 <= self.min_micro_batch <= self.max_micro_batch:
            raise ValueError("EnforcerConfig needs 1 <= min_micro_batch <= max_micro_batch")
        if self.fixed_micro_batch < 0:
            raise ValueError(f"EnforcerConfig.fixed_micro_batch must be >= 0, got {self.fixed_micro_batch}")
        if not 0.0 <= self.tail_quantile < 1.0:
            raise ValueError(f"EnforcerConfig.tail_quantile must be in [0, 1), got {self.tail_quantile}")
        if not 0.0 <= self.phase_fraction < 1.0:
            raise ValueError(f"EnforcerConfig.phase_fraction must be in [0, 1), got {self.phase_fraction}")


@dataclass(frozen=True)
class LeaseClientConfig:
    broker: str = "127.0.0.1:50051"
    site_id: str = "site-0"
    agent_id: str = ""            # "" = hostname-pid
    token: str = field(default="", repr=False)   # this site's broker credential: a secret, never logged
    heartbeat_ms: int = 500       # used until the broker's Welcome says otherwise
    backoff_initial_s: float = 0.1
    backoff_max_s: float = 5.0

    def __post_init__(self) -> None:
        if not self.site_id:
            raise ValueError("LeaseClientConfig.site_id must not be empty")
        if not self.brokers or any(":" not in b for b in self.brokers):
            raise ValueError(f"LeaseClientConfig.broker must be host:port (or a comma-separated list of the "
                             f"xApp replicas' brokers), got {self.broker!r}")
        if self.heartbeat_ms < 1 or not 0 < self.backoff_initial_s <= self.backoff_max_s:
            raise ValueError("LeaseClientConfig needs heartbeat_ms >= 1 and 0 < backoff_initial_s <= backoff_max_s")

    @property
    def brokers(self) -> tuple[str, ...]:
        """The brokers to try in turn (one per xApp replica, or one Service in front of them)."""
        return tuple(b.strip() for b in self.broker.split(",") if b.strip())


@dataclass(frozen=True)
class ModeConfig:
    mode: str = "gpu_preferred"   # start on the leased device (a GPU, or the leased cores of a CPU site)
    margin: float = 0.2           # promote when predicted GPU goodput >= (1 + margin) x CPU goodput
    min_leases: int = 5           # fewer non-empty leases in the window: no decision (thin data)
    window_s: float = 60.0        # observation window
    demote_after_s: float = 1800.0  # gpu_preferred with no usable lease this long -> cpu_preferred
    cooldown_s: float = 120.0     # no switch within this long after the previous one
    overrun_guard_ms: float = 10.0  # safety demotion when overrun p99 exceeds this
    quiet_s: float = 300.0        # after a safety demotion, promote again only after this quiet time

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"ModeConfig.mode must be one of {MODES}, got {self.mode!r}")
        if self.margin < 0 or self.min_leases < 0 or self.window_s <= 0 or self.cooldown_s < 0:
            raise ValueError("ModeConfig: margin, min_leases, cooldown_s must be >= 0 and window_s > 0")


@dataclass(frozen=True)
class ConfinementConfig:
    """How the supervisor bounds the training worker's process tree (agent.confine, agent.supervisor)."""
    ran_cores: str = ""          # cpu list the RAN owns ("2-5"): the worker's cpuset keeps off them
    worker_cpus: str = ""        # the worker's cpuset ("" = every online cpu less ran_cores)
    worker_cores: float = 0.0    # a GPU site's worker host CPU quota while leased (0 = its cpuset's cores)
    memory_mb: int = 16384       # the worker tree's memory limit (0 = none)
    startup_cores: float = 0.0   # while the job is built, before any lease (0 = the stand-in's cores)
    shutdown_cores: float = 0.0  # for the final checkpoint after the last lease (0 = a tenth of them, >= 0.05)
    # the supervisor's own CPU bound, in a sibling cgroup of the worker's (0 = measured and reported only); it
    # uses 0.02-0.08 core on average (heartbeats, the lease stream, inspection, metrics)
    supervisor_cores: float = 0.5
    # the least time between two writes of the worker's CPU quota (agent.supervisor.LeaseGate: each write
    # refills a period's quota and forgives the tree's overrun); one metered window
    quota_spacing_ms: float = 100.0

    def __post_init__(self) -> None:
        from agent.confine import parse_cpu_list
        for name in ("ran_cores", "worker_cpus"):
            try:
                parse_cpu_list(getattr(self, name))
            except ValueError:
                raise ValueError(f"ConfinementConfig.{name} must be a cpu list like '0-3,6', got "
                                 f"{getattr(self, name)!r}") from None
        for name in ("worker_cores", "startup_cores", "shutdown_cores", "supervisor_cores", "quota_spacing_ms"):
            if getattr(self, name) < 0:
                raise ValueError(f"ConfinementConfig.{name} must be >= 0, got {getattr(self, name)}")
        if self.memory_mb < 0:
            raise ValueError(f"ConfinementConfig.memory_mb must be >= 0, got {self.memory_mb}")


LOOPBACK = ("127.0.0.1", "localhost", "::1", "[::1]")


@dataclass(frozen=True)
class AgentConfig:
    train: TrainConfig = field(default_factory=TrainConfig)
    enforcer: EnforcerConfig = field(default_factory=EnforcerConfig)
    lease: LeaseClientConfig = field(default_factory=LeaseClientConfig)
    modes: ModeConfig = field(default_factory=ModeConfig)
    job: JobSpec = field(default_factory=JobSpec)   # what to train ("" target = the shipped char-GPT)
    confine: ConfinementConfig = field(default_factory=ConfinementConfig)
    device: str = "auto"          # auto | cpu | cuda
    cores: float = 0              # CPU cores offered to leases (may be fractional); 0 = os.cpu_count()
    checkpoint_dir: str = "checkpoints"
    inspect_addr: str = "127.0.0.1:50061"  # AgentInspect gRPC server (localhost only; port 0 = any)
    metrics_addr: str = "127.0.0.1:9466"   # Prometheus /metrics over HTTP (localhost only); "" = off
    # the interface of the cross-site tier: in a gated tier its gate is the site's one tier listener there
    # (agent.crosssite.gate); the Manager, store and state server stay on loopback
    tier_host: str = "127.0.0.1"

    def __post_init__(self) -> None:
        # neither is authenticated: the site host's own tools and scraper reach them, no one else
        for name in ("inspect_addr", "metrics_addr"):
            addr = getattr(self, name)
            if addr and addr.rpartition(":")[0] not in LOOPBACK:
                raise ValueError(f"AgentConfig.{name} must be a localhost address (127.0.0.1, ::1), got {addr!r}")

    def to_dict(self, *, secrets: bool = False) -> dict:
        """Plain data, for checkpoints and display: the broker credential is blanked unless `secrets`."""
        d = asdict(self)
        if not secrets and d["lease"]["token"]:
            d["lease"]["token"] = ""
        return d

    @classmethod
    def from_dict(cls, data: dict) -> AgentConfig:
        return _build(cls, data, "config")


def _build(cls, data, where: str):
    if not isinstance(data, dict):
        raise ValueError(f"{where}: expected a mapping, got {type(data).__name__}")
    known = {f.name: f for f in fields(cls)}
    unknown = set(data) - set(known)
    if unknown:
        raise ValueError(f"{where}: unknown keys {sorted(unknown)}; known: {sorted(known)}")
    kw = {}
    nested = {"model": GPTConfig, "train": TrainConfig, "enforcer": EnforcerConfig,
              "lease": LeaseClientConfig, "modes": ModeConfig, "confine": ConfinementConfig, "job": JobSpec, "slos": SLOs}
    for key, value in data.items():
        if key in nested and isinstance(value, dict) and not (cls is JobSpec and key == "args"):
            kw[key] = _build(nested[key], value, f"{where}.{key}")
        else:
            kw[key] = value
    try:
        return cls(**kw)
    except TypeError as exc:
        raise ValueError(f"{where}: {exc}") from None


def load_config(path: str | Path) -> AgentConfig:
    """Read a JSON config file; unknown keys and invalid values are refused with the field's name."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"cannot read config {path}: {exc}") from None
    return AgentConfig.from_dict(data)


# --- presets -------------------------------------------------------------------------------------

def tiny_cpu() -> AgentConfig:
    """Runs in seconds on a laptop core: the CI and test preset."""
    return AgentConfig(train=TrainConfig(model=GPTConfig(n_embd=64, n_head=4, n_layer=1, block_size=32),
                                         step_samples=8, max_micro_batch=32, eval_samples=32,
                                         eval_every=20, checkpoint_every=50),
                       enforcer=EnforcerConfig(max_micro_batch=32))


def small() -> AgentConfig:
    """The default: ~0.4 M-parameter char GPT (width 128, 2 layers, 4 heads, context 64)."""
    return AgentConfig()


def medium() -> AgentConfig:
    """~1.8 M parameters (width 192, 4 layers, context 128): for device-mode experiments."""
    return AgentConfig(train=TrainConfig(model=GPTConfig(n_embd=192, n_layer=4, n_head=4, block_size=128)))


PRESETS = {"tiny": tiny_cpu, "small": small, "medium": medium}


def with_overrides(cfg: AgentConfig, **changes) -> AgentConfig:
    return replace(cfg, **changes)
