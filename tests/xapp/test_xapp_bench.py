"""`weaver bench xapp` runs end to end on a small recording and writes self-describing JSON."""
from __future__ import annotations

import argparse
import json

from xapp import bench


def test_bench_smoke(tmp_path, capsys):
    p = argparse.ArgumentParser()
    bench.add_arguments(p)
    out = tmp_path / "b.json"
    assert bench.run(p.parse_args(["--cells", "40", "--periods", "2", "--json", str(out)])) == 0
    doc = json.loads(out.read_text())
    assert doc["cells"] == 40 and doc["arms"]["weaver"]["indications"] == 20
    for arm in ("weaver", "reference"):
        for key in ("p50_ms", "p99_ms", "indications_per_s", "wall_p99_ms", "controls_encoded"):
            assert doc["arms"][arm][key] >= 0
    assert doc["bottleneck"] and "speedup_vs_reference" in doc
    assert "weaver bench xapp" in capsys.readouterr().out
