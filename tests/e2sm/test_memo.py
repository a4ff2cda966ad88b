"""The setup-time codecs are memoised by value (`e2sm.memo`): an equal message is encoded or decoded once, bad
bytes are refused every time, and the memo is bounded."""
from __future__ import annotations

import pytest

from e2sm import _asn1, kpm, rc
from e2sm.errors import E2DecodeError
from e2sm.memo import MEMO_SIZE
from testbed.e2node.config import NodeConfig, SliceId
from testbed.e2node.functions import kpm_description

V3 = kpm.KpmVersion.V3_00


@pytest.fixture
def asn1_calls(monkeypatch):
    """Counts the asn1tools encodes and decodes, with every memo emptied first."""
    for fn in (kpm.encode_ran_function_description, kpm.decode_ran_function_description, kpm.encode_event_trigger,
               kpm.decode_event_trigger, rc.decode_ran_function_definition):
        fn.cache_clear()
    calls = {"encode": 0, "decode": 0}
    for name in calls:
        real = getattr(_asn1, name)

        def counted(*a, _real=real, _name=name, **k):
            calls[_name] += 1
            return _real(*a, **k)
        monkeypatch.setattr(_asn1, name, counted)
    return calls


def _description():
    return kpm_description(NodeConfig(site=0, n_cells=2, slices=(SliceId(1, 1), SliceId(1, 2))))


def test_equal_setup_messages_are_coded_once_and_give_the_same_value(asn1_calls):
    data = [kpm.encode_ran_function_description(_description(), V3) for _ in range(3)]  # equal values, new objects
    assert asn1_calls["encode"] == 1 and data[0] == data[1] == data[2]
    decoded = [kpm.decode_ran_function_description(bytes(data[0]), V3) for _ in range(3)]
    assert asn1_calls["decode"] == 1
    assert decoded[0] == decoded[2] == kpm.decode_ran_function_description.uncached(data[0], V3)
    # another version is another message
    kpm.encode_ran_function_description(_description(), kpm.KpmVersion.V2_03)
    assert asn1_calls["encode"] == 2


def test_bad_bytes_are_refused_every_time_and_unhashable_input_is_passed_through(asn1_calls):
    good = kpm.encode_event_trigger(kpm.KpmEventTrigger(100), V3)
    for _ in range(2):
        with pytest.raises(E2DecodeError):
            kpm.decode_event_trigger(good[:-1] + b"\xff\xff", V3)
        with pytest.raises(E2DecodeError):
            rc.decode_ran_function_definition(b"\x00")
    assert asn1_calls["decode"] == 4       # nothing about a refusal is remembered
    assert kpm.decode_event_trigger(bytearray(good), V3) == kpm.KpmEventTrigger(100)
    assert kpm.decode_event_trigger(bytearray(good), V3) == kpm.KpmEventTrigger(100)
    assert asn1_calls["decode"] == 6       # a bytearray does not hash: decoded each time


def test_the_memo_is_bounded():
    kpm.encode_event_trigger.cache_clear()
    for period in range(1, MEMO_SIZE + 50):
        kpm.encode_event_trigger(kpm.KpmEventTrigger(period), V3)
    assert kpm.encode_event_trigger.cache_info().currsize == MEMO_SIZE
