"""`weaver bench codecs` runs end to end through the CLI dispatcher and writes self-describing JSON.
(No timing assertions: rates depend on the machine; the bench itself reports ratios.)"""
from __future__ import annotations

import json
import subprocess


def test_bench_codecs_prints_a_table_and_writes_json(tmp_path, repo_root, xapp_python):
    out = tmp_path / "codecs.json"
    proc = subprocess.run([str(xapp_python), "-m", "testbed.cli", "bench", "codecs", "--seconds", "0.3",
                           "--json", str(out)], cwd=repo_root, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "decode_full_indication" in proc.stdout and "speedup" in proc.stdout
    result = json.loads(out.read_text())
    assert result["exact"] is True
    assert result["full_indication_bytes"] > result["kpm_message_bytes"] > 500    # 10 x 10 records
    for key in ("decode_full_indication_per_s", "baseline_decode_full_indication_per_s",
                "decode_speedup_vs_baseline", "decode_kpm_message_per_s", "baseline_decode_kpm_message_per_s",
                "encode_full_indication_per_s", "encode_speedup_vs_baseline"):
        assert result[key] > 0, key
    assert isinstance(result["kpm_fast_path_engaged"], bool)


def test_bench_codecs_refuses_a_bad_duration(repo_root, xapp_python):
    proc = subprocess.run([str(xapp_python), "-m", "testbed.cli", "bench", "codecs", "--seconds", "0"],
                          cwd=repo_root, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "--seconds" in proc.stderr
