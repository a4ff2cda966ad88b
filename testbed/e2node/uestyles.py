"""KPM report styles 2-5 on the simulated DU: which UEs an action names or matches, and its indication message.

Per E2SM-KPM (v03.00 / v04.00 section 7.4): style N takes action definition format N.
- 2, one UE (`ueID`): indication message format 1 with that UE's values.
- 3, condition-based (`measCondList`): message format 2, one record item per condition item: the sum over
  the UEs that match it (their mean for the delay), with those UEs in `matchingUEidList` (left out, and the
  value noValue, when none matches).
- 4, common conditions (`matchingUeCondList`): message format 3, one format-1 report per matching UE.
- 5, a UE list (`matchingUEidList`, at least 2 IDs as the standard and srsRAN require): message format 3 for
  each listed UE the node has.
A period in which no UE matches a style-4 action sends no indication for it (format 3 needs one report).

UEs are named by `gNB-DU-UEID` (gNB-CU UE F1AP ID), as srsRAN and the oran-sc-ric examples do. Matching
conditions: a `testCondInfo` of `ul-rSRP`, `dl-rSRP` or `cQI` (the UE's fixed radio state) with `equal`,
`greaterthan`, `lessthan` or `present` (no expression: present) against a `valueInt`; a `measLabel` with a
`sliceID` (UEs of that slice) or `noLabel` (every UE). Items combine by AND, or by OR after one sent with
`logicalOR`. Anything else is refused at subscription (action-not-supported).
"""
from __future__ import annotations

from dataclasses import dataclass

from e2sm import e2ap, kpm
from e2sm.common import GnbDuUeId

from .config import NodeConfig
from .dialects import style3_ignores_conditions
from .measure import SiteMeasurements, measure_ue

TEST_TYPES = {"ul-rSRP": "ul_rsrp", "dl-rSRP": "dl_rsrp", "cQI": "cqi"}
TEST_EXPRS = ("equal", "greaterthan", "lessthan", "present")
_MEANS = ("DRB.RlcSduDelayDl",)


def _cause(value: str) -> e2ap.Cause:
    return e2ap.Cause("ricRequest", value)


@dataclass(frozen=True)
class UePlan:
    """One admitted UE-level action: its style, cell scope, what it measures and whom."""

    style: int
    cell: int | None
    granul_period_ms: int
    infos: tuple[kpm.MeasInfo, ...]                       # styles 2, 4, 5: the per-UE format-1 report
    specs: tuple[tuple[str, tuple[int, int | None] | None], ...]
    ue_ids: tuple[int, ...] = ()                           # styles 2, 5
    ue_conds: tuple = ()                                   # style 4
    meas_conds: tuple[kpm.MeasCond, ...] = ()              # style 3


def _f1ap(ue_id) -> int | None:
    return ue_id.f1ap_id if isinstance(ue_id, GnbDuUeId) else None


def _check_cond(c, node: NodeConfig) -> bool:
    inner = c.cond if isinstance(c, kpm.OrNext) else c
    if isinstance(inner, kpm.MeasLabel):
        return inner.snssai is not None or not inner.other  # sliceID, or noLabel
    return (inner.test_type in TEST_TYPES and (inner.expr is None or inner.expr in TEST_EXPRS)
            and (inner.expr in (None, "present") or (inner.value is not None and inner.value[0] == "valueInt")))


def _cell(cgi, node: NodeConfig) -> int | None | e2ap.Cause:
    if cgi is None:
        return None
    cell = node.cell_of(cgi.cell_id) if cgi.plmn == node.plmn else None
    return _cause("requested-information-unavailable") if cell is None else cell


