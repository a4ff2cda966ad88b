"""`weaver-agent`: run the site agent, or inspect a running one over its local AgentInspect service.

    weaver-agent run [--preset tiny] [--config agent.json] [--broker host:port] [--site-id s] ...
                     [--job package.module:factory [--job-arg k=v ...]] [--mode MODE]
    weaver-agent inspect-job package.module:factory [--job-arg k=v ...] [--json]
    weaver-agent status|watch|leases|checkpoint [--addr 127.0.0.1:50061] [--json]

`run` starts in the mode the Execution Mode Identifier (agent.modeid) gives the job unless `--mode`
(or the config file's modes.mode) says otherwise; a job that cannot be loaded fails before the agent
connects, with one line naming the problem.

Tables by default, `--json` for scripts. Exit codes: 0 ok, 1 the agent refused, 2 unreachable / bad usage.
"""
from __future__ import annotations

import argparse
import contextlib
import faulthandler
import json
import logging
import math
import os
import signal
import sys
import threading
import time
from dataclasses import replace

import grpc
from google.protobuf.json_format import MessageToDict

from schemas.announce import announce
from schemas.proto.weaver.v1 import lease_pb2, lease_pb2_grpc

DEFAULT_ADDR = os.environ.get("WEAVER_AGENT_INSPECT", "127.0.0.1:50061")
RPC_TIMEOUT_S = 5.0


class Unreachable(Exception):
    pass


def _to_dict(msg) -> dict:
    return MessageToDict(msg, preserving_proto_field_name=True, always_print_fields_with_no_presence=True)


def _stub(addr: str):
    channel = grpc.insecure_channel(addr)
    return channel, lease_pb2_grpc.AgentInspectStub(channel)


def _call(addr: str, fn):
    channel, stub = _stub(addr)
    try:
        return fn(stub)
    except grpc.RpcError as exc:
        if exc.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
            raise Unreachable(f"no agent reachable at {addr} ({exc.code().name}: {exc.details()})") from None
        raise
    finally:
        channel.close()


def _fmt(x: float, spec: str = ".3f") -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def _bar(used: float, budget: float, width: int = 20) -> str:
    frac = 0.0 if budget <= 0 else min(1.0, used / budget)
    n = round(frac * width)
    return "[" + "#" * n + "-" * (width - n) + "]"


def format_status(st: lease_pb2.AgentStatus) -> str:
    lease = (f"{st.lease.lease_id} ({st.lease.sm_count} units, duty {st.lease.duty:.2f}, "
             f"{st.lease_remaining_ms:.0f} ms left)" if st.lease.lease_id else "none")
    mode = f"{st.mode} ({st.mode_reason})" if st.mode_reason else st.mode
    rows = [("site", st.site_id), ("agent", st.agent_id), ("mode", mode), ("device", st.device),
            ("broker", f"{st.broker} ({'connected' if st.connected else 'disconnected'})"), ("lease", lease),
            ("period", f"{st.used_ms_in_period:.1f} / {st.budget_ms_in_period:.1f} ms of {st.period_ms} ms"),
            ("job", st.job or "-"), ("evidence", st.mode_evidence or "-"), ("step", str(st.step)), ("tokens", str(st.tokens)), ("tokens/s", _fmt(st.tokens_per_s, ".0f")),
            ("loss", _fmt(st.loss)), ("val loss", _fmt(st.val_loss)),
            ("checkpoint", f"{st.last_checkpoint or '-'} (step {st.last_checkpoint_step})")]
    w = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{w}}  {v}" for k, v in rows)


def format_watch_line(st: lease_pb2.AgentStatus) -> str:
    lease = st.lease.lease_id or "-"
    return (f"{time.strftime('%H:%M:%S')} {st.mode:<13} {lease:<10} {st.lease.sm_count:>3}u "
            f"{_bar(st.used_ms_in_period, st.budget_ms_in_period)} {st.used_ms_in_period:6.1f}/"
            f"{st.budget_ms_in_period:6.1f} ms  step {st.step:<6} loss {_fmt(st.loss)} "
            f"tok/s {_fmt(st.tokens_per_s, '.0f')}{'' if st.connected else '  DISCONNECTED'}")


def format_leases(hist: lease_pb2.LeaseHistory) -> str:
    head = f"{'lease':<14} {'units':>5} {'granted ms':>11} {'used ms':>10} {'used%':>6} {'overrun ms':>10}  end"
    lines = [head]
    for r in hist.leases:
        pct = 100 * r.used_ms / r.granted_ms if r.granted_ms else 0.0
        lines.append(f"{r.lease_id:<14} {r.sm_count:>5} {r.granted_ms:>11.1f} {r.used_ms:>10.1f} {pct:>5.0f}% "
                     f"{r.overrun_ms:>10.2f}  {r.end}")
    return "\n".join(lines)


