"""E2AP vectors through `python -m e2sm` (a real subprocess per call), as operators read captured PDUs."""
from __future__ import annotations

import json
import subprocess


def run(xapp_python, repo_root, *args, stdin=""):
    return subprocess.run([str(xapp_python), "-m", "e2sm", *args], input=stdin, capture_output=True, text=True,
                          cwd=repo_root, timeout=60)


def test_every_e2ap_vector_decodes_and_encodes_through_the_cli(xapp_python, repo_root, vectors_dir):
    vectors = [json.loads(p.read_text()) for p in sorted(vectors_dir.glob("e2ap_*.json"))]
    assert len(vectors) >= 3
    for v in vectors:
        dec = run(xapp_python, repo_root, "decode", "e2ap:E2AP-PDU", v["hex"])
        assert dec.returncode == 0, dec.stderr
        assert json.loads(dec.stdout) == v["decoded"], v["name"]
        enc = run(xapp_python, repo_root, "encode", "e2ap:E2AP-PDU", stdin=json.dumps(v["decoded"]))
        assert enc.returncode == 0, enc.stderr
        assert enc.stdout.strip() == v["hex"], v["name"]


def test_bad_e2ap_input_is_a_one_line_error(xapp_python, repo_root, vectors_dir):
    v = json.loads((vectors_dir / "e2ap_ric_indication.json").read_text())
    truncated = run(xapp_python, repo_root, "decode", "e2ap:E2AP-PDU", v["hex"][:-10])
    assert truncated.returncode != 0 and "E2AP" in truncated.stderr and "Traceback" not in truncated.stderr
    bad = json.loads(json.dumps(v["decoded"]))
    bad["initiatingMessage"]["procedureCode"] = 3
    refused = run(xapp_python, repo_root, "encode", "e2ap:E2AP-PDU", stdin=json.dumps(bad))
    assert refused.returncode != 0 and "Traceback" not in refused.stderr
