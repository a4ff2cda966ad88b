"""The training-job contract: what a user writes to train their own model under Weaver's leases.

A job owns what is specific to one model: the module, its optimizer, its data and its loss. Everything
the lease loop, the enforcer, checkpoints and the cross-site tier need on top of that (micro-batches
cut to a fraction, token-weighted gradient accumulation, the optimizer step with its finite check and
clip, sample/token counters, the data position, evaluation, device placement, named checkpoint parts)
is implemented once, over any job, by `agent.trainer.Trainer`. A job is built on the CPU; where it
trains is the Trainer's decision (the execution mode's), never the job's.

    def make_job(ctx: JobContext, **args) -> TrainingJob     # named as  package.module:make_job

`load_job` imports the factory by name, calls it with the `--job-arg k=v` values and checks the result
against this contract, so a bad job fails at start with one line (`JobError`), before the agent has
registered with the broker: nothing is leased to an agent that is not ready.
"""
from __future__ import annotations

import importlib
import math
import types
import typing
from dataclasses import MISSING, dataclass, field, fields
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import torch

if TYPE_CHECKING:   # agent.config holds a JobSpec: the import goes that way only
    from agent.config import TrainConfig


class JobError(ValueError):
    """A job that cannot be loaded or breaks the contract; the message is one line naming the problem."""


@dataclass(frozen=True)
class MicroBatchResult:
    samples: int
    tokens: int
    loss: float          # mean per-token loss of this micro-batch
    wall_s: float        # host wall time (CUDA: event time, which excludes queueing before launch)
    cpu_s: float         # process CPU time consumed (all threads), the CPU usage meter


@dataclass(frozen=True)
class StepResult:
    step: int            # optimizer steps taken so far, after this one
    samples: int         # samples in this optimizer batch
    loss: float          # mean loss over the accumulated samples
    grad_norm: float
    applied: bool        # False when loss or gradients were not finite (step skipped)


@dataclass(frozen=True)
class SLOs:
    """User service-level objectives the mode controller promotes or demotes to meet (0 = none stated)."""
    min_tokens_per_s: float = 0.0   # training throughput, on whichever device the mode trains
    max_step_s: float = 0.0         # wall time from one optimizer step to the next (lease waits included)
    round_deadline_s: float = 0.0   # wall time of one cross-site round (its work phase and collectives)

    def __post_init__(self) -> None:
        for f in fields(self):
            v = getattr(self, f.name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
                raise ValueError(f"SLOs.{f.name} must be a finite number >= 0, got {v!r}")

    def merged(self, over: SLOs) -> SLOs:
        """These SLOs with every objective `over` states (non-zero) taking precedence."""
        return SLOs(**{f.name: getattr(over, f.name) or getattr(self, f.name) for f in fields(self)})

    def stated(self) -> dict[str, float]:
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name)}


@dataclass(frozen=True)
class JobSpec:
    """Which job to run: `target` is "package.module:factory" ("" = the shipped char-GPT job)."""
    target: str = ""
    args: dict[str, Any] = field(default_factory=dict)   # keyword arguments of the factory
    slos: SLOs = field(default_factory=SLOs)              # override the job's own SLOs

    def __post_init__(self) -> None:
        if self.target and not _target_ok(self.target):
            raise ValueError(f"job.target must be package.module:factory, got {self.target!r}")
        if not isinstance(self.args, dict) or not all(isinstance(k, str) for k in self.args):
            raise ValueError("job.args must be a mapping of argument names to values")

    @property
    def name(self) -> str:
        return self.target or DEFAULT_JOB


DEFAULT_JOB = "agent.jobs.chargpt:make_job"


@dataclass(frozen=True)
class JobContext:
    """What the agent hands a factory: its training-loop config (seed, lr, sizes of the shipped model)."""
    train: TrainConfig