# --- commands --------------------------------------------------------------------------------------

def cmd_status(args) -> int:
    st = _call(args.addr, lambda s: s.Status(lease_pb2.StatusRequest(), timeout=RPC_TIMEOUT_S))
    print(json.dumps(_to_dict(st)) if args.json else format_status(st))
    return 0


def cmd_watch(args) -> int:
    channel, stub = _stub(args.addr)
    try:
        n = 0
        for st in stub.Watch(lease_pb2.WatchRequest(), timeout=args.seconds or None):
            print(json.dumps(_to_dict(st)) if args.json else format_watch_line(st), flush=True)
            n += 1
            if args.count and n >= args.count:
                break
    except grpc.RpcError as exc:
        if exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED and args.seconds:
            return 0
        if exc.code() == grpc.StatusCode.UNAVAILABLE:
            raise Unreachable(f"no agent reachable at {args.addr} ({exc.code().name}: {exc.details()})") from None
        raise
    finally:
        channel.close()
    return 0


def cmd_leases(args) -> int:
    hist = _call(args.addr, lambda s: s.Leases(lease_pb2.HistoryRequest(limit=args.limit), timeout=RPC_TIMEOUT_S))
    print(json.dumps(_to_dict(hist)) if args.json else format_leases(hist))
    return 0


def cmd_checkpoint(args) -> int:
    rep = _call(args.addr, lambda s: s.Checkpoint(lease_pb2.CheckpointRequest(), timeout=60))
    print(json.dumps(_to_dict(rep)) if args.json else f"checkpoint {rep.path} (step {rep.step})")
    return 0


