"""The agent's Prometheus metrics, on `prometheus_client`, served on a localhost HTTP `/metrics`.

`AgentMetrics` (one per `SiteAgent`, its own registry) holds what only exists as it happens: the
histograms of lease grant -> first launch, revocation/expiry -> idle, and each lease window's overrun,
plus running totals of the closed windows. The agent's levels (status, recent windows, NVML) are read
when Prometheus scrapes (`_AgentCollector`, the library's custom-collector pattern), so the agent keeps
each number in one place. `render(agent)` is the exposition as text; `serve_metrics(agent, addr)` the
HTTP shell around the library's WSGI app.

All families carry `site`; docs/contracts.md lists them and docker/grafana/weaver.json reads them.
"""
from __future__ import annotations

import math
import threading
from socketserver import ThreadingMixIn
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Histogram,
    disable_created_metrics,
    generate_latest,
    make_wsgi_app,
)
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily

from agent.monitors import NvmlSampler

disable_created_metrics()     # no `*_created` twin of every counter and histogram

# Seconds. A lease period is 10 ms - 1 s; the first launch waits for the enforcer's plan and, on the
# first lease, the warm-up; going idle waits for the micro-batch in flight (kept short at the edge).
LAUNCH_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
YIELD_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
# An overrun of 0 is the common, wanted case: its own bucket.
OVERRUN_BUCKETS = (0.0, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)


def yield_histogram(registry: CollectorRegistry, idle: str) -> Histogram:
    return Histogram(
        "weaver_agent_yield_seconds",
        f"Lease end -> {idle}, by cause: revoked (from the revocation's arrival), expired (from the hard end), "
        "disconnected (from the stream's loss).", ("site", "cause"), buckets=YIELD_BUCKETS, registry=registry)


class AgentMetrics:
    """The agent's observed distributions. The agent calls the hooks; times are the agent's clock."""

    def __init__(self, site_id: str, yields: bool = True) -> None:
        """`yields` False: a confined worker's, whose lease ends are its supervisor's to measure (the kernel
        freezes it at once; agent.supervisor exports weaver_agent_yield_seconds instead)."""
        self.site_id = site_id
        self.registry = CollectorRegistry()
        r, site = self.registry, ("site",)
        self.first_launch = Histogram(
            "weaver_agent_lease_first_launch_seconds",
            "A lease received while idle -> the first launch under it (includes the warm-up on the first lease).",
            site, buckets=LAUNCH_BUCKETS, registry=r).labels(site_id)
        self.yield_seconds = yield_histogram(r, "the agent idle") if yields else None
        self.overrun = Histogram(
            "weaver_agent_overrun_seconds",
            "Overrun of each closed lease window: busy time above its grant, or the last micro-batch's work past "
            "the window's or the lease's end.", site, buckets=OVERRUN_BUCKETS, registry=r).labels(site_id)
        self.windows = Counter("weaver_agent_windows_total", "Lease windows closed.", site, registry=r).labels(site_id)
        self.granted_ms = Counter("weaver_agent_granted_busy_ms_total", "Busy time granted over the closed windows, ms.",
                                  site, registry=r).labels(site_id)
        self.used_ms = Counter("weaver_agent_used_busy_ms_total", "Busy time measured over the closed windows, ms.",
                               site, registry=r).labels(site_id)
        self._lock = threading.Lock()
        self._idle_since: float | None = None     # a lease received while idle, no launch yet
        self._holding = False

    def lease_started(self, received_at: float) -> None:
        """A lease was adopted (renewals too: only the first of an unbroken chain starts the clock)."""
        with self._lock:
            if not self._holding:
                self._holding, self._idle_since = True, received_at

    def launched(self, at: float) -> None:
        with self._lock:
            if self._idle_since is not None:
                self.first_launch.observe(max(0.0, at - self._idle_since))
                self._idle_since = None

    def lease_ended(self, cause: str, to_idle_s: float) -> None:
        with self._lock:
            self._holding, self._idle_since = False, None
        if self.yield_seconds is not None:
            self.yield_seconds.labels(self.site_id, cause).observe(max(0.0, to_idle_s))

    def window_closed(self, report) -> None:
        """An `agent.enforcer.WindowReport`."""
        self.overrun.observe(max(0.0, report.overrun_s))
        self.windows.inc()
        self.granted_ms.inc(max(0.0, report.granted_s) * 1e3)
        self.used_ms.inc(max(0.0, report.busy_s) * 1e3)


