"""Invariant: any bytes given to any E2SM decoder either decode to a value or raise E2DecodeError -
never another exception, never a hang.

Inputs: every truncation of every E2SM vector (and of typed samples for kinds without a vector),
random bytes, and mutated vectors (bit flips, inserted, deleted and overwritten octets)."""
from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import e2sm
from e2sm import _asn1, kpm, rc

V2, V3 = kpm.KpmVersion.V2_03, kpm.KpmVersion.V3_00


def _typed_decoders():
    out = {}
    for v in (V2, V3):
        for name in ("event_trigger", "action_definition", "indication_header", "indication_message",
                     "ran_function_description"):
            fn = getattr(kpm, f"decode_{name}")
            out[f"kpm.decode_{name}[{v.module}]"] = lambda data, fn=fn, v=v: fn(data, v)
    for name in ("control_header", "control_message", "control_outcome", "ran_function_definition"):
        out[f"rc.decode_{name}"] = getattr(rc, f"decode_{name}")
    for kind in e2sm.kinds():
        if not kind.startswith("e2ap:"):
            out[f"decode_json[{kind}]"] = lambda data, kind=kind: e2sm.decode_json(kind, data)
    return out


DECODERS = _typed_decoders()


def _samples() -> list[bytes]:
    """Valid encodings of the kinds the vectors do not cover."""
    desc = kpm.KpmRanFunctionDescription(
        report_styles=(kpm.KpmReportStyle(1, "E2 Node Measurement", 1, (kpm.ReportableMeas("RRU.PrbTotDl"),
                                                                        kpm.ReportableMeas("DRB.UEThpDl", 7))),)
    )
    slice_label = kpm.MeasLabel(kpm.Snssai(1, 0x000001))
    fmt3 = kpm.IndicationMessageFormat3(
        (kpm.UeMeasReport(rc.GnbDuUeId(7), kpm.IndicationMessageFormat1(((1, None, 2.5),),
                                                                        (kpm.MeasInfo("a", (slice_label,)),) * 3)),)
    )
    return [
        kpm.encode_ran_function_description(desc, V3),
        kpm.encode_indication_message(fmt3, V3),
        kpm.encode_indication_header(kpm.KpmIndicationHeader(0xEB1F0400, "1.0", "gnb", "DU", "x"), V2),
        rc.encode_ran_function_definition(rc.node_ran_function_definition()),
        rc.encode_control_outcome(rc.RcControlOutcome(((1, 100), (11, 10), (12, 60)))),
        rc.encode_control_message(rc.build_prb_quota_control([rc.SliceQuota(sd=1)], rc.OAI_GNB_IDS)),
    ]


def _e2sm_vector_bytes(vectors_dir) -> list[bytes]:
    """The E2SM payloads of tests/vectors/ and of tests/vectors/independent/ (pycrate's: every KPM format,
    the conditions with logicalOR, bin ranges, per-period UE lists)."""
    out = []
    for path in sorted(vectors_dir.glob("*.json")) + sorted((vectors_dir / "independent").glob("*.json")):
        v = json.loads(path.read_text())
        if not v["kind"].startswith("e2ap:"):
            out.append(bytes.fromhex(v["hex"]))
    return out


@pytest.fixture(scope="module")
def corpus(vectors_dir) -> list[bytes]:
    return _e2sm_vector_bytes(vectors_dir) + _samples()


def assert_value_or_decode_error(data: bytes) -> None:
    for name, decode in DECODERS.items():
        try:
            decode(data)
        except e2sm.E2DecodeError:
            pass
        except Exception as exc:  # pragma: no cover - this is the failure being tested for
            raise AssertionError(f"{name} raised {type(exc).__name__}: {exc} on {data.hex()}") from exc


def test_every_truncation_of_every_payload(corpus):
    for data in corpus:
        for n in range(len(data)):
            assert_value_or_decode_error(data[:n])


def test_decoders_refuse_trailing_bytes(corpus):
    for data in corpus:
        for extra in (b"\x00", b"\xff\xff"):
            with pytest.raises(e2sm.E2DecodeError):
                e2sm.decode_json(_kind_of(data), data + extra)


def _kind_of(data: bytes) -> str:
    for kind in e2sm.kinds():
        if kind.startswith("e2ap:"):
            continue
        try:
            e2sm.decode_json(kind, data)
            return kind
        except e2sm.E2DecodeError:
            continue
    raise AssertionError(f"no kind decodes {data.hex()}")


FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FUZZ
@given(data=st.binary(min_size=0, max_size=200))
def test_random_bytes(data):
    assert_value_or_decode_error(data)