def cmd_inspect_job(args) -> int:
    from agent.job import parse_job_args
    from agent.modeid import ModeIdError, identify
    try:
        rep = identify(args.target, parse_job_args(args.job_arg))
    except (ModeIdError, ValueError) as exc:
        print(f"weaver-agent: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(rep.to_json()))
    else:
        print(f"job       {rep.target}\nmode      {rep.mode}")
        for i, e in enumerate(rep.evidence):
            print(f"{'evidence' if i == 0 else '':<9} {e}")
        print(f"{'files':<9} {', '.join(rep.files)}")
    return 0


def _config_sets_mode(path: str | None) -> bool:
    if not path:
        return False
    try:
        data = json.loads(open(path).read())
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and isinstance(data.get("modes"), dict) and "mode" in data["modes"]


def starting_mode(cfg, args):
    """(config with the starting mode, its evidence): --mode, else the config file's, else the identifier's."""
    from agent.job import JobError
    from agent.modeid import ModeIdError, identify
    if args.mode:
        return cfg, f"--mode {args.mode}"
    if _config_sets_mode(args.config):
        return cfg, f"modes.mode {cfg.modes.mode} in {args.config}"
    try:
        rep = identify(cfg.job.name, cfg.job.args)
    except ModeIdError as exc:
        raise JobError(f"--job {exc}") from None
    return replace(cfg, modes=replace(cfg.modes, mode=rep.mode)), "identified: " + rep.summary()


def build_config(args):
    from agent.config import PRESETS, load_config
    from agent.job import JobSpec, parse_job_args
    cfg = load_config(args.config) if args.config else PRESETS[args.preset]()
    if args.job or args.job_arg:
        job_args = {**(cfg.job.args if not args.job or args.job == cfg.job.target else {}),
                    **parse_job_args(args.job_arg)}
        cfg = replace(cfg, job=JobSpec(args.job or cfg.job.target, job_args, cfg.job.slos))
    lease = cfg.lease
    for flag, key in (("broker", "broker"), ("site_id", "site_id"), ("agent_id", "agent_id"), ("token", "token")):
        if getattr(args, flag):
            lease = replace(lease, **{key: getattr(args, flag)})
    cfg = replace(cfg, lease=lease)
    if args.mode:
        cfg = replace(cfg, modes=replace(cfg.modes, mode=args.mode))
    for flag in ("device", "cores", "checkpoint_dir", "inspect_addr", "metrics_addr", "tier_host"):
        if getattr(args, flag, None) is not None:
            cfg = replace(cfg, **{flag: getattr(args, flag)})
    if getattr(args, "phase", None) is not None:
        cfg = replace(cfg, enforcer=replace(cfg.enforcer, phase_fraction=args.phase))
    for flag, key in (("ran_cores", "ran_cores"), ("worker_cpus", "worker_cpus"), ("worker_memory_mb", "memory_mb")):
        if getattr(args, flag, None) is not None:
            cfg = replace(cfg, confine=replace(cfg.confine, **{key: getattr(args, flag)}))
    return cfg


def _listen(serve, agent, addr: str, explicit: bool):
    """Bind `addr`; when it is only the default and taken (a second agent on this host), take any free
    port instead - the startup line says which."""
    try:
        return serve(agent, addr)
    except OSError as exc:
        if explicit:
            raise
        host = addr.rpartition(":")[0]
        logging.getLogger("weaver.agent").warning("%s; listening on a free port instead", exc)
        return serve(agent, f"{host}:0")


def cmd_run(args) -> int:
    """The supervisor (agent.supervisor): lease stream, inspection and /metrics here; the job in a worker
    process confined by the kernel to each lease."""
    from agent.confine import ConfinementError
    from agent.inspect_service import serve_inspect
    from agent.logs import setup as setup_logs
    from agent.supervisor import Supervisor, WorkerRefused, serve_supervisor_metrics

    setup_logs()        # plain on a terminal, the OSC MDC JSON lines in a pod (agent.logs)
    with contextlib.suppress(ValueError, OSError, AttributeError):   # a stderr with no descriptor (in-process)
        faulthandler.register(signal.SIGUSR1, all_threads=True)   # `kill -USR1`: every thread's stack on stderr
    try:
        cfg = build_config(args)
    except ValueError as exc:
        print(f"weaver-agent: bad configuration: {exc}", file=sys.stderr)
        return 2
    try:
        sup = Supervisor(cfg, mode=args.mode, config_path=args.config, cooperative=args.cooperative)
    except ConfinementError as exc:
        print(f"weaver-agent: refusing to train: {exc}", file=sys.stderr)
        return 2
    _stop_on_signals(sup)
    try:
        hello = sup.start()
    except WorkerRefused as exc:
        sup.shutdown()
        if str(exc):
            print(f"weaver-agent: {exc}", file=sys.stderr)
        return 2
    except RuntimeError as exc:
        sup.shutdown()
        print(f"weaver-agent: {exc}", file=sys.stderr)
        return 2
    server, addr = _listen(serve_inspect, sup, cfg.inspect_addr, explicit=args.inspect_addr is not None)
    metrics, metrics_addr = (_listen(serve_supervisor_metrics, sup, cfg.metrics_addr,
                                     explicit=args.metrics_addr is not None)
                             if cfg.metrics_addr else (None, "off"))
    d = sup.device
    units = f"{d.sm_count} SMs" if d.kind == "cuda" else f"{d.cores if d.core_share < 1 else d.sm_count:g} cores"
    bound = sup.confinement + (f" ({sup.confinement_why})" if sup.confinement_why else "")
    announce(f"weaver-agent: site {cfg.lease.site_id}, device {d.kind} {d.name} ({units}), job {hello['job']}, "
             f"{hello['params']} params, mode {hello['mode']} ({hello['mode_evidence']}), broker {cfg.lease.broker}, "
             f"worker pid {sup.worker.pid} bound by {bound}"
             + (f" meter {sup.cgroup.meter_path()}" if sup.cgroup else "")
             + f", metrics on {metrics_addr}, inspect on {addr}")
    try:
        sup.run(max_seconds=args.max_seconds)
    finally:
        server.stop(grace=0.5)
        if metrics is not None:
            metrics.shutdown()
    if sup.worker_exit and not sup.worker_exit.endswith(" 0"):
        print(f"weaver-agent: {sup.worker_exit}", file=sys.stderr)
        return 1
    return 0


def _stop_on_signals(sup) -> None:
    """SIGTERM / SIGINT stop the supervisor, from a thread of their own. A Python handler runs on the main
    thread between two bytecodes, possibly inside a lock that thread holds: one that set the stop Event there
    deadlocked on the Event's own lock when a second SIGTERM came during the first one's `set` (a SIGKILLed
    `weaver up`: the kernel's SIGTERM, then the group's), and the agent never stopped. The handler only
    ignores further signals and writes a byte (no lock); the thread that reads it stops the supervisor."""
    r, w = os.pipe()          # not inherited by the worker (PEP 446)
    os.set_blocking(w, False)

    def on_signal(*_) -> None:
        # The first one stops the agent; the kernel drops the rest. Python runs this between bytecodes, so a
        # storm of them nested it inside itself (each call a few frames) until a RecursionError (a fresh-clone
        # run); ignored from its first line on, at most the one or two already tripped can still come in.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            os.write(w, b"s")
        except OSError:      # a full pipe: a stop is already on its way
            pass

    def wait() -> None:
        os.read(r, 1)
        sup.stop()
    threading.Thread(target=wait, name="signals", daemon=True).start()
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)


