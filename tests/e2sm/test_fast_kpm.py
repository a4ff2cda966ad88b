"""The hand-written KPM readers (e2sm._fast_kpm) against asn1tools.

Two invariants, checked on generated messages in both KPM versions, on REAL contents in the binary and
decimal forms asn1tools and pycrate write, on every truncation and on mutated bytes:
- a fast reader that returns a value returns what asn1tools (check_constraints=True) decodes from the
  same bytes, as the same dataclass (compared by repr, so 1 and 1.0 differ);
- the public `kpm.decode_indication_*` give the same result (value or E2DecodeError) with the fast readers
  switched on and off, so its semantic checks (timestamp plausibility, version mismatch) hold on both paths.
"""
from __future__ import annotations

import dataclasses
import json
import random
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from e2sm import _asn1, _fast_kpm, kpm
from e2sm._fast import Invalid, Unsupported
from e2sm.errors import E2DecodeError
from e2sm.kpm import (
    IndicationMessageFormat1,
    KpmIndicationHeader,
    KpmVersion,
    MeasInfo,
    MeasLabel,
    Snssai,
)

VERSIONS = (KpmVersion.V2_03, KpmVersion.V3_00)


def public_without_fast(name: str, data: bytes, version: KpmVersion):
    """kpm.<name> with the fast readers switched off: the asn1tools path, or E2DecodeError."""
    with _fast_kpm.declined():
        return _outcome(lambda: getattr(kpm, name)(data, version))


def _outcome(decode):
    try:
        return repr(decode())
    except E2DecodeError:
        return E2DecodeError


def asn1tools_value(name: str, data: bytes, version: KpmVersion):
    """What asn1tools decodes, as the dataclass the fast reader builds (or E2DecodeError)."""
    def decode():
        if name == "decode_indication_header":
            kind, body = _asn1.decode(version.module, "E2SM-KPM-IndicationHeader", data)["indicationHeader-formats"]
            return KpmIndicationHeader(int.from_bytes(body["colletStartTime"], "big"), body.get("fileFormatversion"),
                                       body.get("senderName"), body.get("senderType"), body.get("vendorName"))
        kind, body = _asn1.decode(version.module, "E2SM-KPM-IndicationMessage", data)["indicationMessage-formats"]
        if kind != "indicationMessage-Format1":
            raise E2DecodeError("another format")
        return IndicationMessageFormat1.from_asn1(body)
    return _outcome(decode)


def check_same(name: str, data: bytes, version: KpmVersion) -> str:
    """Compare the paths on `data`; returns "accepted", "invalid" (sure the reference refuses) or "declined"."""
    reference = public_without_fast(name, data, version)
    try:
        fast = getattr(_fast_kpm, name)(data, version)
    except Invalid:
        assert reference is E2DecodeError, (name, version, data.hex())
        verdict = "invalid"
    except Unsupported:
        verdict = "declined"
    else:
        assert repr(fast) == asn1tools_value(name, data, version), (name, version, data.hex())
        verdict = "accepted"
    public = _outcome(lambda: getattr(kpm, name)(data, version))
    assert public == reference, (name, version, data.hex())
    return verdict


# ---- generated messages -------------------------------------------------------------------------------
finite = st.floats(allow_nan=False, allow_infinity=False).filter(lambda x: x != 0.0 or struct.pack(">d", x)[0] == 0)
values = st.one_of(st.integers(0, (1 << 32) - 1), finite, st.none())
names = st.text(alphabet=sorted("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789 '()+,-./:=?"),
                min_size=1, max_size=150)
labels = st.one_of(st.just(MeasLabel()), st.builds(lambda sst, sd: MeasLabel(Snssai(sst, sd)), st.integers(0, 255),
                                                   st.none() | st.integers(0, (1 << 24) - 1)))
infos = st.builds(MeasInfo, names | st.integers(1, 65536), st.lists(labels, min_size=1, max_size=3).map(tuple))