@st.composite
def mutation(draw, seeds):
    data = bytearray(draw(st.sampled_from(seeds)))
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["flip", "set", "insert", "delete"]))
        pos = draw(st.integers(0, max(len(data) - 1, 0)))
        if op == "flip" and data:
            data[pos] ^= 1 << draw(st.integers(0, 7))
        elif op == "set" and data:
            data[pos] = draw(st.sampled_from([0x00, 0x7F, 0x80, 0xFF, draw(st.integers(0, 255))]))
        elif op == "insert":
            data[pos:pos] = draw(st.binary(min_size=1, max_size=4))
        elif op == "delete" and data:
            del data[pos]
    return bytes(data)


def test_mutated_payloads(vectors_dir):
    seeds = _e2sm_vector_bytes(vectors_dir) + _samples()

    @FUZZ
    @given(data=mutation(seeds))
    def run(data):
        assert_value_or_decode_error(data)

    run()


def test_hostile_sizes_are_bounded():
    # Over the cap: refused before decoding.
    with pytest.raises(e2sm.E2DecodeError, match="cap"):
        kpm.decode_indication_message(b"\x00" * (_asn1.MAX_PAYLOAD + 1), V3)
    # A full-size input whose record list claims 64K-item fragments of 3-bit noValue items: the
    # decoder works through at most the cap's worth of bits, then fails with a decode error.
    head = bytes.fromhex("00000000c4")
    claim = head + bytes.fromhex("492492") * ((_asn1.MAX_PAYLOAD - len(head)) // 3)
    with pytest.raises(e2sm.E2DecodeError):
        kpm.decode_indication_message(claim, V3)
    # Not bytes at all.
    with pytest.raises(e2sm.E2DecodeError):
        rc.decode_control_message("0100")  # type: ignore[arg-type]
    with pytest.raises(e2sm.E2DecodeError):
        e2sm.decode_json("kpm-v3.00:E2SM-KPM-IndicationMessage", b"")


def test_deep_rc_nesting_is_an_error_not_a_crash():
    # A tree deeper than MAX_TREE_DEPTH that asn1tools still decodes: our depth cap refuses it.
    inner: rc.RanParam = rc.RanParamElement(1, 1)
    for _ in range(40):
        inner = rc.RanParamStructure(2, (inner,))
    data = rc.encode_control_message(rc.RcControlMessage((inner,)))
    with pytest.raises(e2sm.E2DecodeError, match="deeper"):
        rc.decode_control_message(data)
    # Structure-in-structure 3000 deep on the wire: Python's recursion limit, reported as an error.
    nested = bytes.fromhex("000001") + bytes.fromhex("0001440000") * 3000 + bytes.fromhex("000028800101")
    with pytest.raises(e2sm.E2DecodeError, match="too deep"):
        rc.decode_control_message(nested)
    with pytest.raises(e2sm.E2DecodeError, match="too deep"):
        e2sm.decode_json("rc-v1.03:E2SM-RC-ControlMessage", nested)


def test_non_zero_final_padding_is_refused():
    msg = kpm.IndicationMessageFormat1(((None, None),))
    data = kpm.encode_indication_message(msg, V3)
    assert data[-1] & 0x03 == 0  # two 3-bit noValue items leave two padding bits
    assert kpm.decode_indication_message(data, V3) == msg
    bad = data[:-1] + bytes([data[-1] | 0x01])
    with pytest.raises(e2sm.E2DecodeError, match="padding"):
        kpm.decode_indication_message(bad, V3)
    with pytest.raises(e2sm.E2DecodeError, match="padding"):
        e2sm.decode_json("kpm-v3.00:E2SM-KPM-IndicationMessage", bad)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(1 << 70), 1 << 70) | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=12), inner, max_size=3),
    max_leaves=10,
)


def _leaf_paths(node, path=()):
    if isinstance(node, dict) and node:
        for k, v in node.items():
            yield from _leaf_paths(v, path + (k,))
    elif isinstance(node, list) and node:
        for i, v in enumerate(node):
            yield from _leaf_paths(v, path + (i,))
    else:
        yield path


def _replace(node, path, value):
    if not path:
        return value
    copy = dict(node) if isinstance(node, dict) else list(node)
    copy[path[0]] = _replace(node[path[0]], path[1:], value)
    return copy


def assert_bytes_or_encode_error(kind, value):
    try:
        data = e2sm.encode_json(kind, value)
    except e2sm.E2EncodeError:
        return
    except Exception as exc:  # pragma: no cover - the failure being tested for
        raise AssertionError(f"encode_json({kind}) raised {type(exc).__name__}: {exc} on {value!r}") from exc
    assert isinstance(data, bytes)