def make_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="weaver-agent", description="Weaver site agent: train inside GPU leases")
    sub = p.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run the agent daemon")
    run.add_argument("--config", help="JSON config file (AgentConfig fields)")
    run.add_argument("--preset", default="small", choices=["tiny", "small", "medium"])
    run.add_argument("--broker", help="lease broker host:port")
    run.add_argument("--site-id")
    run.add_argument("--agent-id")
    run.add_argument("--token", default=os.environ.get("WEAVER_AGENT_TOKEN"),
                     help="this site's broker credential (`weaver-xapp site-token SITE`); prefer the env var "
                          "WEAVER_AGENT_TOKEN, since every process's argv is visible in ps")
    run.add_argument("--mode", choices=["cpu", "cpu_preferred", "gpu_preferred", "gpu"])
    run.add_argument("--device", choices=["auto", "cpu", "cuda"])
    run.add_argument("--phase", type=float, help="where in each period leased work starts (share of the "
                     "period; CPU stand-ins sharing a host are staggered)")
    run.add_argument("--cores", type=float, help="CPU cores the site GPU stands for (fractional: a share of one)")
    run.add_argument("--checkpoint-dir")
    run.add_argument("--inspect-addr", help="localhost address for AgentInspect (port 0 = any free port)")
    run.add_argument("--metrics-addr", help="localhost address for Prometheus /metrics ('' = off)")
    run.add_argument("--tier-host", help="the site's interface for the cross-site tier (its gate binds it)")
    run.add_argument("--max-seconds", type=float, help="stop after this long (tests, demos)")
    run.add_argument("--job", help="training job package.module:factory (default: the shipped char-GPT)")
    run.add_argument("--job-arg", action="append", default=[], metavar="K=V", help="factory argument (repeatable)")
    run.add_argument("--cooperative", action="store_true",
                     help="train even where no writable cgroup can confine the worker (its own accounting is then "
                          "the only bound; reported in status and registration)")
    run.add_argument("--ran-cores", help="cpu list the RAN owns: the worker's cpuset keeps off it")
    run.add_argument("--worker-cpus", help="the worker's cpuset (default: every online cpu less --ran-cores)")
    run.add_argument("--worker-memory-mb", type=int, help="the worker tree's memory limit (0 = none)")
    run.set_defaults(fn=cmd_run)
    ins = sub.add_parser("inspect-job", help="the execution mode the identifier gives a job, with its evidence")
    ins.add_argument("target", help="package.module:factory or path/to/file.py:factory")
    ins.add_argument("--job-arg", action="append", default=[], metavar="K=V", help="overrides of its config")
    ins.add_argument("--json", action="store_true")
    ins.set_defaults(fn=cmd_inspect_job)
    for name, fn, helptext in (("status", cmd_status, "lease, mode, device, step, tokens, loss, checkpoint"),
                               ("watch", cmd_watch, "one line per period with a progress bar for the lease"),
                               ("leases", cmd_leases, "recent leases with used/granted/overrun"),
                               ("checkpoint", cmd_checkpoint, "force a checkpoint now")):
        sp = sub.add_parser(name, help=helptext)
        sp.add_argument("--addr", default=DEFAULT_ADDR, help=f"agent inspection address (default {DEFAULT_ADDR})")
        sp.add_argument("--json", action="store_true")
        if name == "watch":
            sp.add_argument("--count", type=int, default=0, help="stop after N lines")
            sp.add_argument("--seconds", type=float, default=0, help="stop after S seconds")
        if name == "leases":
            sp.add_argument("--limit", type=int, default=20)
        sp.set_defaults(fn=fn)
    return p


def main(argv: list[str] | None = None) -> int:
    args = make_parser().parse_args(argv)
    try:
        return args.fn(args)
    except Unreachable as exc:
        print(f"weaver-agent: {exc}", file=sys.stderr)
        return 2
    except grpc.RpcError as exc:
        print(f"weaver-agent: the agent refused: {exc.code().name}: {exc.details()}", file=sys.stderr)
        return 1


def exit_process(rc: int) -> None:
    """End the process once everything it holds has been released explicitly (the supervisor's shutdown:
    the worker stopped, the cgroups removed, the stream closed; the worker's: its last checkpoint and
    snapshot written). Interpreter finalization is skipped on purpose: gRPC's and torch's threads are still
    alive then, and one that wakes after finalization has begun is ended by pthread_exit, whose unwinding
    through a C++ noexcept frame is std::terminate (an abort, "terminate called without an active exception"
    at the end of an agent's log in a CI run)."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(rc)


def entry() -> None:
    """The `weaver-agent` console script and `python -m agent.cli`."""
    exit_process(main())


if __name__ == "__main__":
    entry()
