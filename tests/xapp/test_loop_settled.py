"""The xApp counts a control's outcome (ACK, FAILURE, timeout) as the loop settled it (`LoopState.settled`),
not by matching the replies a second time: a reply the loop does not take as its control's -- another
xApp's control with the same RIC instance at the node, told apart only by its requestor ID -- counts as
nothing, and the control is still counted once when its own reply (or its timeout) comes."""
from __future__ import annotations

import asyncio

from test_xapp_loop import cfg, kpm, setup

from xapp.app import XappApp
from xapp.loop import ControlOutcome, SendControl


def test_the_xapp_counts_control_outcomes_as_the_loop_matched_them():
    asyncio.run(_counts())


async def _counts():
    c = cfg()
    x = XappApp(c)
    x.state = setup(c)
    sent: list = []

    async def perform(a):               # the shell's RMR send, here a list
        sent.append(a)

    x._perform = perform

    async def tick(t, results=()):
        x.now = lambda: t
        x.samples = [kpm("n1", t), kpm("n2", t)]
        x.results = list(results)
        await x.tick()

    await tick(0.1)
    by_node = {a.meid: a for a in sent if isinstance(a, SendControl)}
    n1 = by_node["n1"]
    assert set(x.state.pending) == {n1.control_id, by_node["n2"].control_id}
    foreign = ControlOutcome(instance=n1.wire_instance, ok=True, meid="n1", requestor=999)
    await tick(0.15, [foreign])
    assert x.counters.controls_acked == 0 and x.counters.controls_failed == 0   # not our reply
    assert n1.control_id in x.state.pending
    await tick(0.2, [ControlOutcome(instance=n1.wire_instance, ok=True, meid="n1")])
    assert x.counters.controls_acked == 1 and x.site_tally("s1").rc_controls_acked == 1
    await tick(0.45)                    # n2's control was never answered: 300 ms control timeout
    assert x.counters.controls_acked == 1 and x.counters.controls_failed == 1
    assert x.site_tally("s2").rc_controls_failed == 1
    assert [e["result"] for e in x.controls_log if e["control_id"] == n1.control_id][-1] == "ack"
