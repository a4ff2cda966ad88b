"""Real KPM indications (E2AP RICindication carrying a KPM v3/v2 header and format-1 message), built with
the project's e2sm encoders, for the xApp's tests."""
from __future__ import annotations

from e2sm.e2ap import RicIndication, RicRequestId, encode_e2ap
from e2sm.kpm import (
    IndicationMessageFormat1,
    KpmIndicationHeader,
    KpmVersion,
    MeasInfo,
    MeasLabel,
    Snssai,
    encode_indication_header,
    encode_indication_message,
)


def meas_info(key: str) -> MeasInfo:
    name, _, sl = key.partition("@")
    if not sl:
        return MeasInfo(name)
    sst, _, sd = sl.partition(":")
    return MeasInfo(name, (MeasLabel(Snssai(int(sst), int(sd) if sd else None)),))


def indication(values: dict[str, list], version: KpmVersion = KpmVersion.V3_00, ran_function_id: int = 2,
               with_info: bool = True, sn: int = 1, request=(123, 1), t: int = 0) -> bytes:
    keys = list(values)
    n = len(next(iter(values.values())))
    records = tuple(tuple(values[k][i] for k in keys) for i in range(n))
    msg = IndicationMessageFormat1(records, tuple(meas_info(k) for k in keys) if with_info else None, 100)
    hdr = KpmIndicationHeader(collect_start_time=t if version is KpmVersion.V3_00 else t & 0xFFFFFFFF)
    return encode_e2ap(RicIndication(RicRequestId(*request), ran_function_id, 1,
                                     encode_indication_header(hdr, version), encode_indication_message(msg, version),
                                     sn=sn))
