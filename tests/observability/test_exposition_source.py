"""No hand-written Prometheus exposition in the products or the testbed: prometheus_client writes every
`# HELP` / `# TYPE` line and picks the content type (xapp.metrics, agent.metrics)."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# what writing the text format by hand takes: its comment lines, or its content type
HANDWRITTEN = re.compile(r"""["'f]# (HELP|TYPE) |version=0\.0\.4|text/plain; version=""")


def test_no_hand_written_prometheus_text():
    found = [f"{p.relative_to(ROOT)}:{n}: {line.strip()}"
             for pkg in ("xapp", "agent", "testbed", "e2sm")
             for p in sorted((ROOT / pkg).rglob("*.py"))
             for n, line in enumerate(p.read_text(errors="replace").splitlines(), 1) if HANDWRITTEN.search(line)]
    assert not found, "\n".join(found)
