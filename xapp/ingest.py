"""KPM in: RMR indication payload -> `KpmSample` (one node, one reporting period), or an `IngestError`.

The RMR header's `sub_id` (E2EventInstanceId) picks the subscription first, which fixes the node, the
KPM version (per node, from its OID, with a config override: srsRAN sends v3 bytes under the v2 OID)
and the measurement order of the action definition, used when a message omits measInfoList. The
sending node (`meid`) and RAN function must agree with that subscription: KPM from an unknown node or
for a subscription we do not hold is refused, never attributed to some other site.

Each record of a format-1 message is one granularity period; values are folded over records: maxima
take the max, counts (`GPU.DeadlineMiss`) the sum, everything else the mean. `noValue` is skipped.
Pure: no I/O, no logging; the caller counts and logs errors by `kind`.

Values are checked before they become a sample (`check_values`): every value must be finite and
non-negative (KPM measurements are counts, sizes, rates and durations), percentages at most 100, a
node's PRBs used at most its PRBs available and those at most `MAX_PRBS_PER_NODE`, SM figures at most
the site's GPU (`NodeLimits`; the offered, pre-shaping demand `GPU.SmOffered.*` at most `OFFERED_GPU_FACTOR`
times it), deadline misses at most the slots of the reported periods, the best-effort delay the
compute-aware stage added (`GPU.BeAddedDelay.Max`) at most `MAX_BE_DELAY_MS` and its deferred backlog
(`GPU.BeDeferredBytes`) at most `MAX_BE_DEFERRED_BYTES`. A frame that
fails is refused whole (`KpmValueError`, kind `value`) with a `KpmRefusal` the loop takes as "this node
is not fresh" (xapp.loop owns freshness); `refused` counts them per (node, reason). A valid but extreme
value (the whole GPU as peak) is accepted: the RAN really may peak, and the windows age it out.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field

from e2sm import E2DecodeError, _kpm_kernel
from e2sm.e2ap import RicIndication, decode_e2ap
from e2sm.kpm import (
    IndicationMessageFormat1,
    KpmVersion,
    MeasInfo,
    decode_indication_header,
    decode_indication_message,
)

SUMMED = ("GPU.DeadlineMiss",)

# Physical bounds of the measurements (module doc). 275 PRBs is NR's largest carrier (TS 38.101-1/-2,
# max N_RB); 64 cells is far more than any DU serves, and the bound keeps the per-cell lists the loop
# builds from RRU.PrbAvailDl (cells = PRBs / cell_prbs) small whatever a frame claims.
MAX_PRBS_PER_CELL = 275
MAX_CELLS_PER_NODE = 64
MAX_PRBS_PER_NODE = MAX_PRBS_PER_CELL * MAX_CELLS_PER_NODE
# 960 kHz SCS (numerology 6, FR2-2) has 64 slots per ms: no node counts more missed slots than that.
MAX_SLOTS_PER_MS = 64
_SM_PREFIX = "GPU.Sm"                 # GPU.SmUsed.*, SmAvail, SmEnvelope, SmNonDeferrable.* (SmOffered: below)
# The demand the RAN offers before the envelope may exceed the GPU (that excess is what the compute-aware
# stage defers), but a MAC schedules at most its cells' PRBs, and no PHY is costed at twice the GPU it
# was sized for: above that the figure is garbage (wrong unit, wrong site), not load.
_OFFERED_PREFIX = "GPU.SmOffered"
OFFERED_GPU_FACTOR = 2
# Deferred best-effort work older than a minute has long been dropped by any RLC/PDCP discard timer (TS
# 38.331 discardTimer tops at 1500 ms, or infinity, which no deployment of a delay budget uses); a larger
# delay is a unit error (us sent as ms).
MAX_BE_DELAY_MS = 60_000.0
# Backlog: a minute of the node's cells at 20 Gbit/s each (above NR's peak rate per carrier).
MAX_BE_DEFERRED_BYTES = MAX_CELLS_PER_NODE * 20e9 / 8 * MAX_BE_DELAY_MS / 1000
_PERCENT = ("RRU.PrbTotDl", "RRU.PrbTotUl")
_PRB_AVAIL = {"RRU.PrbUsedDl": "RRU.PrbAvailDl", "RRU.PrbUsedUl": "RRU.PrbAvailUl"}


class IngestError(ValueError):
    """An indication that cannot be used. `kind`: e2ap | e2sm | unknown-subscription | unknown-node | shape
    | value."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(f"{kind}: {message}")
        self.kind = kind


