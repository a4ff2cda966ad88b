"""`weaver bench codecs`: encode/decode rates of a realistic KPM indication, Weaver vs the plain libraries.

The message is what a DU sends each reporting period: a RICindication whose header is a KPM v3.00
indication header format 1 and whose message is format 1 with 10 measurements x 10 records (integers,
REAL throughputs, one missing value), and each operation takes in turn the 64 successive indications of one
node (TimeStamps 100 ms apart, values moving), so a memo of one message's bytes earns nothing. Both paths run in this command, on one core, interleaved in rounds
so that load from other processes hits both alike; each rate is the median over the rounds.

- baseline: what e2-facts section 9 measured - pycrate E2AP-PDU `from_aper`/`to_aper` plus asn1tools APER
  with `check_constraints=True` for the KPM header and message, no typed values;
- weaver: the public typed API - `e2ap.decode_e2ap` + `kpm.decode_indication_header/message` (and the
  `encode_*` counterparts), which return validated dataclasses.

Before timing, the Weaver decode is checked to return exactly the values that were encoded.
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

from e2sm import _asn1, _fast_kpm, _kpm_kernel, e2ap, kpm
from e2sm.kpm import IndicationMessageFormat1, KpmIndicationHeader, KpmVersion, MeasInfo, MeasLabel, Snssai

VERSION = KpmVersion.V3_00
ROUNDS = 7

MEASUREMENTS = (
    "RRU.PrbUsedDl", "RRU.PrbUsedUl", "RRU.PrbAvailDl", "RRU.PrbAvailUl", "RRU.PrbTotDl", "RRU.PrbTotUl",
    "DRB.UEThpDl", "DRB.UEThpUl", "DRB.RlcSduDelayDl", "DRB.PdcpSduVolumeDL",
)


@dataclass(frozen=True)
class Indication:
    """One realistic indication in all its forms."""

    ric: e2ap.RicIndication
    header: KpmIndicationHeader
    message: IndicationMessageFormat1
    raw: bytes


STREAM = 64     # distinct indications decoded in turn: one node's reports over 6.4 s


def realistic_indication(period: int = 0) -> Indication:
    """10 measurements x 10 records, as a srsRAN-like DU reports every 100 ms granularity period. `period`
    moves the TimeStamp on by 100 ms a period (so its NTP fraction octets change) and shifts the values,
    as one node's successive reports do; the strings and the measInfoList stay the node's own."""
    records = []
    for r in range(10):
        row: list[int | float | None] = []
        for m, name in enumerate(MEASUREMENTS):
            if name.startswith("DRB.UEThp"):
                row.append(15360.5 + 1024.25 * r - 3.75 * m + 0.25 * period)   # kbit/s, REAL (exact in binary)
            elif name == "DRB.RlcSduDelayDl" and r == 7:
                row.append(None)                                        # a period without a sample
            else:
                row.append((r * 37 + m * 11 + period) % 273 + (100000 if "Volume" in name else 0))
        records.append(tuple(row))
    meas_info = tuple(MeasInfo(n, (MeasLabel(Snssai(1, 1)),) if n.startswith("DRB") else (MeasLabel(),))
                      for n in MEASUREMENTS)
    message = IndicationMessageFormat1(tuple(records), meas_info, 100)
    ntp_2026 = (3_973_000_000 << 32) | 0x4000_0000
    ntp = ntp_2026 + period * ((1 << 32) // 10)
    header = KpmIndicationHeader(ntp, None, "gnb-sim-1", "gNB-DU", "weaver")
    ric = e2ap.RicIndication(e2ap.RicRequestId(1, 2), 2, 1, kpm.encode_indication_header(header, VERSION),
                             kpm.encode_indication_message(message, VERSION), sn=(4711 + period) % 65536)
    return Indication(ric, header, message, e2ap.encode_e2ap(ric))


def realistic_stream(n: int = STREAM) -> list[Indication]:
    return [realistic_indication(k) for k in range(n)]


def _cycle(items: list) -> Callable[[], object]:
    """A function that returns the next item each call, round the list."""
    return itertools.cycle(items).__next__


# ---- the two paths ------------------------------------------------------------------------------------
def _baseline(stream: list[Indication]) -> tuple[Callable[[], object], Callable[[], object], Callable[[], object]]:
    pdu = e2ap._PDU
    spec = _asn1.spec(VERSION.module)
    values = []
    for ind in stream:
        with e2ap._LOCK:
            pdu.from_aper(ind.raw)
            pdu_value = pdu.get_val()
        values.append((spec.decode("E2SM-KPM-IndicationHeader", ind.ric.header, check_constraints=True),
                       spec.decode("E2SM-KPM-IndicationMessage", ind.ric.message, check_constraints=True),
                       pdu_value))
    next_ind, next_message, next_values = _cycle(stream), _cycle(stream), _cycle(values)

    def decode_full() -> object:
        with e2ap._LOCK:
            pdu.from_aper(next_ind().raw)
            ies = pdu.get_val()[1]["value"][1]["protocolIEs"]
        payload = {ie["id"]: ie["value"][1] for ie in ies}
        return (spec.decode("E2SM-KPM-IndicationHeader", payload[25], check_constraints=True),
                spec.decode("E2SM-KPM-IndicationMessage", payload[26], check_constraints=True))

    def decode_message() -> object:
        return spec.decode("E2SM-KPM-IndicationMessage", next_message().ric.message, check_constraints=True)

    def encode_full() -> bytes:
        header_value, message_value, pdu_value = next_values()
        spec.encode("E2SM-KPM-IndicationHeader", header_value, check_constraints=True)
        spec.encode("E2SM-KPM-IndicationMessage", message_value, check_constraints=True)
        with e2ap._LOCK:
            pdu.set_val(pdu_value)
            return pdu.to_aper()

    return decode_full, decode_message, encode_full


def _weaver(stream: list[Indication]) -> tuple[Callable[[], object], Callable[[], object], Callable[[], object]]:
    next_ind, next_message, next_encode = _cycle(stream), _cycle(stream), _cycle(stream)

    def decode_full() -> object:
        ric = e2ap.decode_e2ap(next_ind().raw)
        return (ric, kpm.decode_indication_header(ric.header, VERSION),
                kpm.decode_indication_message(ric.message, VERSION))

    def decode_message() -> object:
        return kpm.decode_indication_message(next_message().ric.message, VERSION)

    def encode_full() -> bytes:
        ind = next_encode()
        header = kpm.encode_indication_header(ind.header, VERSION)
        message = kpm.encode_indication_message(ind.message, VERSION)
        return e2ap.encode_e2ap(e2ap.RicIndication(ind.ric.request_id, ind.ric.ran_function_id,
                                                   ind.ric.action_id, header, message, sn=ind.ric.sn))

    return decode_full, decode_message, encode_full


def _fast_readers(stream: list[Indication]) -> tuple[Callable[[], object], Callable[[], object]]:
    """decode_e2ap + the e2sm._fast_kpm readers, falling back to kpm.decode_* on Unsupported: the path
    kpm.decode_indication_* take once they call the fast readers (docs/contracts.md)."""
    from e2sm._fast import Unsupported
    next_ind, next_message = _cycle(stream), _cycle(stream)

    def header(data: bytes) -> object:
        try:
            return _fast_kpm.decode_indication_header(data, VERSION)
        except Unsupported:
            return kpm.decode_indication_header(data, VERSION)

    def message(data: bytes) -> object:
        try:
            return _fast_kpm.decode_indication_message(data, VERSION)
        except Unsupported:
            return kpm.decode_indication_message(data, VERSION)

    def decode_full() -> object:
        ric = e2ap.decode_e2ap(next_ind().raw)
        return ric, header(ric.header), message(ric.message)

    return decode_full, lambda: message(next_message().ric.message)


def check_exact(stream: list[Indication]) -> None:
    """The Weaver path must give back exactly what was encoded (values and bytes), or the bench is void.
    Each function walks the stream in order, so one pass checks every indication."""
    weaver, fast = _weaver(stream), _fast_readers(stream)
    for ind in stream:
        for decode in (weaver[0], fast[0]):
            ric, header, message = decode()
            if ric != ind.ric or header != ind.header or repr(message) != repr(ind.message):
                raise SystemExit("bench codecs: the Weaver decode does not return the encoded values")
        if weaver[2]() != ind.raw:
            raise SystemExit("bench codecs: the Weaver encode does not reproduce the bytes")


def kpm_fast_path_engaged(ind: Indication) -> bool:
    """Whether kpm.decode_indication_message goes through e2sm._fast_kpm (it should, see contracts.md)."""
    calls = []
    real = _fast_kpm.decode_indication_message

    def counting(data: bytes, version: KpmVersion) -> object:
        calls.append(1)
        return real(data, version)

    _fast_kpm.decode_indication_message = counting
    try:
        kpm.decode_indication_message(ind.ric.message, VERSION)
    finally:
        _fast_kpm.decode_indication_message = real
    return bool(calls)


# ---- timing -------------------------------------------------------------------------------------------
def _per_op(fn: Callable[[], object], budget_s: float) -> float:
    """Seconds per call, from as many calls as fit in budget_s (at least 3)."""
    n, start = 0, time.perf_counter()
    while True:
        fn()
        n += 1
        elapsed = time.perf_counter() - start
        if elapsed >= budget_s and n >= 3:
            return elapsed / n


def measure(pairs: dict[str, tuple[Callable[[], object], Callable[[], object]]], seconds: float) -> dict:
    """Median seconds per call of each (baseline, weaver) pair, interleaved over ROUNDS rounds."""
    budget = seconds / (ROUNDS * 2 * len(pairs))
    samples: dict[str, tuple[list[float], list[float]]] = {k: ([], []) for k in pairs}
    for _ in range(ROUNDS):
        for name, (base, ours) in pairs.items():
            samples[name][0].append(_per_op(base, budget))
            samples[name][1].append(_per_op(ours, budget))
    return {k: (statistics.median(b), statistics.median(w)) for k, (b, w) in samples.items()}


def _pin_to_one_core() -> int | None:
    try:
        cpu = min(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cpu})
        return cpu
    except (AttributeError, OSError):
        return None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--seconds", type=float, default=6.0,
                        help="total measuring time, split over both paths and all operations (default 6)")
    parser.add_argument("--json", metavar="FILE", help="also write the results as JSON to FILE")


def run(args: argparse.Namespace) -> int:
    if args.seconds <= 0:
        print("bench codecs: --seconds must be positive", file=sys.stderr)
        return 2
    cpu = _pin_to_one_core()
    stream = realistic_stream()
    ind = stream[0]
    check_exact(stream)
    base = _baseline(stream)
    ours = _weaver(stream)
    fast = _fast_readers(stream)
    engaged = kpm_fast_path_engaged(ind)
    pairs = {"decode_full_indication": (base[0], ours[0]), "decode_kpm_message": (base[1], ours[1]),
             "encode_full_indication": (base[2], ours[2])}
    if not engaged:     # measure the fast readers directly too, so the figure is known either way
        pairs["decode_full_indication_fast_readers"] = (base[0], fast[0])
        pairs["decode_kpm_message_fast_readers"] = (base[1], fast[1])
    results = measure(pairs, args.seconds)

    out: dict[str, object] = {
        "message": "RICindication + KPM v3.00 header F1 + message F1, 10 measurements x 10 records",
        "distinct_indications_in_turn": len(stream),
        "kpm_message_compiled_walk": _kpm_kernel.walk_records is not None,
        "full_indication_bytes": len(ind.raw), "kpm_message_bytes": len(ind.ric.message),
        "kpm_header_bytes": len(ind.ric.header), "exact": True,
        "kpm_fast_path_engaged": engaged, "rounds": ROUNDS, "seconds": args.seconds,
        "pinned_cpu": cpu, "python": platform.python_version(),
    }
    print(f"bench codecs: {out['message']} ({len(ind.raw)} B; KPM message {len(ind.ric.message)} B), "
          f"{len(stream)} successive indications in turn, one core (cpu {cpu}), median of {ROUNDS} interleaved rounds"
          f"{'' if out['kpm_message_compiled_walk'] else ' (numba missing: the Python walk)'}")
    print(f"{'operation':<38}{'baseline/s':>11}{'weaver/s':>10}{'speedup':>9}{'baseline us':>13}{'weaver us':>11}")
    for name, (b, w) in results.items():
        speedup = b / w
        print(f"{name:<38}{1 / b:>11,.0f}{1 / w:>10,.0f}{speedup:>8.2f}x{b * 1e6:>13.1f}{w * 1e6:>11.1f}")
        out[f"{name}_per_s"] = round(1 / w, 1)
        out[f"baseline_{name}_per_s"] = round(1 / b, 1)
        out[f"{name}_us"] = round(w * 1e6, 2)
        out[f"baseline_{name}_us"] = round(b * 1e6, 2)
        out[f"{name}_speedup_vs_baseline"] = round(speedup, 2)
    out["decode_speedup_vs_baseline"] = out["decode_full_indication_speedup_vs_baseline"]
    out["encode_speedup_vs_baseline"] = out["encode_full_indication_speedup_vs_baseline"]
    if not out["kpm_fast_path_engaged"]:
        print("note: kpm.decode_indication_message does not call e2sm._fast_kpm yet (see docs/contracts.md)")
    print("baseline: pycrate E2AP-PDU + asn1tools KPM (check_constraints=True), raw library values; "
          "weaver: e2ap/kpm typed API (validated dataclasses)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)
            f.write("\n")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="weaver bench codecs", description=__doc__.splitlines()[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