@runtime_checkable
class TrainingJob(Protocol):
    """What a job provides. `batch` is host-side and a pure function of its sample indices (so the data
    position is the number of samples consumed, which the Trainer checkpoints); `loss` is the device
    work and receives `batch`'s tensors already on the training device."""

    name: str
    model: torch.nn.Module              # its trainable parameters are what the optimizer steps and the tier averages
    optimizer: torch.optim.Optimizer    # over the model's trainable parameters
    tokens_per_sample: int              # tokens of a full-length sample (a causal LM: its context length)
    grad_clip: float                    # max global gradient norm; 0 = no clipping

    def batch(self, split: str, start: int, size: int, tokens: int) -> tuple[torch.Tensor, ...]:
        """Samples `start .. start+size-1` of `split` ("train" | "val"), each its first `tokens` tokens."""
        ...

    def loss(self, *batch: torch.Tensor) -> torch.Tensor:
        """Mean per-token loss (a scalar) of a batch; gradients flow from it."""
        ...

    def config_dict(self) -> dict:
        """The effective configuration, stored in every checkpoint; its "model" entry must match to resume."""
        ...


def job_slos(job: TrainingJob) -> SLOs:
    slos = getattr(job, "slos", None)
    return slos if isinstance(slos, SLOs) else SLOs()


def check_job(job: Any) -> None:
    """Raise JobError naming the first way `job` breaks the contract (it runs no model code)."""
    for name in ("name", "model", "optimizer", "tokens_per_sample", "grad_clip"):
        if not hasattr(job, name):
            raise JobError(f"{type(job).__name__} has no attribute {name!r}")
    for name in ("batch", "loss", "config_dict"):
        if not callable(getattr(job, name, None)):
            raise JobError(f"{type(job).__name__}.{name} is not a method")
    if not isinstance(job.model, torch.nn.Module):
        raise JobError(f"model is a {type(job.model).__name__}, not a torch.nn.Module")
    if not any(p.requires_grad for p in job.model.parameters()):
        raise JobError("model has no trainable parameters")
    if not isinstance(job.optimizer, torch.optim.Optimizer):
        raise JobError(f"optimizer is a {type(job.optimizer).__name__}, not a torch.optim.Optimizer")
    owned = {id(p) for p in job.model.parameters()}
    if any(id(p) not in owned for g in job.optimizer.param_groups for p in g["params"]):
        raise JobError("optimizer steps parameters that are not the model's")
    if not isinstance(job.tokens_per_sample, int) or job.tokens_per_sample < 1:
        raise JobError(f"tokens_per_sample must be an int >= 1, got {job.tokens_per_sample!r}")
    if not isinstance(job.grad_clip, (int, float)) or not job.grad_clip >= 0:
        raise JobError(f"grad_clip must be a number >= 0, got {job.grad_clip!r}")
    if any(p.device.type != "cpu" for p in job.model.parameters()):
        raise JobError("model must be built on the CPU: the agent places it where the execution mode trains")
    cfg = job.config_dict()
    if not isinstance(cfg, dict) or "model" not in cfg:
        raise JobError("config_dict() must return a dict with a 'model' entry")
    if getattr(job, "slos", None) is not None and not isinstance(job.slos, SLOs):
        raise JobError(f"slos is a {type(job.slos).__name__}, not an agent.job.SLOs")
    # Host-side only: a batch is data, not device work, so this probe needs no lease.
    b = job.batch("train", 0, 2, job.tokens_per_sample)
    if not isinstance(b, tuple) or not b or not all(isinstance(t, torch.Tensor) for t in b):
        raise JobError(f"batch() must return a non-empty tuple of tensors, got {type(b).__name__}")
    if any(t.shape[:2] != (2, job.tokens_per_sample) for t in b):
        raise JobError(f"batch('train', 0, 2, {job.tokens_per_sample}) returned shapes "
                       f"{[tuple(t.shape) for t in b]}, expected (2, {job.tokens_per_sample}, ...)")