def _q(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else math.nan


class _AgentCollector:
    """The agent's levels, read at scrape time."""

    def __init__(self, agent, nvml: NvmlSampler | None) -> None:
        self.agent, self.nvml = agent, nvml

    def collect(self):
        agent = self.agent
        st = agent.status()
        site = st.site_id

        def gauge(name: str, help_: str, value, **labels) -> GaugeMetricFamily:
            g = GaugeMetricFamily(f"weaver_agent_{name}", help_, labels=["site", *labels])
            g.add_metric([site, *labels.values()], float(value))
            return g

        over = [w.overrun_s * 1e3 for w in list(agent.window_reports)]
        yield gauge("step", "The optimizer step the trainer is at (it resumes from checkpoints).", st.step)
        tokens = CounterMetricFamily("weaver_agent_tokens", "Training tokens processed.", labels=["site"])
        tokens.add_metric([site], float(st.tokens))
        yield tokens
        yield gauge("tokens_per_second", "Recent training throughput.", st.tokens_per_s)
        yield gauge("loss", "Last training loss.", st.loss)
        yield gauge("val_loss", "Last validation loss on the held-out slice.", st.val_loss)
        yield gauge("connected", "1 while the lease stream is up.", int(st.connected))
        yield gauge("mode", "Execution mode (label).", 1, mode=st.mode)
        yield gauge("lease_units", "SMs (or cores) of the current lease; 0 = none.", st.lease.sm_count)
        yield gauge("lease_remaining_ms", "Validity left on the current lease.", st.lease_remaining_ms)
        for q in (0.5, 0.99):
            yield gauge(f"overrun_ms_p{int(q * 100)}", f"Overrun p{int(q * 100)} over the recent windows, ms.",
                        _q(over, q))
        yield gauge("overrun_ms_max", "Largest overrun over the recent windows, ms.", max(over) if over else math.nan)
        # both reasons always present, so a rate() has a zero to start from
        refused = CounterMetricFamily(
            "weaver_agent_leases_refused", "Leases refused and not run: 'expired' (hard end passed in transit), "
            "'refused' (no partition within the lease).", labels=["site", "reason"])
        for reason in sorted({"expired", "refused"} | set(agent.refused)):
            refused.add_metric([site, reason], float(agent.refused.get(reason, 0)))
        yield refused
        lat = list(agent.yield_latencies_ms)
        yield gauge("yield_latency_ms_max", "Longest time from a revocation to idle over the recent ones, ms.",
                    max(lat) if lat else math.nan)
        sample = self.nvml.sample() if self.nvml is not None else None
        yield gauge("nvml_available", "1 when NVML answered.", int(sample is not None))
        if sample is not None:
            yield gauge("gpu_util_percent", "NVML device utilisation (any kernel running).", sample.gpu_util_pct)
            yield gauge("gpu_mem_used_bytes", "NVML device memory used.", sample.mem_used_bytes)
            yield gauge("gpu_sm_clock_mhz", "NVML SM clock.", sample.sm_clock_mhz)
            yield gauge("gpu_throttle_reasons", "NVML clock throttle reason bitmask.", sample.throttle_reasons)
            if sample.process_sm_util_pct is not None:
                yield gauge("process_sm_util_percent", "NVML SM utilisation of this process.",
                            sample.process_sm_util_pct)


def registry_for(agent, nvml: NvmlSampler | None = None) -> CollectorRegistry:
    """The agent's histograms and totals (`agent.metrics`) and its levels, in one registry."""
    reg = CollectorRegistry()
    reg.register(_AgentCollector(agent, nvml))
    if getattr(agent, "metrics", None) is not None:
        reg.register(agent.metrics.registry)       # a registry is a collector too
    return reg


def render(agent, nvml: NvmlSampler | None = None) -> str:
    return generate_latest(registry_for(agent, nvml)).decode()


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _Quiet(WSGIRequestHandler):
    def log_message(self, *args):   # keep the agent's log for the agent
        pass


def serve_metrics(agent, addr: str = "127.0.0.1:0") -> tuple[WSGIServer, str]:
    """Serve `/metrics` (and only that: any other path is a 404) on `addr` from a daemon thread."""
    host, _, port = addr.rpartition(":")
    exposition = make_wsgi_app(registry_for(agent, NvmlSampler()))

    def app(environ, start_response):
        if environ.get("PATH_INFO") != "/metrics":
            start_response("404 Not Found", [("Content-Type", "text/plain; charset=utf-8")])
            return [b"only /metrics is served here\n"]
        return exposition(environ, start_response)

    server = make_server(host, int(port), app, server_class=_Server, handler_class=_Quiet)
    threading.Thread(target=server.serve_forever, name="metrics", daemon=True).start()
    return server, f"{host}:{server.server_address[1]}"