def plan(style: int, fmt, node: NodeConfig, ue_level: tuple[str, ...]) -> UePlan | e2ap.Cause:
    """The plan of a style 2-5 action definition, or the cause to refuse it with."""
    if style == 3:
        if not all(isinstance(c.name, str) and c.name in ue_level and c.bins is None for c in fmt.conds):
            return _cause("requested-information-unavailable")
        if not all(_check_cond(x, node) for c in fmt.conds for x in c.conds):
            return _cause("action-not-supported")
        cell = _cell(fmt.cell_global_id, node)
        if isinstance(cell, e2ap.Cause):
            return cell
        return UePlan(3, cell, fmt.granul_period_ms, (), (), meas_conds=fmt.conds)
    sub = fmt.subscription
    if any(m.name not in ue_level for m in sub.meas):
        return _cause("requested-information-unavailable")
    cell = _cell(sub.cell_global_id, node)
    if isinstance(cell, e2ap.Cause):
        return cell
    infos, specs = [], []
    for meas in sub.meas:
        for label in meas.labels:
            infos.append(kpm.MeasInfo(meas.name, (label,)))
            specs.append((str(meas.name), None if label.snssai is None else (label.snssai.sst, label.snssai.sd)))
    base = dict(style=style, cell=cell, granul_period_ms=sub.granul_period_ms, infos=tuple(infos), specs=tuple(specs))
    if style == 2:
        f1ap = _f1ap(fmt.ue_id)
        if f1ap is None or node.ues.get(f1ap) is None:
            return _cause("requested-information-unavailable")
        return UePlan(**base, ue_ids=(f1ap,))
    if style == 5:
        known = tuple(f for f in map(_f1ap, fmt.ue_ids) if f is not None and node.ues.get(f) is not None)
        if not known:
            return _cause("requested-information-unavailable")
        return UePlan(**base, ue_ids=known)
    if not all(_check_cond(c, node) for c in fmt.ue_conds):
        return _cause("action-not-supported")
    return UePlan(**base, ue_conds=fmt.ue_conds)


def _test(c, ue, node: NodeConfig) -> bool:
    if isinstance(c, kpm.MeasLabel):
        if c.snssai is None:
            return True
        own = node.slices[ue.slice]
        return c.snssai.sst == own.sst and (c.snssai.sd is None or c.snssai.sd == own.sd)
    if c.expr in (None, "present"):
        return True
    have, want = getattr(ue, TEST_TYPES[c.test_type]), c.value[1]
    return {"equal": have == want, "greaterthan": have > want, "lessthan": have < want}[c.expr]


def matches(conds, ue, node: NodeConfig) -> bool:
    """Conditions in order: AND, except after an item sent with logicalOR (`OrNext`), which ORs the next."""
    result, use_or = None, False
    for c in conds:
        inner = c.cond if isinstance(c, kpm.OrNext) else c
        ok = _test(inner, ue, node)
        result = ok if result is None else (result or ok) if use_or else (result and ok)
        use_or = isinstance(c, kpm.OrNext)
    return True if result is None else result


def _ue_report(m: SiteMeasurements, node: NodeConfig, ue, p: UePlan) -> kpm.IndicationMessageFormat1:
    values = tuple(measure_ue(m, node.slices, node.ues, ue, name, snssai) for name, snssai in p.specs)
    return kpm.IndicationMessageFormat1(records=(values,), meas_info=p.infos, granul_period_ms=p.granul_period_ms)


def report(m: SiteMeasurements, node: NodeConfig, p: UePlan) -> kpm.KpmIndicationMessage | None:
    """This period's indication message for a UE-level action (None: nothing to report)."""
    ues = node.ues.in_cell(p.cell)
    if p.style == 2:
        return _ue_report(m, node, node.ues.get(p.ue_ids[0]), p)
    if p.style in (4, 5):
        chosen = [u for u in ues if matches(p.ue_conds, u, node)] if p.style == 4 else \
            [node.ues.get(f) for f in p.ue_ids if p.cell is None or node.ues.get(f).cell == p.cell]
        if not chosen:
            return None
        return kpm.IndicationMessageFormat3(tuple(kpm.UeMeasReport(GnbDuUeId(u.f1ap_id), _ue_report(m, node, u, p))
                                                  for u in chosen))
    if style3_ignores_conditions(node):   # srsRAN: every UE of the node, one value each, the first item only
        c, every = p.meas_conds[0], node.ues.ues
        vals = tuple(measure_ue(m, node.slices, node.ues, u, str(c.name), None) for u in every)
        return kpm.IndicationMessageFormat2(
            records=(vals,), cond_ue=(kpm.MeasCondUe(c.name, c.conds, tuple(GnbDuUeId(u.f1ap_id) for u in every)),),
            granul_period_ms=p.granul_period_ms)
    values, cond_ue = [], []
    for c in p.meas_conds:
        hit = [u for u in ues if matches(c.conds, u, node)]
        vals = [measure_ue(m, node.slices, node.ues, u, str(c.name), None) for u in hit]
        vals = [v for v in vals if v is not None]
        if not vals:
            values.append(None)
        elif c.name in _MEANS:
            values.append(float(sum(vals) / len(vals)))
        else:
            values.append(sum(vals))
        cond_ue.append(kpm.MeasCondUe(c.name, c.conds, tuple(GnbDuUeId(u.f1ap_id) for u in hit) or None))
    return kpm.IndicationMessageFormat2(records=(tuple(values),), cond_ue=tuple(cond_ue),
                                        granul_period_ms=p.granul_period_ms)