@st.composite
def messages(draw):
    width = draw(st.integers(1, 8))
    records = tuple(tuple(draw(st.lists(values, min_size=width, max_size=width)))
                    for _ in range(draw(st.integers(1, 6))))
    meas_info = draw(st.none() | st.lists(infos, min_size=width, max_size=width).map(tuple))
    period = draw(st.none() | st.integers(1, (1 << 32) - 1))
    incomplete = tuple(sorted(draw(st.sets(st.integers(0, len(records) - 1)))))
    return IndicationMessageFormat1(records, meas_info, period, incomplete)


def header_strings(hi):
    return st.none() | st.text(alphabet=sorted("abcXYZ019 -./:"), max_size=hi)


@st.composite
def headers(draw, version):
    return KpmIndicationHeader(draw(st.integers(0, (1 << (8 * version.timestamp_octets)) - 1)),
                               draw(header_strings(15)), draw(header_strings(400)), draw(header_strings(8)),
                               draw(header_strings(32)))


@pytest.mark.parametrize("version", VERSIONS, ids=lambda v: v.value)
@settings(max_examples=120, deadline=None)
@given(msg=messages())
def test_message_fast_equals_reference(version, msg):
    raw = kpm.encode_indication_message(msg, version)
    fast = _fast_kpm.decode_indication_message(raw, version)   # canonical asn1tools bytes: never declined
    assert fast == msg
    assert repr(fast) == asn1tools_value("decode_indication_message", raw, version)
    assert repr(kpm.decode_indication_message(raw, version)) == repr(fast)


@pytest.mark.parametrize("version", VERSIONS, ids=lambda v: v.value)
@settings(max_examples=120, deadline=None)
@given(data=st.data())
def test_header_fast_equals_reference(version, data):
    hdr = data.draw(headers(version))
    body = {"colletStartTime": hdr.collect_start_time.to_bytes(version.timestamp_octets, "big")}
    for key, value in zip(("fileFormatversion", "senderName", "senderType", "vendorName"),
                          (hdr.file_format_version, hdr.sender_name, hdr.sender_type, hdr.vendor_name), strict=True):
        if value is not None:
            body[key] = value
    # encoded by asn1tools directly: any TimeStamp, plausible or not, is valid syntax
    raw = _asn1.encode(version.module, "E2SM-KPM-IndicationHeader",
                       {"indicationHeader-formats": ("indicationHeader-Format1", body)})
    fast = _fast_kpm.decode_indication_header(raw, version)
    assert fast == hdr
    assert repr(fast) == asn1tools_value("decode_indication_header", raw, version)
    check_same("decode_indication_header", raw, version)


def test_vectors_take_the_fast_path(vectors_dir):
    for name, fn in (("kpm_v3_ind_header_f1", "decode_indication_header"),
                     ("kpm_v3_ind_message_f1", "decode_indication_message")):
        raw = bytes.fromhex(json.loads((vectors_dir / f"{name}.json").read_text())["hex"])
        assert check_same(fn, raw, KpmVersion.V3_00) == "accepted"


def test_wrong_version_header_is_never_accepted_silently(vectors_dir):
    raw = bytes.fromhex(json.loads((vectors_dir / "kpm_v3_ind_header_f1.json").read_text())["hex"])
    assert check_same("decode_indication_header", raw, KpmVersion.V2_03) in ("invalid", "declined")
    with pytest.raises(E2DecodeError):
        kpm.decode_indication_header(raw, KpmVersion.V2_03)
    v2 = kpm.encode_indication_header(KpmIndicationHeader(0x12345678, None, "du-1", "gNB", "w"), KpmVersion.V2_03)
    check_same("decode_indication_header", v2, KpmVersion.V3_00)
    with pytest.raises(E2DecodeError):
        kpm.decode_indication_header(v2, KpmVersion.V3_00)


