"""Bad input to the model's boundaries: recorded traces and controls. Invariant: any input is either
accepted (and the model stays consistent) or refused with the package's error, changing nothing."""
from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from testbed.model import (
    CellConfig,
    CsvTrace,
    ModelConfigError,
    RanModel,
    Scenario,
    SiteConfig,
    TraceFormatError,
)

SC = Scenario(name="b", description="b", sites=(SiteConfig(site_id=0, cells=(CellConfig(),) * 2),))
ROWS = st.lists(st.tuples(st.sampled_from(["0", "0.001", "-1", "nan", "inf", "1e9", "x", ""]),
                          st.sampled_from(["0", "1", "0/1", "1/0", "9", "a/b", "-1", ""]),
                          st.sampled_from(["5", "0", "-3", "nan", "1e30", "q", ""]),
                          st.sampled_from(["dl", "ul", "DL", "up", ""])), max_size=6)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.binary(max_size=300))
def test_any_bytes_load_as_a_trace_or_raise_trace_format_error(tmp_path, data):
    f = tmp_path / "fuzz.csv"
    f.write_bytes(data)
    try:
        tr = CsvTrace(SC, f)
    except TraceFormatError:
        return
    arr = tr.arrivals(0, 10)
    assert np.all(np.isfinite(arr.dl)) and np.all(arr.dl >= 0)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ROWS, st.sampled_from(["bytes", "prb"]))
def test_csv_rows_load_or_are_refused_with_the_line(tmp_path, rows, unit):
    f = tmp_path / "rows.csv"
    f.write_text(f"time_s,cell,{unit},dir\n" + "".join(",".join(r) + "\n" for r in rows))
    try:
        tr = CsvTrace(SC, f)
    except TraceFormatError as exc:
        assert "rows.csv" in str(exc)
        return
    m = RanModel(SC, seed=0, trace=tr)
    m.step_period()
    assert np.all(np.isfinite(m.served_bytes))


NUM = st.floats(-50, 150) | st.sampled_from([float("nan"), float("inf"), -float("inf")])


@settings(max_examples=200, deadline=None)
@given(st.integers(-2, 3), st.integers(-2, 3), st.integers(0, 3), st.sampled_from([None, 1, 2, 9]),
       NUM, NUM, NUM, NUM, NUM)
def test_controls_are_applied_or_refused_without_change(site, cell, sst, sd, mn, mx, ded, env, train):
    m = RanModel(SC, seed=0)
    for call in (lambda: m.set_slice_quota(site, cell, sst, sd, mn, mx, ded),
                 lambda: m.set_envelope(site, env),
                 lambda: m.set_training_sms(site, train)):
        before = (m.quota.copy(), m.envelope.copy(), m.training_sms.copy())
        try:
            call()
        except ModelConfigError:
            after = (m.quota, m.envelope, m.training_sms)
            assert all(np.array_equal(a, b) for a, b in zip(before, after, strict=True))
    assert np.all((m.quota >= 0) & (m.quota <= 1))
    assert np.all(m.quota[..., 0] <= m.quota[..., 1])
    assert np.all(m.envelope >= 0)
    assert np.all((m.training_sms >= 0) & (m.training_sms <= 132))
    m.step_period()  # still runs