@dataclass(frozen=True)
class KpmRefusal:
    """A decoded indication from a known node whose values are impossible: the node is not fresh until
    it sends a valid one (the shell hands this to the loop in place of a sample)."""
    meid: str
    received: float
    reason: str                        # non-finite | negative | above-gpu | above-cell | percent | miss-count
    #                                    | be-delay | be-backlog
    detail: str = ""


class KpmValueError(IngestError):
    def __init__(self, refusal: KpmRefusal) -> None:
        super().__init__("value", f"{refusal.meid}: {refusal.reason}: {refusal.detail}")
        self.refusal = refusal


@dataclass(frozen=True)
class NodeLimits:
    """What a node's site can physically report: its GPU's SMs (xapp.config SiteConfig.gpu_sms)."""
    gpu_sms: int


def meas_key(name: str | int, label=None) -> str:
    """'RRU.PrbUsedDl' for noLabel, 'RRU.PrbUsedDl@1:1' for S-NSSAI (sst 1, sd 1), '@1' when no SD."""
    s = getattr(label, "snssai", None)
    if s is None:
        return str(name)
    return f"{name}@{s.sst}" if s.sd is None else f"{name}@{s.sst}:{s.sd}"


def info_key(m: MeasInfo) -> str:
    return meas_key(m.name, m.labels[0] if m.labels else None)


@functools.lru_cache(maxsize=1024)
def _keys(meas_info: tuple[MeasInfo, ...]) -> tuple[str, ...]:
    # a node sends the same measInfoList every period: build the keys once
    return tuple(info_key(m) for m in meas_info)


@dataclass(frozen=True)
class KpmSubscription:
    """What ingest needs to know about one live subscription (keyed by its RMR sub_id)."""
    sub_id: int
    meid: str
    ran_function_id: int
    version: KpmVersion
    meas: tuple[str, ...]              # keys in action-definition order


@dataclass(frozen=True)
class KpmSample:
    meid: str
    received: float                    # caller's monotonic seconds
    collected: int | None              # colletStartTime as sent (None when not decoded)
    values: dict[str, float] = field(hash=False)
    sn: int | None = None
    collected_s: float | None = None   # colletStartTime in seconds (NTP era; only differences matter)
    collected_res_s: float = 0.0       # its resolution: 1 s for KPM v2.03's 32-bit stamp, ~0 for v3.00


def collection_seconds(stamp: int | None, version: KpmVersion) -> tuple[float | None, float]:
    """KPM v3.00 and v4.00 carry a 64-bit NTP timestamp (seconds . fraction), v2.03 the 32-bit seconds."""
    if stamp is None:
        return None, 0.0
    if version.timestamp_octets == 8:
        return (stamp >> 32) + (stamp & 0xFFFFFFFF) / 2**32, 2**-32
    return float(stamp), 1.0


def fold(records: tuple[tuple, ...], keys: tuple[str, ...]) -> dict[str, float]:
    plan = _fold_plan(keys)
    if len(records) == 1:       # one record (a DU's usual report): each fold is the value itself
        # (0 + x as sum() computes it, which makes -0.0 into 0.0; max() keeps it)
        return {key: (float(v) if how == _MAX else 0 + float(v))
                for key, how, v in zip(keys, plan, records[0], strict=False) if v is not None}
    out: dict[str, float] = {}
    for i, (key, how) in enumerate(zip(keys, plan, strict=True)):
        vals = [float(r[i]) for r in records if i < len(r) and r[i] is not None]
        if not vals:
            continue
        if how == _MAX:
            out[key] = max(vals)
        elif how == _SUM:
            out[key] = sum(vals)
        else:
            out[key] = sum(vals) / len(vals)
    return out


