"""Ingest: real KPM indications in, KpmSample out; every kind of bad input is a counted IngestError."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kpm_bytes import indication

from e2sm.kpm import KpmVersion
from xapp.ingest import Ingest, IngestError, KpmSubscription

V3 = KpmVersion.V3_00
KEYS = ("RRU.PrbUsedDl", "GPU.SmUsed.Mean", "GPU.SmUsed.Max", "GPU.DeadlineMiss", "RRU.PrbUsedDl@1:1")


def ingest(version=V3):
    i = Ingest()
    i.add(KpmSubscription(41, "gnb-a", 2, version, KEYS))
    return i


def test_values_fold_over_records_by_kind():
    payload = indication({"RRU.PrbUsedDl": [100, 50], "GPU.SmUsed.Mean": [20.0, 30.0], "GPU.SmUsed.Max": [40, 70],
                          "GPU.DeadlineMiss": [1, 2], "RRU.PrbUsedDl@1:1": [10, None]})
    s = ingest().indication(41, "gnb-a", payload, now=5.0)
    assert s.meid == "gnb-a" and s.received == 5.0 and s.sn == 1
    assert s.values == {"RRU.PrbUsedDl": 75.0, "GPU.SmUsed.Mean": 25.0, "GPU.SmUsed.Max": 70.0,
                        "GPU.DeadlineMiss": 3.0, "RRU.PrbUsedDl@1:1": 10.0}


def test_names_from_the_action_definition_when_meas_info_is_absent():
    payload = indication({k: [i] for i, k in enumerate(KEYS)}, with_info=False)
    s = ingest().indication(41, "gnb-a", payload, now=0)
    assert s.values["GPU.SmUsed.Max"] == 2.0 and s.values["RRU.PrbUsedDl@1:1"] == 4.0


def test_v2_node():
    payload = indication({"RRU.PrbUsedDl": [7]}, version=KpmVersion.V2_03)
    assert ingest(KpmVersion.V2_03).indication(41, "gnb-a", payload, 0).values == {"RRU.PrbUsedDl": 7.0}


@pytest.mark.parametrize("sub_id, meid, payload, kind", [
    (99, "gnb-a", None, "unknown-subscription"),
    (41, "gnb-evil", None, "unknown-node"),
    (41, "gnb-a", b"\x00\x05garbage", "e2ap"),
    (41, "gnb-a", b"", "e2ap"),
    (41, "gnb-a", "v2-bytes-to-v3-node", "e2sm"),
    (41, "gnb-a", "other-function", "unknown-subscription"),
    (41, "gnb-a", "short-records", "shape"),
])
def test_bad_input_is_refused_and_counted(sub_id, meid, payload, kind):
    good = indication({"RRU.PrbUsedDl": [1]})
    payload = {None: good, "v2-bytes-to-v3-node": indication({"RRU.PrbUsedDl": [1]}, version=KpmVersion.V2_03,
                                                             t=0x12345678),
               "other-function": indication({"RRU.PrbUsedDl": [1]}, ran_function_id=3),
               "short-records": indication({"RRU.PrbUsedDl": [1]}, with_info=False)}.get(payload, payload)
    ing = ingest()
    with pytest.raises(IngestError) as ei:
        ing.indication(sub_id, meid, payload, 0)
    assert ei.value.kind == kind and ing.errors == {kind: 1} and ing.accepted == 0
    assert ing.indication(41, "gnb-a", good, 0).values == {"RRU.PrbUsedDl": 1.0}   # nothing else changed


@settings(max_examples=150, deadline=None)
@given(st.binary(max_size=200))
def test_fuzz_any_bytes_give_a_sample_or_an_ingest_error(data):
    ing = ingest()
    try:
        ing.indication(41, "gnb-a", data, 0)
    except IngestError:
        pass


@settings(max_examples=150, deadline=None)
@given(st.integers(0, 400), st.integers(0, 255))
def test_fuzz_mutated_real_indications(pos, byte):
    good = bytearray(indication({"RRU.PrbUsedDl": [1, 2], "GPU.SmUsed.Max": [3, 4]}))
    good[pos % len(good)] = byte
    try:
        ingest().indication(41, "gnb-a", bytes(good), 0)
    except IngestError:
        pass


def _fold_by_definition(records, keys):
    """The fold as docs/contracts.md states it: per key over its present values, max for *.Max, sum for
    the summed counters, mean otherwise (Python's sum and max, so -0.0 folds as they fold it)."""
    from xapp.ingest import SUMMED
    out = {}
    for i, key in enumerate(keys):
        vals = [float(r[i]) for r in records if i < len(r) and r[i] is not None]
        if vals:
            out[key] = (max(vals) if key.endswith(".Max") or ".Max@" in key
                        else sum(vals) if key.split("@")[0] in SUMMED else sum(vals) / len(vals))
    return out


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(st.none() | st.integers(0, 1 << 32) | st.sampled_from([0.0, -0.0, 2.5, 1e300]),
                         min_size=len(KEYS), max_size=len(KEYS)).map(tuple), min_size=1, max_size=4).map(tuple))
def test_fold_paths_agree_with_the_definition(records):
    from xapp.ingest import fold
    got, want = fold(records, KEYS), _fold_by_definition(records, KEYS)
    assert repr(got) == repr(want)
