"""GPU check for a CUDA host (< 2 minutes): overrun and SM-share adherence with and without green contexts.

    python -m agent.gpu_check [--seconds 100] [--json out.json]

Prints one JSON document on stdout. Sections (each records its own error instead of aborting):
  env             torch/CUDA/driver facts, SM count, green-context support
  step_fit        micro-batch times of a GPU-sized char GPT, CUDA-event timed, and the affine fit
  green_switch    green-context creation time per size and per-launch stream-switch cost
  sm_share        a fixed matmul workload inside green contexts of 16..N SMs: throughput share vs SM share
  adherence       the agent's enforcer under a lease trace, without (duty cycle on the whole GPU) and with
                  (green context of the leased SMs) partitions: utilisation and overrun p50/p99/max
  worker_contexts a fresh process started as the confined worker is (agent.gpu_contexts): is the green
                  context its only CUDA context, or does the primary context exist too (then MPS, not a
                  green context, must bound the worker)
  idle_device     a demoted agent (cpu_preferred: its fallback loop) and an agent whose lease has no
                  partition (refused) run no CUDA kernel or copy (profiler count == 0), as the test suite
                  checks where CUDA is present (tests/agent/test_agent_device.py)
`--allow-cpu` runs the same code on CPU with tiny sizes (a smoke test of the script itself).
"""
from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
import traceback


def _section(out: dict, name: str, fn, *a):
    t0 = time.monotonic()
    try:
        out[name] = fn(*a)
    except Exception as exc:   # report and carry on: one unsupported feature must not hide the rest
        out[name] = {"error": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc(limit=3)}
    out[name]["section_s"] = round(time.monotonic() - t0, 2)


def env_facts(torch) -> dict:
    from agent.partition import green_supported
    d = {"torch": torch.__version__, "cuda_available": torch.cuda.is_available(), "cuda": torch.version.cuda,
         "green_contexts": green_supported()}
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        d.update(name=p.name, sm_count=p.multi_processor_count, memory_gib=round(p.total_memory / 2**30, 1),
                 capability=f"{p.major}.{p.minor}")
    return d


class Timer:
    """CUDA events on GPU (kernel time, not host time); perf_counter on CPU."""

    def __init__(self, torch, cuda: bool):
        self.torch, self.cuda = torch, cuda

    def __call__(self, fn):
        if self.cuda:
            s, e = self.torch.cuda.Event(enable_timing=True), self.torch.cuda.Event(enable_timing=True)
            s.record()
            fn()
            e.record()
            e.synchronize()
            return s.elapsed_time(e) / 1e3
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0


def gpu_model_config(cuda: bool):
    from agent.config import TrainConfig
    from agent.model import GPTConfig
    # Big enough that a micro-batch is compute-bound on an H200 (tens of ms at B=32), small enough to load fast.
    model = GPTConfig(n_embd=512, n_layer=6, n_head=8, block_size=256) if cuda else \
        GPTConfig(n_embd=64, n_layer=1, n_head=4, block_size=32)
    return TrainConfig(model=model, step_samples=32, max_micro_batch=128, eval_every=0, checkpoint_every=0)


def step_fit(torch, trainer, timer, sizes) -> dict:
    from agent.enforcer import StepTimeFit
    fit = StepTimeFit(window=256)
    times = {}
    for _ in range(2):
        trainer.micro_batch(sizes[0])          # warm-up
    trainer.discard_pending()
    for b in sizes * 4:
        t = timer(lambda b=b: trainer.micro_batch(b))
        fit.add(b, t)
        times.setdefault(b, []).append(t * 1e3)
    trainer.discard_pending()
    step = [timer(lambda: (trainer.micro_batch(1), trainer.optimizer_step())) * 1e3 for _ in range(5)]
    return {"ms_by_batch": {b: [round(x, 3) for x in v] for b, v in times.items()},
            "fit_a_ms": fit.a * 1e3, "fit_b_ms_per_sample": fit.b * 1e3, "fit_margin_ms": fit.margin * 1e3,
            "micro_batch_plus_step_ms": [round(x, 3) for x in step]}