_MAX, _SUM, _MEAN = range(3)


@functools.lru_cache(maxsize=1024)
def _fold_plan(keys: tuple[str, ...]) -> tuple[int, ...]:
    """How each key's records fold, once per measInfoList (the string tests cost more than the fold)."""
    return tuple(_MAX if key.endswith(".Max") or ".Max@" in key else _SUM if key.split("@")[0] in SUMMED
                 else _MEAN for key in keys)


PLAIN, PERCENT, PRB, SM, MISS, OFFERED, DELAY, BACKLOG = range(8)


@functools.lru_cache(maxsize=1024)
def _bounds(keys: tuple[str, ...]) -> tuple[tuple[int, ...], tuple[tuple[int, int], ...]]:
    """Per key its kind of bound, and the (used, available) index pairs of PRB counters; built once per
    measInfoList like the keys themselves (this runs on every indication)."""
    names = [k.split("@")[0] for k in keys]
    kinds = tuple(PERCENT if n in _PERCENT else PRB if n.startswith("RRU.Prb")
                  else OFFERED if n.startswith(_OFFERED_PREFIX) else SM if n.startswith(_SM_PREFIX)
                  else MISS if n == "GPU.DeadlineMiss" else DELAY if n == "GPU.BeAddedDelay.Max"
                  else BACKLOG if n == "GPU.BeDeferredBytes" else PLAIN for n in names)
    pairs = tuple((i, names.index(avail)) for i, n in enumerate(names)
                  if (avail := _PRB_AVAIL.get(n)) is not None and avail in names)
    return kinds, pairs


def check_values(records: tuple[tuple, ...], keys: tuple[str, ...], limits: NodeLimits | None,
                 granul_period_ms: int | None) -> tuple[str, str] | None:
    """(reason, detail) of the first impossible value of a format-1 message, None when all are possible.
    Raw record values are checked, not folded ones: max() would hide a NaN and a mean could hide one
    record's negative value."""
    kinds, pairs = _bounds(keys)
    gpu = limits.gpu_sms if limits is not None else math.inf
    misses = MAX_SLOTS_PER_MS * granul_period_ms if granul_period_ms else math.inf
    for r in records:
        for key, kind, v in zip(keys, kinds, r, strict=False):
            if v is None:
                continue
            if not math.isfinite(v):
                return "non-finite", f"{key} = {v}"
            if v < 0:
                return "negative", f"{key} = {v}"
            if kind == PLAIN:
                continue
            if kind == PERCENT and v > 100:
                return "percent", f"{key} = {v} %"
            if kind == PRB and v > MAX_PRBS_PER_NODE:
                return "above-cell", f"{key} = {v} PRBs > {MAX_PRBS_PER_NODE}"
            if kind == SM and v > gpu:
                return "above-gpu", f"{key} = {v} SMs > the site's {gpu}"
            if kind == MISS and v > misses:
                return "miss-count", f"{key} = {v} slots in a {granul_period_ms} ms period"
            if kind == OFFERED and v > OFFERED_GPU_FACTOR * gpu:
                return "above-gpu", f"{key} = {v} SMs > {OFFERED_GPU_FACTOR} x the site's {gpu}"
            if kind == DELAY and v > MAX_BE_DELAY_MS:
                return "be-delay", f"{key} = {v} ms > {MAX_BE_DELAY_MS:.0f}"
            if kind == BACKLOG and v > MAX_BE_DEFERRED_BYTES:
                return "be-backlog", f"{key} = {v} bytes > {MAX_BE_DEFERRED_BYTES:.3g}"
        for used, avail in pairs:
            # +1: a mean of PRBs rounded to an integer may round above the available ones
            if r[used] is not None and r[avail] is not None and r[used] > r[avail] + 1:
                return "above-cell", f"{keys[used]} = {r[used]} > {keys[avail]} = {r[avail]}"
    return None