def _target_ok(target: str) -> bool:
    mod, sep, fn = target.partition(":")
    return bool(sep) and all(p.isidentifier() for p in mod.split(".")) and fn.isidentifier()


def resolve_factory(target: str):
    """The factory named `package.module:factory`, or JobError saying why not."""
    if not _target_ok(target):
        raise JobError(f"--job {target!r}: expected package.module:factory")
    mod_name, _, fn_name = target.partition(":")
    try:
        mod = importlib.import_module(mod_name)
    except ModuleNotFoundError as exc:
        raise JobError(f"--job {target}: no module named {exc.name!r}") from None
    except Exception as exc:   # noqa: BLE001 - a user module failing at import is the user's problem, named
        raise JobError(f"--job {target}: importing {mod_name} raised {type(exc).__name__}: {_one_line(exc)}") from None
    factory = getattr(mod, fn_name, None)
    if not callable(factory):
        raise JobError(f"--job {target}: module {mod_name} has no callable {fn_name!r}")
    return factory


def load_job(spec: JobSpec, ctx: JobContext) -> TrainingJob:
    target = spec.name
    factory = resolve_factory(target)
    try:
        job = factory(ctx, **spec.args)
    except JobError:
        raise
    except Exception as exc:   # noqa: BLE001 - reported as one line, naming the job
        raise JobError(f"--job {target}: factory raised {type(exc).__name__}: {_one_line(exc)}") from None
    try:
        check_job(job)
    except JobError as exc:
        raise JobError(f"--job {target}: violates the training-job contract: {exc}") from None
    except Exception as exc:   # noqa: BLE001 - e.g. batch() raising
        raise JobError(f"--job {target}: violates the training-job contract: {type(exc).__name__}: "
                       f"{_one_line(exc)}") from None
    return job


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


# --- typed job arguments ---------------------------------------------------------------------------

def parse_job_args(pairs: list[str]) -> dict[str, str]:
    """`--job-arg k=v` values as a mapping (strings; `coerce` types them against the job's config)."""
    out = {}
    for p in pairs:
        k, sep, v = p.partition("=")
        if not sep or not k.strip().isidentifier():
            raise ValueError(f"--job-arg {p!r}: expected name=value")
        out[k.strip()] = v
    return out


def coerce(cls, args: dict[str, Any], where: str = "job"):
    """Build the frozen config dataclass `cls` from `args` (CLI strings or JSON values), typing each
    value by its field; an unknown name or a bad value is refused naming the field."""
    hints = typing.get_type_hints(cls)
    known = {f.name: f for f in fields(cls)}
    unknown = sorted(set(args) - set(known))
    if unknown:
        raise ValueError(f"{where}: unknown argument(s) {unknown}; known: {sorted(known)}")
    kw = {}
    for k, v in args.items():
        kw[k] = _typed(hints[k], v, f"{where}.{k}")
    missing = [n for n, f in known.items() if n not in kw and f.default is MISSING and f.default_factory is MISSING]
    if missing:
        raise ValueError(f"{where}: missing argument(s) {missing}")
    return cls(**kw)


def _typed(tp, v, where: str):
    if isinstance(tp, types.UnionType) or typing.get_origin(tp) is typing.Union:
        tp = next(a for a in typing.get_args(tp) if a is not type(None))
    if not isinstance(v, str):
        if tp is float and isinstance(v, int) and not isinstance(v, bool):
            return float(v)
        if isinstance(v, tp) and not (tp is int and isinstance(v, bool)):
            return v
        raise ValueError(f"{where}: expected {tp.__name__}, got {v!r}")
    try:
        if tp is bool:
            if v.lower() in ("1", "true", "yes", "on"):
                return True
            if v.lower() in ("0", "false", "no", "off"):
                return False
            raise ValueError(v)
        return tp(v)
    except ValueError:
        raise ValueError(f"{where}: expected {tp.__name__}, got {v!r}") from None