def green_switch(torch, sms: int) -> dict:
    from agent.partition import create_green_context, green_scope
    out, ctxs = {"create_ms": {}, "has_stream_api": None}, {}
    for n in sorted({8, 16, 32, 64, (sms // 2) // 8 * 8, (sms - 8) // 8 * 8}):
        if 0 < n < sms:
            t0 = time.perf_counter()
            ctxs[n] = create_green_context(n)
            out["create_ms"][n] = round((time.perf_counter() - t0) * 1e3, 3)
    out["has_stream_api"] = all(hasattr(c, "Stream") for c in ctxs.values())
    x = torch.randn(256, 256, device="cuda")
    streams = [c.Stream() if hasattr(c, "Stream") else None for c in ctxs.values()]
    contexts = list(ctxs.values())
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    n = 2000
    for i in range(n):
        with green_scope(contexts[i % len(contexts)], streams[i % len(streams)]):
            x.add_(1.0)
    torch.cuda.synchronize()
    out["switch_plus_launch_us"] = round((time.perf_counter() - t0) / n * 1e6, 2)
    t0 = time.perf_counter()
    for _ in range(n):
        x.add_(1.0)
    torch.cuda.synchronize()
    out["launch_only_us"] = round((time.perf_counter() - t0) / n * 1e6, 2)
    return out


def sm_share(torch, sms: int, seconds_per_size: float = 1.0) -> dict:
    from agent.partition import create_green_context, green_scope
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    timer = Timer(torch, True)

    def tflops(green=None) -> float:
        reps = 10

        def work():
            for _ in range(reps):
                torch.mm(a, b)
        with green_scope(green) if green is not None else _null():
            work()                                      # warm-up on this stream
            torch.cuda.synchronize()
            best, t_end = 0.0, time.monotonic() + seconds_per_size
            while time.monotonic() < t_end:
                t = timer(work)
                best = max(best, reps * 2 * 8192**3 / t / 1e12)
        return best

    full = tflops()
    rows = []
    for n in [s for s in (16, 32, 48, 64, 96, 128) if s < sms]:
        got = tflops(create_green_context(n))
        rows.append({"sms": n, "sm_share": round(n / sms, 3), "throughput_share": round(got / full, 3),
                     "tflops": round(got, 1), "adherence": round((got / full) / (n / sms), 3)})
    return {"full_device_tflops": round(full, 1), "partitions": rows}


class _null:
    def __enter__(self):
        return None

    def __exit__(self, *a):
        return False


def adherence(torch, trainer, cuda: bool, sms: int, use_green: bool, windows: int, lease_sms: int) -> dict:
    from agent.config import EnforcerConfig
    from agent.enforcer import BudgetEnforcer, Launch, LeaseTerms, StepNow
    from agent.partition import GreenContextPool
    rng = random.Random(11)
    trace = [(rng.choice((0.02, 0.05, 0.1)), rng.choice((0.5, 1.0))) for _ in range(windows)]
    pool = GreenContextPool(sms, 8, enabled=use_green)
    enf = BudgetEnforcer(EnforcerConfig(max_micro_batch=128))
    part = pool.size_for(lease_sms) if use_green else sms
    share = lease_sms / sms
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    clock = time.monotonic
    reports, i, next_lease = [], 0, clock()
    # The duty-cycle arm is the baseline the agent no longer runs (the whole GPU for a smaller lease).
    with pool.scope(lease_sms) if use_green else _null():
        for _ in range(3):
            trainer.micro_batch(4)
        trainer.discard_pending()
        sync()
        while True:
            now = clock()
            if i < len(trace) and now >= next_lease:
                period, busy_frac = trace[i]
                # Without a partition the share is enforced in time (duty = SM share x busy fraction);
                # inside a green context of the leased SMs only the busy fraction remains.
                duty = busy_frac if use_green else share * busy_frac
                enf.on_lease(LeaseTerms(f"L{i}", lease_sms, period, period, duty, now, 1, i + 1))
                next_lease, i = now + period, i + 1
            elif i >= len(trace) and enf.lease is None:
                break
            d = enf.decide(now, trainer.pending_samples, 32)
            if isinstance(d, Launch):
                r = trainer.micro_batch(d.size, d.fraction)          # a tail-filling launch cuts its samples
                enf.record_micro_batch(d.size, now, now + r.wall_s, 0.0, d.fraction)
            elif isinstance(d, StepNow):
                trainer.optimizer_step()
                sync()
                enf.record_step(now, clock())
            else:
                wake = min([x for x in (d.until, next_lease if i < len(trace) else None) if x is not None] or [now])
                time.sleep(max(0.0, wake - clock()))
            reports += enf.close_windows(clock())
    ws = [r for r in reports if r.granted_s > 0]
    over = sorted(r.overrun_s * 1e3 for r in ws)
    over_pct = sorted(100 * r.overrun_s / r.length_s for r in ws if r.length_s > 0)
    granted_sm_ms = sum(r.granted_s for r in ws) * 1e3 * part
    used_sm_ms = sum(r.busy_s for r in ws) * 1e3 * part

    def q(p):
        return over[min(len(over) - 1, int(p * len(over)))] if over else math.nan
    return {"green_context": use_green, "partition_sms": part, "lease_sms": lease_sms, "windows": len(ws),
            "utilisation": sum(r.busy_s for r in ws) / max(1e-9, sum(r.granted_s for r in ws)),
            "granted_sm_ms": granted_sm_ms, "used_sm_ms": used_sm_ms,
            "overrun_p50_ms": q(0.5), "overrun_p99_ms": q(0.99), "overrun_max_ms": over[-1] if over else math.nan,
            "overrun_p99_pct_of_period": over_pct[min(len(over_pct) - 1, int(0.99 * len(over_pct)))] if over_pct
            else math.nan,
            "samples": sum(r.samples for r in ws)}


def _cuda_events(torch, fn) -> list[str]:
    """Names of the CUDA-side events (kernels, copies, memsets) the profiler records while `fn()` runs."""
    from torch.profiler import ProfilerActivity, profile
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]


def cuda_activity(torch, fn) -> int:
    """Any device work at all while `fn()` runs."""
    return len(_cuda_events(torch, fn))


def cuda_kernels(torch, fn) -> int:
    """Kernels (SM work) while `fn()` runs; copies and memsets run on the copy engines and are not counted."""
    return sum(1 for name in _cuda_events(torch, fn) if not name.startswith(("Memcpy", "Memset")))


def _no_green_context(num_sms: int, device_id: int):
    raise RuntimeError("gpu_check: green contexts made unavailable")


def idle_device(torch, iterations: int = 5) -> dict:
    """Device work of a demoted agent's fallback loop and of a partition-less agent's leased loop."""
    import tempfile
    from dataclasses import replace

    from agent.config import tiny_cpu
    from agent.enforcer import LeaseTerms
    from agent.lease_client import LeaseGranted
    from agent.monitors import detect_device
    from agent.partition import GreenContextPool
    from agent.site_agent import SiteAgent
    facts = detect_device("cuda")
    base = tiny_cpu()
    with tempfile.TemporaryDirectory() as tmp:
        cfg = replace(base, device="cuda", checkpoint_dir=tmp, modes=replace(base.modes, mode="gpu_preferred"))
        demoted = SiteAgent(cfg, device=facts)
        t = demoted.trainer
        t.micro_batch(2)
        t.optimizer_step()
        t.micro_batch(2)               # optimizer state and pending gradients on the GPU, then demote
        demoted._apply_switch(demoted.modes._switch(demoted.clock(), "cpu_preferred", "gpu_check: demoted"))
        state = [v for st in t.optimizer.state.values() for v in st.values() if torch.is_tensor(v)]
        where = sorted({x.device.type for x in [*t.model.parameters(), *state]}
                       | {p.grad.device.type for p in t.model.parameters() if p.grad is not None})
        demoted_events = cuda_activity(torch, lambda: [demoted._fallback_iteration() for _ in range(iterations)])

        bare = SiteAgent(cfg, device=facts)
        bare.partitions = GreenContextPool(facts.sm_count, facts.granularity, enabled=True, create=_no_green_context)
        bare.client.send_release = lambda *a: True      # never started: nothing to send to
        lease = LeaseTerms("partitionless", max(1, facts.sm_count // 3), 0.05, 60.0, 1.0, bare.clock(), 1, 1)
        bare._handle([LeaseGranted(lease)])
        bare_events = cuda_activity(torch, lambda: [bare._leased_iteration() for _ in range(iterations)])
    return {"demoted_state_on": where, "demoted_cuda_events": demoted_events,
            "partitionless_refused": dict(bare.refused), "partitionless_cuda_events": bare_events,
            "ok": where == ["cpu"] and demoted_events == 0 and bare_events == 0 and bare.refused == {"refused": 1}}


def worker_contexts(sms: int) -> dict:
    """In a fresh process (this one has a primary context by now): agent.gpu_contexts' JSON."""
    import subprocess
    r = subprocess.run([sys.executable, "-m", "agent.gpu_contexts", "--sms", str(sms)], capture_output=True,
                       text=True, timeout=120)
    lines = r.stdout.strip().splitlines()
    return json.loads(lines[-1]) if lines else {"error": r.stderr[-500:]}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m agent.gpu_check", description=__doc__.split("\n")[0])
    p.add_argument("--seconds", type=float, default=100.0, help="rough total budget")
    p.add_argument("--lease-sms", type=int, default=64)
    p.add_argument("--json", help="also write the result here")
    p.add_argument("--allow-cpu", action="store_true", help="smoke-test the script on CPU")
    args = p.parse_args(argv)
    import torch

    from agent.trainer import Trainer
    cuda = torch.cuda.is_available()
    out: dict = {"check": "agent-gpu", "started_unix": time.time()}
    _section(out, "env", env_facts, torch)
    if not cuda and not args.allow_cpu:
        print(json.dumps(out, indent=2))
        print("gpu_check: no CUDA device (use --allow-cpu to smoke-test the script)", file=sys.stderr)
        return 2
    sms = out["env"].get("sm_count", 4)
    torch.manual_seed(0)
    torch.set_float32_matmul_precision("high")
    if not cuda:
        torch.set_num_threads(1)
    trainer = Trainer(gpu_model_config(cuda), device="cuda" if cuda else "cpu")
    out["model_params"] = trainer.model.num_params()
    timer = Timer(torch, cuda)
    if cuda:
        _section(out, "worker_contexts", worker_contexts, min(args.lease_sms, sms))
        _section(out, "idle_device", idle_device, torch)
    _section(out, "step_fit", step_fit, torch, trainer, timer, [1, 4, 16, 32, 64] if cuda else [1, 2, 4])
    green = out["env"].get("green_contexts", False)
    if green:
        _section(out, "green_switch", green_switch, torch, sms)
        _section(out, "sm_share", sm_share, torch, sms, min(1.0, args.seconds / 100))
    windows = max(20, int(args.seconds * 0.25 / 0.057)) if cuda else 20
    lease = min(args.lease_sms, sms)
    _section(out, "adherence_duty_cycle", adherence, torch, trainer, cuda, sms, False, windows, lease)
    if green:
        _section(out, "adherence_green_context", adherence, torch, trainer, cuda, sms, True, windows, lease)
    out["total_s"] = round(time.time() - out["started_unix"], 1)
    text = json.dumps(out, indent=2, default=str)
    print(text)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
