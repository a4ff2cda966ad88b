"""Fuzz the E2AP decoders. Invariant (as in h11's fuzz/afl-server.py): any bytes either decode or raise
E2DecodeError - never another exception, never a hang - and a failed decode leaves pycrate's shared state
usable (the next valid PDU still decodes right), also across threads."""
from __future__ import annotations

import json
import random
import threading

from hypothesis import given, settings
from hypothesis import strategies as st

from e2sm import e2ap
from e2sm.e2ap import decode_e2ap, decode_e2ap_reference, encode_e2ap
from e2sm.errors import E2DecodeError, E2EncodeError

DECODERS = (decode_e2ap, decode_e2ap_reference, e2ap.decode_json)


def _only_decode_errors(raw: bytes) -> None:
    for decode in DECODERS:
        try:
            decode(raw)
        except E2DecodeError:
            pass


def _seeds(vectors_dir) -> list[bytes]:
    return [bytes.fromhex(json.loads(p.read_text())["hex"]) for p in sorted(vectors_dir.glob("e2ap_*.json"))]


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300))
def test_random_bytes(raw):
    _only_decode_errors(raw)


@settings(max_examples=200, deadline=None)
@given(st.sampled_from([b"\x00\x05\x40", b"\x00\x08\x00", b"\x00\x04\x00", b"\x20\x08\x00", b"\x40\x01\x00",
                        b"\x00\x01\x00", b"\x00\x02\x40"]), st.binary(max_size=200))
def test_plausible_prefixes(prefix, tail):
    # random tails behind real PDU headers reach the per-message IE code, not just the CHOICE
    _only_decode_errors(prefix + tail)


def test_every_truncation_of_every_vector(vectors_dir):
    for raw in _seeds(vectors_dir):
        for n in range(len(raw)):
            _only_decode_errors(raw[:n])


def test_mutated_vectors(vectors_dir):
    rng = random.Random(7)
    seeds = _seeds(vectors_dir)
    for _ in range(600):
        raw = bytearray(rng.choice(seeds))
        for _ in range(rng.randint(1, 4)):
            i = rng.randrange(len(raw))
            if rng.random() < 0.7:
                raw[i] ^= 1 << rng.randrange(8)
            else:
                raw[i] = rng.randrange(256)
        _only_decode_errors(bytes(raw))
    for raw in seeds:   # pycrate's singletons are still sound after all that garbage
        assert encode_e2ap(decode_e2ap_reference(raw)) == raw


def test_threads_share_pycrate_safely(vectors_dir):
    seeds = _seeds(vectors_dir)
    expected = [decode_e2ap_reference(raw) for raw in seeds]
    failures: list[str] = []

    def work(k: int) -> None:
        rng = random.Random(k)
        for _ in range(60):
            i = rng.randrange(len(seeds))
            try:
                if decode_e2ap_reference(seeds[i]) != expected[i] or encode_e2ap(expected[i]) != seeds[i]:
                    failures.append(f"thread {k}: wrong result for seed {i}")
                decode_e2ap(bytes(rng.randrange(256) for _ in range(20)))
            except E2DecodeError:
                pass
            except Exception as exc:  # noqa: BLE001 - the test reports anything else as a failure
                failures.append(f"thread {k}: {type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures, failures[:3]


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(1 << 70), 1 << 70) | st.floats() | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=20)


@settings(max_examples=200, deadline=None)
@given(json_values)
def test_encode_json_refuses_garbage_with_an_encode_error(value):
    try:
        e2ap.encode_json(value)
    except E2EncodeError:
        pass


def _leaves(node, path=()):
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _leaves(v, (*path, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _leaves(v, (*path, i))
    else:
        yield path


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_encode_json_with_one_leaf_replaced(vectors_dir, data):
    vectors = [json.loads(p.read_text())["decoded"] for p in sorted(vectors_dir.glob("e2ap_*.json"))]
    value = data.draw(st.sampled_from(vectors))
    value = json.loads(json.dumps(value))
    path = data.draw(st.sampled_from(list(_leaves(value))))
    node = value
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = data.draw(json_values)
    try:
        raw = e2ap.encode_json(value)
    except E2EncodeError:
        return
    assert e2ap.encode_json(e2ap.decode_json(raw)) == raw   # whatever was accepted is a valid PDU