# ---- REAL contents in every form the two encoders write --------------------------------------------------
def _with_real(contents: bytes) -> bytes:
    """A format-1 message with one record [7, REAL(contents), 9], built around asn1tools' own bytes."""
    base = kpm.encode_indication_message(IndicationMessageFormat1(((7, 1.5, 9),)), KpmVersion.V3_00)
    real = bytes([0x20, 3, 0x80, 0xFF, 0x03])   # choice 'real', length 3, 1.5 = 3 * 2^-1
    assert base.count(real) == 1
    return base.replace(real, bytes([0x20, len(contents)]) + contents)


@pytest.mark.parametrize("contents, value", [
    (bytes.fromhex("80ff03"), 1.5),                          # asn1tools / pycrate binary, 1-octet exponent
    (bytes.fromhex("80fe008cc1"), 9008.25),                  # asn1tools' extra 00 before a top-bit mantissa
    (bytes.fromhex("80fe8cc1"), 9008.25),                    # pycrate's form of the same value
    (bytes.fromhex("c0ff03"), -1.5),                         # negative
    (bytes.fromhex("81fc0001"), 2.0 ** -1023 * 1),           # 2-octet exponent (0xfc00 = -1024) -> 1 * 2^-1024
    (b"", 0.0),                                              # zero: no contents octets
    (b"\x03153605.E-1", 15360.5),                            # pycrate decimal NR3
    (b"\x0315.E3", 15000.0),
    (b"\x022,5", 2.5),                                       # NR2 with a decimal comma
])
def test_real_forms(contents, value):
    raw = _with_real(contents)
    assert check_same("decode_indication_message", raw, KpmVersion.V3_00) == "accepted"
    msg = _fast_kpm.decode_indication_message(raw, KpmVersion.V3_00)
    assert msg.records[0][1] == value or contents == bytes.fromhex("81fc0001")


@pytest.mark.parametrize("contents", [
    b"\x40", b"\x41", b"\x42", b"\x43",                        # specials: left to the reference
    bytes.fromhex("90ff03"), bytes.fromhex("82000001ff"),      # base 8, 3-octet exponent: refused by both
    bytes.fromhex("80ff"),                                     # no mantissa
    b"\x03-5.Eb'+0'",                                          # what pycrate writes for (-5, 10, 0)
])
def test_unusual_real_forms_are_declined_and_agree(contents):
    assert check_same("decode_indication_message", _with_real(contents), KpmVersion.V3_00) == "declined"


# ---- truncation and mutation ------------------------------------------------------------------------------
def _samples(vectors_dir) -> list[tuple[str, bytes, KpmVersion]]:
    out = [("decode_indication_message",
            bytes.fromhex(json.loads((vectors_dir / "kpm_v3_ind_message_f1.json").read_text())["hex"]),
            KpmVersion.V3_00),
           ("decode_indication_header",
            bytes.fromhex(json.loads((vectors_dir / "kpm_v3_ind_header_f1.json").read_text())["hex"]),
            KpmVersion.V3_00)]
    rich = IndicationMessageFormat1(
        ((1, None, 2.5, 70000), (None, None, 0, -3.25), (4294967295, 0.0, None, 5)),
        (MeasInfo("RRU.PrbUsedDl"), MeasInfo(7, (MeasLabel(Snssai(1, 1)), MeasLabel(Snssai(2)))),
         MeasInfo("DRB.UEThpDl"), MeasInfo("x", (MeasLabel(),))), 1000, (1,))
    out.append(("decode_indication_message", kpm.encode_indication_message(rich, KpmVersion.V2_03), KpmVersion.V2_03))
    return out


def test_every_truncation_declines_and_fails(vectors_dir):
    for name, raw, version in _samples(vectors_dir):
        for n in range(len(raw)):
            assert check_same(name, raw[:n], version) in ("invalid", "declined")


