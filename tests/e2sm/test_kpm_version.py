"""KPM version handling: the version comes from the node's OID, and a header decoded under the
wrong version never silently returns a value (both directions)."""
from __future__ import annotations

import json
import random

import pytest

import e2sm
from e2sm import kpm

V2, V3 = kpm.KpmVersion.V2_03, kpm.KpmVersion.V3_00
ALPHABET = "abcdefghijklmnopqrstuvwxyzABC0123456789 -.:"


def test_version_from_oid():
    assert kpm.kpm_version_from_oid(e2sm.KPM_OID_V2) is V2
    assert kpm.kpm_version_from_oid(e2sm.KPM_OID_V3) is V3
    assert kpm.kpm_version_from_oid("1.3.6.1.4.1.53148.1.2.2.2") is V2
    with pytest.raises(ValueError):
        kpm.kpm_version_from_oid(e2sm.RC_OID)


def test_v3_header_vector_decoded_as_v2_names_the_mismatch(vectors_dir):
    data = bytes.fromhex(json.loads((vectors_dir / "kpm_v3_ind_header_f1.json").read_text())["hex"])
    assert kpm.decode_indication_header(data, V3).sender_name == "gnb-sim-1"
    with pytest.raises(e2sm.E2DecodeError, match="version mismatch"):
        kpm.decode_indication_header(data, V2)
    with pytest.raises(e2sm.E2DecodeError, match="version mismatch"):
        e2sm.decode_json("kpm-v2.03:E2SM-KPM-IndicationHeader", data)


def test_v2_header_decoded_as_v3_names_the_mismatch():
    bare = kpm.encode_indication_header(kpm.KpmIndicationHeader(0xEB1F0400), V2)  # 5 bytes, v3 needs 9
    with pytest.raises(e2sm.E2DecodeError, match="version mismatch"):
        kpm.decode_indication_header(bare, V3)
    # The case that consumption alone misses: a short fileFormatversion fills v3's extra 4 octets.
    h = kpm.KpmIndicationHeader(0xEB1F0400, "1.0", "gnb", "DU", "example")
    data = kpm.encode_indication_header(h, V2)
    assert kpm.decode_indication_header(data, V2) == h
    with pytest.raises(e2sm.E2DecodeError, match="version mismatch"):
        kpm.decode_indication_header(data, V3)


def _header(rng: random.Random, version: kpm.KpmVersion) -> kpm.KpmIndicationHeader:
    def s(hi):
        return None if rng.random() < 0.4 else "".join(rng.choice(ALPHABET) for _ in range(rng.randint(0, hi)))

    now = 1_767_225_600  # 2026-01-01
    if version is V2:
        ts = rng.choice([0, now, now + 2_208_988_800, rng.getrandbits(32)])
    else:
        ts = rng.choice([0, now, ((now + 2_208_988_800) << 32) | rng.getrandbits(32), now * 10**6])
    return kpm.KpmIndicationHeader(ts, s(15), s(40), s(8), s(32))


@pytest.mark.parametrize(("sent", "configured"), [(V3, V2), (V2, V3)], ids=["v3-as-v2", "v2-as-v3"])
def test_wrong_version_never_silently_decodes(sent, configured):
    rng = random.Random(20260101)
    for _ in range(1500):
        h = _header(rng, sent)
        data = kpm.encode_indication_header(h, sent)
        assert kpm.decode_indication_header(data, sent) == h  # and the right version still works
        with pytest.raises(e2sm.E2DecodeError, match="version mismatch"):
            kpm.decode_indication_header(data, configured)


def test_timestamp_plausibility():
    assert kpm.plausible_timestamp(0, V3)
    assert kpm.plausible_timestamp(0xEB1F040000000000, V3)  # NTP 2025
    assert kpm.plausible_timestamp(1_767_225_600_000_000, V3)  # Unix microseconds
    assert not kpm.plausible_timestamp(0x0000123400000000, V3)
    assert not kpm.plausible_timestamp(1 << 32, V2)
    with pytest.raises(e2sm.E2EncodeError, match="plausible"):
        kpm.encode_indication_header(kpm.KpmIndicationHeader(0x0000123400000000), V3)


def test_messages_are_the_same_bytes_under_both_versions(vectors_dir):
    # TimeStamp is the only difference between the modules and appears only in the header, so the
    # other payloads decode to the same (correct) value either way: nothing silent to catch there.
    for name in ("kpm_v3_ind_message_f1", "kpm_v3_action_def_f1", "kpm_v3_event_trigger_f1"):
        v = json.loads((vectors_dir / f"{name}.json").read_text())
        data = bytes.fromhex(v["hex"])
        type_name = v["kind"].split(":")[1]
        assert e2sm.decode_json(f"kpm-v2.03:{type_name}", data) == v["decoded"]
    msg = kpm.decode_indication_message(
        bytes.fromhex(json.loads((vectors_dir / "kpm_v3_ind_message_f1.json").read_text())["hex"]), V2
    )
    assert kpm.encode_indication_message(msg, V3) == kpm.encode_indication_message(msg, V2)