class Ingest:
    """`decode` is the E2AP decoder (default: e2sm's, with its pycrate-free RICindication path); the
    benchmark passes `e2sm.e2ap.decode_e2ap_reference` for its baseline.

    The KPM header carries only informative fields (colletStartTime), but it is where a KPM version
    mismatch shows (v2.03 and v3.00 messages are the same bytes; headers differ in TimeStamp size), so
    every header is decoded (with e2sm's fast header reader, decoding only some saved nothing measurable
    in `weaver bench xapp`)."""

    def __init__(self, decode=decode_e2ap) -> None:
        _kpm_kernel.warm()      # compile the KPM records walk before the first indication, not on it
        self.decode = decode
        self.subs: dict[int, KpmSubscription] = {}
        self.errors: dict[str, int] = {}
        self.refused: dict[tuple[str, str], int] = {}      # (meid, reason) -> frames refused for their values
        self.limits: dict[str, NodeLimits] = {}            # meid -> bounds from its site's config
        self.accepted = 0

    def set_limits(self, sites) -> None:
        """Bounds per node from the sites of the config (xapp.config SiteConfig)."""
        self.limits = {m: NodeLimits(s.gpu_sms) for s in sites for m in s.nodes}

    def add(self, sub: KpmSubscription) -> None:
        self.subs[sub.sub_id] = sub

    def remove(self, sub_id: int) -> None:
        self.subs.pop(sub_id, None)

    def _fail(self, kind: str, message: str) -> IngestError:
        self.errors[kind] = self.errors.get(kind, 0) + 1
        return IngestError(kind, message)

    def indication(self, sub_id: int, meid: str, payload: bytes, now: float) -> KpmSample:
        sub = self.subs.get(sub_id)
        if sub is None:
            raise self._fail("unknown-subscription", f"sub_id {sub_id} from {meid!r} is not one of ours")
        if meid and meid != sub.meid:
            raise self._fail("unknown-node", f"sub_id {sub_id} belongs to {sub.meid!r}, frame says {meid!r}")
        try:
            ind = self.decode(payload)
        except E2DecodeError as exc:
            raise self._fail("e2ap", f"{len(payload)} bytes from {sub.meid}: {exc}") from None
        if not isinstance(ind, RicIndication):
            raise self._fail("e2ap", f"mtype 12050 from {sub.meid} carried a {type(ind).__name__}")
        if ind.ran_function_id != sub.ran_function_id:
            raise self._fail("unknown-subscription", f"{sub.meid}: RAN function {ind.ran_function_id}, "
                                                     f"subscribed {sub.ran_function_id}")
        try:
            collected = decode_indication_header(ind.header, sub.version).collect_start_time
            msg = decode_indication_message(ind.message, sub.version)
        except E2DecodeError as exc:
            raise self._fail("e2sm", f"KPM {sub.version.name} from {sub.meid}: {exc}") from None
        if not isinstance(msg, IndicationMessageFormat1):
            raise self._fail("shape", f"{sub.meid}: expected KPM message format 1, got {type(msg).__name__}")
        keys = _keys(msg.meas_info) if msg.meas_info is not None else sub.meas
        if any(len(r) != len(keys) for r in msg.records):
            raise self._fail("shape", f"{sub.meid}: records of {[len(r) for r in msg.records]} items "
                                      f"for {len(keys)} measurements")
        bad = check_values(msg.records, keys, self.limits.get(sub.meid), msg.granul_period_ms)
        if bad is not None:
            reason, detail = bad
            self.errors["value"] = self.errors.get("value", 0) + 1
            self.refused[(sub.meid, reason)] = self.refused.get((sub.meid, reason), 0) + 1
            raise KpmValueError(KpmRefusal(sub.meid, now, reason, detail))
        self.accepted += 1
        collected_s, res = collection_seconds(collected, sub.version)
        return KpmSample(meid=sub.meid, received=now, collected=collected,
                         values=fold(msg.records, keys), sn=ind.sn, collected_s=collected_s, collected_res_s=res)