def test_mutated_bytes_agree_with_the_reference(vectors_dir):
    rng = random.Random(11)
    samples = _samples(vectors_dir)
    verdicts = {"accepted": 0, "invalid": 0, "declined": 0}
    for _ in range(500):
        name, raw, version = rng.choice(samples)
        raw = bytearray(raw)
        for _ in range(rng.randint(1, 2)):
            i = rng.randrange(len(raw))
            if rng.random() < 0.8:
                raw[i] ^= 1 << rng.randrange(8)
            else:
                raw[i] = rng.randrange(256)
        verdicts[check_same(name, bytes(raw), version)] += 1
    assert verdicts["accepted"] > 0 and verdicts["invalid"] > 0 and verdicts["declined"] > 0


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=120), st.sampled_from(VERSIONS))
def test_random_bytes_agree(raw, version):
    check_same("decode_indication_message", raw, version)
    check_same("decode_indication_header", raw, version)


# ---- writers: the bytes asn1tools writes ------------------------------------------------------------------
def _asn1tools_message(msg: IndicationMessageFormat1, version: KpmVersion) -> bytes:
    return _asn1.encode(version.module, "E2SM-KPM-IndicationMessage",
                        {"indicationMessage-formats": ("indicationMessage-Format1", msg.to_asn1())})


@pytest.mark.parametrize("version", VERSIONS, ids=lambda v: v.value)
@settings(max_examples=120, deadline=None)
@given(msg=messages())
def test_message_writer_writes_asn1tools_bytes(version, msg):
    assert _fast_kpm.encode_indication_message(msg, version) == _asn1tools_message(msg, version)


@pytest.mark.parametrize("version", VERSIONS, ids=lambda v: v.value)
@settings(max_examples=120, deadline=None)
@given(data=st.data())
def test_header_writer_writes_asn1tools_bytes(version, data):
    hdr = data.draw(headers(version))
    body = {"colletStartTime": hdr.collect_start_time.to_bytes(version.timestamp_octets, "big")}
    for key, value in zip(("fileFormatversion", "senderName", "senderType", "vendorName"),
                          (hdr.file_format_version, hdr.sender_name, hdr.sender_type, hdr.vendor_name), strict=True):
        if value is not None:
            body[key] = value
    expected = _asn1.encode(version.module, "E2SM-KPM-IndicationHeader",
                            {"indicationHeader-formats": ("indicationHeader-Format1", body)})
    assert _fast_kpm.encode_indication_header(hdr, version) == expected


def test_writer_declines_what_it_does_not_model():
    other = IndicationMessageFormat1(((1,),), (MeasInfo("x", (MeasLabel(None, (("fiveQI", 9),)),)),))
    with pytest.raises(Unsupported):
        _fast_kpm.encode_indication_message(other, KpmVersion.V3_00)
    with pytest.raises(Unsupported):
        _fast_kpm.encode_indication_message(IndicationMessageFormat1(((float("nan"),),)), KpmVersion.V3_00)
    with pytest.raises(Unsupported):    # a record of 16384 values needs a fragmented length
        _fast_kpm.encode_indication_message(IndicationMessageFormat1((tuple(range(16384)),)), KpmVersion.V3_00)
    with pytest.raises(Unsupported):
        _fast_kpm.encode_indication_header(KpmIndicationHeader(1 << 40), KpmVersion.V2_03)


def test_v3_headers_read_as_v2_are_known_invalid_without_asn1tools():
    # kpm's version-mismatch check asks whether v3.00 header bytes also parse as v2.03; Invalid lets it
    # answer without running asn1tools. Seeded, so the count is deterministic.
    rng = random.Random(3)
    verdicts = {"accepted": 0, "invalid": 0, "declined": 0}
    for _ in range(300):
        hdr = KpmIndicationHeader((3_973_000_000 + rng.randrange(10**7)) << 32 | rng.randrange(1 << 32), None,
                                  rng.choice([None, "gnb-sim-1", "du"]), rng.choice([None, "gNB-DU"]),
                                  rng.choice([None, "weaver", "srsRAN"]))
        raw = kpm.encode_indication_header(hdr, KpmVersion.V3_00)
        verdicts[check_same("decode_indication_header", raw, KpmVersion.V2_03)] += 1
    assert verdicts["invalid"] >= 270, verdicts