@FUZZ
@given(value=json_values, kind=st.sampled_from([k for k in e2sm.kinds() if not k.startswith("e2ap:")]))
def test_encode_json_refuses_garbage_with_encode_error(value, kind):
    assert_bytes_or_encode_error(kind, value)


def test_encode_json_refuses_each_leaf_of_a_vector_replaced_by_garbage(vectors_dir):
    garbage = [None, True, -1, 1 << 64, 1.5, "zz", "", [], {}, {"x": 1}]
    for path in sorted(vectors_dir.glob("*.json")):
        v = json.loads(path.read_text())
        if v["kind"].startswith("e2ap:"):
            continue
        for leaf in _leaf_paths(v["decoded"]):
            for g in garbage:
                assert_bytes_or_encode_error(v["kind"], _replace(v["decoded"], leaf, g))


def test_typed_encoders_refuse_wrong_objects():
    # A value of the wrong type is refused when built (ValueError) or when encoded (E2EncodeError);
    # no AttributeError from deep inside, and nothing is silently dropped.
    f1 = kpm.ActionDefFormat1((kpm.MeasInfo("a"),), 100)
    builds = [
        lambda: kpm.ActionDefFormat2("ue", f1),
        lambda: kpm.ActionDefFormat4((kpm.TestCond("gBR"),), None),
        lambda: kpm.ActionDefFormat5((1, 2), f1),
        lambda: kpm.UeMeasReport("ue", kpm.IndicationMessageFormat1(((1,),))),
        lambda: kpm.MeasLabel(other=(("bogus", 1),)),
        lambda: kpm.KpmRanFunctionDescription(report_styles=("x",)),
        lambda: rc.RcControlHeader(2, 6, "ue"),
        lambda: rc.RcControlStyle(2, "n", ("a",)),
        lambda: rc.RcRanFunctionDefinition(control_styles=("x",)),
    ]
    for build in builds:
        with pytest.raises(ValueError):
            build()
    encodes = [
        lambda: kpm.encode_event_trigger("x", V3),
        lambda: kpm.encode_indication_header(kpm.KpmIndicationHeader(0), "kpm-v3.00"),
        lambda: kpm.encode_indication_message("x", V3),
        lambda: kpm.encode_action_definition(kpm.KpmActionDefinition(4, kpm.ActionDefFormat4((kpm.TestCond("nope"),), f1)), V3),
        lambda: rc.encode_control_message("x"),
        lambda: rc.encode_control_outcome(rc.RcControlMessage(())),
        lambda: rc.encode_ran_function_definition(rc.RcRanFunctionDefinition(other_sections=(("ranFunctionDefinition-Report", 5),))),
    ]
    for encode in encodes:
        with pytest.raises(e2sm.E2EncodeError):
            encode()


def test_an_extended_size_sender_type_is_a_decode_error_not_a_value_error():
    # hypothesis found it: asn1tools accepts senderType beyond SIZE(0..8) through the extension marker,
    # and the typed header's constructor then raised ValueError out of the decoder
    from e2sm import E2DecodeError
    from e2sm.kpm import KpmVersion, decode_indication_header

    raw = bytes.fromhex("0eeb1f040000000000000001676e2d73696d2d3130674e422d44550e6578616d706c65")
    with pytest.raises(E2DecodeError, match="senderType"):
        decode_indication_header(raw, KpmVersion.V3_00)


@pytest.mark.parametrize("bound", [float("inf"), float("-inf"), float("nan")])
def test_a_non_finite_bin_bound_is_a_decode_error(bound):
    # REAL carries +-infinity and NaN; a bin range bound that is not a number must not reach the typed value.
    bins = {"binRangeListX": [{"binIndex": 1, "startValue": ("valueReal", 0.5), "endValue": ("valueReal", bound)}]}
    value = {"ranFunction-Name": {"ranFunction-ShortName": "ORAN-E2SM-KPM", "ranFunction-E2SM-OID": kpm.KPM_OID_V3,
                                  "ranFunction-Description": "KPM Monitor"},
             "ric-ReportStyle-List": [{"ric-ReportStyle-Type": 1, "ric-ReportStyle-Name": "x", "ric-ActionFormat-Type": 1,
                                       "measInfo-Action-List": [{"measName": "a", "binRangeDef": bins}],
                                       "ric-IndicationHeaderFormat-Type": 1, "ric-IndicationMessageFormat-Type": 1}]}
    data = _asn1.encode("kpm-v3.00", "E2SM-KPM-RANfunction-Description", value)
    with pytest.raises(e2sm.E2DecodeError, match="finite"):
        kpm.decode_ran_function_description(data, V3)
