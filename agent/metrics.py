"""Prometheus text exposition of the agent's own measurements, on a localhost HTTP `/metrics`.

`render(agent)` is a pure formatting of what the agent already measured (status, recent lease
windows, NVML when present); `serve_metrics(agent, addr)` is the thin HTTP shell around it.
"""
from __future__ import annotations

import math
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from agent.monitors import NvmlSampler


def _q(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else math.nan


def render(agent, nvml: NvmlSampler | None = None) -> str:
    st = agent.status()
    windows = list(agent.window_reports)
    over = [w.overrun_s * 1e3 for w in windows]
    lines: list[str] = []

    def metric(name: str, kind: str, help_: str, value, labels: str = "") -> None:
        lines.append(f"# HELP weaver_agent_{name} {help_}")
        lines.append(f"# TYPE weaver_agent_{name} {kind}")
        lines.append(f"weaver_agent_{name}{labels} {float(value)!r}")

    site = f'{{site="{st.site_id}"}}'
    metric("step", "counter", "Optimizer steps applied.", st.step, site)
    metric("tokens_total", "counter", "Training tokens processed.", st.tokens, site)
    metric("tokens_per_second", "gauge", "Recent training throughput.", st.tokens_per_s, site)
    metric("loss", "gauge", "Last training loss.", st.loss, site)
    metric("val_loss", "gauge", "Last validation loss on the held-out slice.", st.val_loss, site)
    metric("connected", "gauge", "1 while the lease stream is up.", int(st.connected), site)
    metric("mode", "gauge", "Execution mode (label).", 1, f'{{site="{st.site_id}",mode="{st.mode}"}}')
    metric("lease_units", "gauge", "SMs (or cores) of the current lease; 0 = none.", st.lease.sm_count, site)
    metric("lease_remaining_ms", "gauge", "Validity left on the current lease.", st.lease_remaining_ms, site)
    metric("windows_total", "counter", "Lease windows closed (recent buffer).", len(windows), site)
    metric("granted_busy_ms_total", "counter", "Busy time granted over the recent windows.",
           sum(w.granted_s for w in windows) * 1e3, site)
    metric("used_busy_ms_total", "counter", "Busy time measured over the recent windows.",
           sum(w.busy_s for w in windows) * 1e3, site)
    for q in (0.5, 0.99):
        metric(f"overrun_ms_p{int(q * 100)}", "gauge", f"Overrun p{int(q * 100)} over recent windows.",
               _q(over, q), site)
    metric("overrun_ms_max", "gauge", "Largest overrun over recent windows.", max(over) if over else math.nan, site)
    # One family, a series per reason (both always present, so a rate() has a zero to start from).
    lines.append("# HELP weaver_agent_leases_refused_total Leases refused and not run: 'expired' (hard end "
                 "passed in transit), 'refused' (no partition within the lease).")
    lines.append("# TYPE weaver_agent_leases_refused_total counter")
    for reason in sorted({"expired", "refused"} | set(agent.refused)):
        lines.append(f'weaver_agent_leases_refused_total{{site="{st.site_id}",reason="{reason}"}} '
                     f"{float(agent.refused.get(reason, 0))!r}")
    metric("yield_latency_ms_max", "gauge", "Longest time from a revocation to idle.",
           max(agent.yield_latencies_ms) if agent.yield_latencies_ms else math.nan, site)
    sample = nvml.sample() if nvml is not None else None
    metric("nvml_available", "gauge", "1 when NVML answered.", int(sample is not None), site)
    if sample is not None:
        metric("gpu_util_percent", "gauge", "NVML device utilisation (any kernel running).", sample.gpu_util_pct, site)
        metric("gpu_mem_used_bytes", "gauge", "NVML device memory used.", sample.mem_used_bytes, site)
        metric("gpu_sm_clock_mhz", "gauge", "NVML SM clock.", sample.sm_clock_mhz, site)
        metric("gpu_throttle_reasons", "gauge", "NVML clock throttle reason bitmask.", sample.throttle_reasons, site)
        if sample.process_sm_util_pct is not None:
            metric("process_sm_util_percent", "gauge", "NVML SM utilisation of this process.",
                   sample.process_sm_util_pct, site)
    return "\n".join(lines) + "\n"


def serve_metrics(agent, addr: str = "127.0.0.1:0") -> tuple[ThreadingHTTPServer, str]:
    host, _, port = addr.rpartition(":")
    nvml = NvmlSampler()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (http.server's naming)
            if self.path.split("?")[0] != "/metrics":
                self.send_error(404, "only /metrics is served here")
                return
            body = render(agent, nvml).encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):   # keep the agent's log for the agent
            pass

    server = ThreadingHTTPServer((host, int(port)), Handler)
    threading.Thread(target=server.serve_forever, name="metrics", daemon=True).start()
    return server, f"{host}:{server.server_address[1]}"
