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
    assert doc["gc_policy"]["refreeze_every_periods"] >= 1
    assert "weaver bench xapp" in capsys.readouterr().out


def test_bench_replays_an_rmr_capture(tmp_path):
    """The `python -m xapp.rmr listen` line format, with another node naming scheme and sub_ids."""
    cfg = bench.make_config(3, meids=["gnb_a", "gnb_b", "gnb_c"])
    periods = bench.record(cfg, 4, 2, seed=1)
    cap = tmp_path / "capture.jsonl"
    with cap.open("w") as f:
        f.write('{"listening": 4560}\n')
        for period in periods:
            for sub_id, meid, payload in period:
                f.write(json.dumps({"mtype": 12050, "sub_id": sub_id + 40, "meid": meid,
                                    "payload": payload.hex()}) + "\n")
            f.write(json.dumps({"mtype": 12041, "sub_id": -1, "meid": "gnb_a", "payload": ""}) + "\n")
    p = argparse.ArgumentParser()
    bench.add_arguments(p)
    out = tmp_path / "r.json"
    assert bench.run(p.parse_args(["--recording", str(cap), "--json", str(out)])) == 0
    doc = json.loads(out.read_text())
    assert doc["source"] == str(cap) and doc["nodes"] == 3 and doc["arms"]["weaver"]["indications"] == 6


def test_reference_arm_decodes_with_asn1tools_only(monkeypatch):
    """The baseline arm (run under `_fast_kpm.declined()`) must not reach any fast reader: each one it missed
    would shrink the ratio the bench prints (the v3.00 header's v2.03 check once did: 4x fell to 2x)."""
    from e2sm import _asn1, _fast_kpm, kpm
    from e2sm.e2ap import decode_e2ap
    from e2sm.kpm import KpmVersion

    cfg = bench.make_config(1)
    _, _, payload = bench.record(cfg, 1, 1, seed=0)[0][0]
    ind = decode_e2ap(payload)
    calls = []
    real = _asn1.decode
    monkeypatch.setattr(_asn1, "decode", lambda *a, **k: calls.append(a[1]) or real(*a, **k))

    def decode():
        return (kpm.decode_indication_header(ind.header, KpmVersion.V3_00),
                kpm.decode_indication_message(ind.message, KpmVersion.V3_00))

    fast = decode()
    assert calls == []
    with _fast_kpm.declined():
        assert decode() == fast
    assert sorted(calls) == ["E2SM-KPM-IndicationHeader", "E2SM-KPM-IndicationHeader",
                             "E2SM-KPM-IndicationMessage"]   # the v3.00 header, its v2.03 check, the message
    calls.clear()
    assert decode() == fast and calls == []          # restored
