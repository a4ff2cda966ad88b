"""`weaver-xapp --record`: the recorder writes its lines in batches (not one write and flush per loop
step), loses none of them on close, and what it wrote reads back step by step."""
from __future__ import annotations

import os

from test_xapp_loop import cfg, kpm, setup

from xapp import record
from xapp.loop import Inputs, step


def run_steps(rec: record.LoopRecorder, st, n: int) -> None:
    """`n` more recorded loop steps, one period apart (the loop's clock goes on from its last tick)."""
    first = round(st.next_tick / 0.1) - 1
    for i in range(first, first + n):
        t = 0.1 * (i + 1)
        inputs = Inputs(samples=(kpm("n1", t), kpm("n2", t)), agents=frozenset({"s1", "s2"}))
        rec.before(st)
        _, actions = step(st, t, inputs)
        rec.after(st, t, inputs, actions)


def test_the_recorder_batches_its_writes_and_keeps_every_line_on_close(tmp_path, monkeypatch):
    monkeypatch.setattr(record, "FLUSH_S", 3600.0)         # only the line count triggers a write here
    path = tmp_path / "loop.jsonl"
    st = setup(cfg())
    rec = record.LoopRecorder(str(path))
    rec.begin(st, None)
    run_steps(rec, st, record.FLUSH_LINES - 2)
    assert os.path.getsize(path) == 0                      # nothing written yet: one batch is not full
    run_steps(rec, st, 1)
    assert os.path.getsize(path) > 0                       # the 64th line (start + 63 steps) wrote the batch
    written = path.read_text().count("\n")
    assert written == record.FLUSH_LINES
    run_steps(rec, st, 5)
    assert path.read_text().count("\n") == written        # buffered again
    rec.close()
    start, steps = record.read_record(str(path))
    assert start["kind"] == "start" and len(steps) == record.FLUSH_LINES - 1 + 5 == rec.lines - 1
    assert [s["t"] for s in steps] == [0.1 * (i + 1) for i in range(len(steps))]   # in order, none lost


def test_the_recorder_writes_at_least_once_a_second(tmp_path, monkeypatch):
    path = tmp_path / "loop.jsonl"
    st = setup(cfg())
    clock = [100.0]
    monkeypatch.setattr(record.time, "monotonic", lambda: clock[0])
    rec = record.LoopRecorder(str(path))
    rec.begin(st, None)
    run_steps(rec, st, 3)
    assert os.path.getsize(path) == 0
    clock[0] += record.FLUSH_S                             # a second later the next step writes them all
    run_steps(rec, st, 1)
    assert path.read_text().count("\n") == 5
    rec.close()
