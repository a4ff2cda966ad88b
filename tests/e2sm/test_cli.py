"""`python -m e2sm` as operators run it: a real subprocess per call, vectors in and out."""
from __future__ import annotations

import json
import subprocess

import pytest

E2SM_PREFIXES = ("kpm-v2.03:", "kpm-v3.00:", "rc-v1.03:")


def run(xapp_python, repo_root, *args, stdin=""):
    return subprocess.run(
        [str(xapp_python), "-m", "e2sm", *args],
        input=stdin,
        capture_output=True,
        text=True,
        cwd=repo_root,
        timeout=60,
    )


def e2sm_vectors(vectors_dir):
    out = []
    for path in sorted(vectors_dir.glob("*.json")):
        v = json.loads(path.read_text())
        if v["kind"].startswith(E2SM_PREFIXES):
            out.append(v)
    return out


def test_every_e2sm_vector_decodes_and_encodes_through_the_cli(xapp_python, repo_root, vectors_dir):
    vectors = e2sm_vectors(vectors_dir)
    assert vectors
    for v in vectors:
        dec = run(xapp_python, repo_root, "decode", v["kind"], v["hex"])
        assert dec.returncode == 0, dec.stderr
        assert json.loads(dec.stdout) == v["decoded"], v["name"]
        enc = run(xapp_python, repo_root, "encode", v["kind"], stdin=json.dumps(v["decoded"]))
        assert enc.returncode == 0, enc.stderr
        assert enc.stdout.strip() == v["hex"], v["name"]


def test_kinds_lists_every_module(xapp_python, repo_root):
    out = run(xapp_python, repo_root, "kinds")
    assert out.returncode == 0
    kinds = out.stdout.split()
    assert "e2ap:E2AP-PDU" in kinds
    assert "kpm-v2.03:E2SM-KPM-IndicationHeader" in kinds
    assert "kpm-v3.00:E2SM-KPM-RANfunction-Description" in kinds
    assert "rc-v1.03:E2SM-RC-ControlOutcome" in kinds
    assert "rc-v1.03:E2SM-RC-RANFunctionDefinition" in kinds


def test_decode_reads_hex_from_stdin_with_spaces(xapp_python, repo_root):
    out = run(xapp_python, repo_root, "decode", "kpm-v3.00:E2SM-KPM-EventTriggerDefinition", "-", stdin="00 63\n")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == {"eventDefinition-formats": {"eventDefinition-Format1": {"reportingPeriod": 100}}}


@pytest.mark.parametrize(
    ("args", "stdin", "needle"),
    [
        (("decode", "kpm-v3.00:E2SM-KPM-IndicationMessage", "zz"), "", "not hex"),
        (("decode", "kpm-v3.00:E2SM-KPM-IndicationMessage", "ffffffff"), "", "E2SM-KPM-IndicationMessage"),
        (("decode", "no-such:Kind", "00"), "", "unknown kind"),
        # The v3.00 header vector read with v2.03 definitions must fail and say why.
        (
            ("decode", "kpm-v2.03:E2SM-KPM-IndicationHeader", "0eeb1f040000000000000009676e622d73696d2d3130674e422d44550e6578616d706c65"),
            "",
            "version mismatch",
        ),
        (("encode", "rc-v1.03:E2SM-RC-ControlHeader"), "{not json", "not JSON"),
        (("encode", "rc-v1.03:E2SM-RC-ControlHeader"), '{"bogus": 1}', "bogus"),
        (("encode", "kpm-v3.00:E2SM-KPM-EventTriggerDefinition"),
         '{"eventDefinition-formats": {"eventDefinition-Format1": {"reportingPeriod": 0}}}', "reportingPeriod"),
    ],
)
def test_bad_input_goes_to_stderr_with_nonzero_exit(xapp_python, repo_root, args, stdin, needle):
    out = run(xapp_python, repo_root, *args, stdin=stdin)
    assert out.returncode != 0
    assert out.stdout == ""
    assert needle in out.stderr
    assert "Traceback" not in out.stderr


def test_usage_error_exits_nonzero(xapp_python, repo_root):
    out = run(xapp_python, repo_root, "frobnicate")
    assert out.returncode == 2
    assert "usage" in out.stderr