def _reference_reads_as_v2(data: bytes) -> bool:
    try:
        _asn1.decode(KpmVersion.V2_03.module, "E2SM-KPM-IndicationHeader", data)
    except E2DecodeError:
        return False
    return True


def _v3_header_bytes(hdr: KpmIndicationHeader, fraction: int) -> bytes:
    ntp = (3_973_000_000 << 32) | fraction     # an NTP TimeStamp in 2025: the encoder takes only plausible ones
    return kpm.encode_indication_header(dataclasses.replace(hdr, collect_start_time=ntp), KpmVersion.V3_00)


@settings(max_examples=300, deadline=None)
@given(data=st.one_of(st.binary(min_size=0, max_size=40),
                      st.builds(_v3_header_bytes, headers(KpmVersion.V3_00), st.integers(0, (1 << 32) - 1))))
def test_reads_as_v2_header_agrees_with_the_reference(data):
    # the mismatch check's fast answer: where it gives one, asn1tools gives the same (every 4-octet
    # TimeStamp is plausible, so parsing is the whole v2.03 question); asked twice, the memo answers alike
    verdict = _fast_kpm.reads_as_v2_header(data)
    assert verdict in (True, False, None)
    if verdict is not None:
        assert verdict == _reference_reads_as_v2(data)
    assert _fast_kpm.reads_as_v2_header(data) == verdict


@pytest.mark.parametrize("convert", [bytearray, memoryview])
def test_bytes_like_input(vectors_dir, convert):
    for name, fn in (("kpm_v3_ind_header_f1", "decode_indication_header"),
                     ("kpm_v3_ind_message_f1", "decode_indication_message")):
        raw = bytes.fromhex(json.loads((vectors_dir / f"{name}.json").read_text())["hex"])
        assert getattr(_fast_kpm, fn)(convert(raw), KpmVersion.V3_00) == getattr(kpm, fn)(raw, KpmVersion.V3_00)
        assert getattr(kpm, fn)(convert(raw), KpmVersion.V3_00) == getattr(kpm, fn)(raw, KpmVersion.V3_00)
        with pytest.raises(Unsupported):
            getattr(_fast_kpm, fn)(raw.hex(), KpmVersion.V3_00)
        with pytest.raises(E2DecodeError):
            getattr(kpm, fn)(raw.hex(), KpmVersion.V3_00)


def test_repeated_meas_info_is_shared_between_messages():
    info = (MeasInfo("RRU.PrbUsedDl"), MeasInfo("DRB.UEThpDl", (MeasLabel(Snssai(1, 2)),)))
    first = kpm.encode_indication_message(IndicationMessageFormat1(((1, 2.5),), info, 100), KpmVersion.V3_00)
    second = kpm.encode_indication_message(IndicationMessageFormat1(((7, None), (8, 9)), info, 100),
                                           KpmVersion.V3_00)
    a = _fast_kpm.decode_indication_message(first, KpmVersion.V3_00)
    b = _fast_kpm.decode_indication_message(second, KpmVersion.V3_00)
    assert a.records == ((1, 2.5),) and b.records == ((7, None), (8, 9))
    assert a.meas_info == b.meas_info == info
    # same tail octets behind a different bit offset or presence bits are not confused with the cached one
    other = kpm.encode_indication_message(IndicationMessageFormat1(((7, None, None),), info, 100), KpmVersion.V3_00)
    with pytest.raises(E2DecodeError):
        kpm.decode_indication_message(other[:-1], KpmVersion.V3_00)
    assert check_same("decode_indication_message", other, KpmVersion.V3_00) == "accepted"
