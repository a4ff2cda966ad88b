"""Each fault really happens on the wire or to the process: ACKs seen by an RMR listener standing in for
the E2 termination, bytes through the TCP proxy, a SIGSTOPped process that executes nothing."""
from __future__ import annotations

import asyncio
import sys
import time

import pytest

from e2sm import e2ap, rc
from testbed.e2node.config import node_configs
from testbed.e2node.shell import AckShaper, NodeShell
from testbed.faults import (
    AckDelay,
    FaultInjector,
    NodeLost,
    NodeRestart,
    Partition,
    RevokeMidPeriod,
    SlowReader,
    Targets,
    XappKill,
    XappStall,
    agent_env,
    busy_phase,
    check_sites,
    parse_fault,
    parse_faults,
)
from testbed.groundtruth import ProcCpuSampler
from testbed.model import CellConfig, RanModel, Scenario, SiteConfig
from testbed.procs import Supervisor
from testbed.tcpproxy import TcpProxy
from xapp.rmr import RmrEndpoint, RmrMessage

SCEN = Scenario("t", "one site", sites=(SiteConfig(0, cells=(CellConfig(),) * 2),))


# -- parsing -----------------------------------------------------------------------------------------

def test_parse_fault_specs():
    f = parse_fault("ack-delay:ms=500,for=3,at=8")
    assert f == AckDelay(at_s=8.0, ms=500.0, for_s=3.0) and f.site is None
    assert parse_fault("node-lost:site=1,down=2", default_at_s=4) == NodeLost(at_s=4.0, site=1, down_s=2.0)
    assert parse_fault("xapp-stall") == XappStall()
    assert parse_faults(["partition:for=1", "xapp-kill"], 6.0) == (Partition(at_s=6.0, for_s=1.0),
                                                                    XappKill(at_s=6.0))
    assert parse_fault("ack-delay:ms=500,for=3,at=8").describe() == "ack-delay:for=3.0,ms=500.0"
    for bad in ("nope", "ack-delay:bogus=1", "ack-delay:ms=x", "ack-delay:ms", "partition:for=-1"):
        with pytest.raises(ValueError):
            parse_fault(bad)
    with pytest.raises(ValueError):
        check_sites((NodeRestart(site=3),), 2)
    with pytest.raises(ValueError):
        check_sites((XappStall(),), 2, allowed=("ack-delay",))
    assert agent_env(parse_faults(["green-context-fail"])) == {"WEAVER_FAULT_GREEN_CONTEXT_FAIL": "1"}
    assert agent_env(()) == {}


# -- RIC control ACKs on the wire --------------------------------------------------------------------

def _control(instance: int) -> RmrMessage:
    hdr = rc.encode_control_header(rc.envelope_control_header())
    msg = rc.encode_control_message(rc.build_envelope_control(100, None))
    req = e2ap.RicControlRequest(e2ap.RicRequestId(7, instance), 3, hdr, msg)
    return RmrMessage(12040, e2ap.encode_e2ap(req), meid="gnb_001_01_00000001")


async def _acks_through(shaper: AckShaper | None, n: int, gap_s: float = 0.05, wait_s: float = 1.0,
                        release: bool = False) -> list[tuple[int, float]]:
    """Send `n` controls to a real node shell from an RMR listener (the E2T's stand-in); return
    (request instance, arrival time after the control was sent) of every ACK that listener receives."""
    model = RanModel(SCEN, seed=0)
    cfg = node_configs(SCEN)[0]
    e2t = await RmrEndpoint.open(0, src_id="127.0.0.1", bind_if="127.0.0.1", env={})
    shell = await NodeShell.open(cfg, model, e2t.src)
    shell.ack_shaper = shaper
    got: list[tuple[int, float]] = []
    sent_at: dict[int, float] = {}
    loop = asyncio.get_running_loop()
    try:
        async def rx():
            while True:
                m = await e2t.receive()
                if m.mtype == 12041:
                    inst = e2ap.decode_e2ap(m.payload).request_id.instance
                    got.append((inst, loop.time() - sent_at[inst]))
        task = asyncio.ensure_future(rx())
        for i in range(1, n + 1):
            sent_at[i] = loop.time()
            await e2t.wormhole_send(shell.ep.src, _control(i))
            await asyncio.sleep(gap_s)
        if release and shaper is not None:
            await asyncio.sleep(0.2)
            shell.ack_shaper = None
            await shaper.release(shell)
        await asyncio.sleep(wait_s)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    finally:
        await shell.close()
        await e2t.close()
    return got


def test_ack_delay_arrives_late():
    base = asyncio.run(_acks_through(None, 2, wait_s=0.3))
    assert [i for i, _ in base] == [1, 2] and all(dt < 0.2 for _, dt in base)
    got = asyncio.run(_acks_through(AckShaper("delay", 400), 2, wait_s=0.8))
    assert [i for i, _ in got] == [1, 2]
    assert all(dt >= 0.4 for _, dt in got), got


def test_ack_loss_never_arrives():
    sh = AckShaper("loss")
    assert asyncio.run(_acks_through(sh, 3, wait_s=0.5)) == []
    assert sh.counts["lost"] == 3


def test_ack_duplicate_arrives_twice():
    got = asyncio.run(_acks_through(AckShaper("duplicate"), 2, wait_s=0.3))
    assert [i for i, _ in got] == [1, 1, 2, 2]


def test_ack_reorder_swaps_and_releases():
    got = asyncio.run(_acks_through(AckShaper("reorder"), 3, wait_s=0.3, release=True))
    # 1 is held until 2 has gone out; 3 is held until the fault ends
    assert [i for i, _ in got] == [2, 1, 3]


def test_ack_fault_through_the_injector():
    class _Sim:
        def __init__(self, shell):
            self.nodes = [shell]

    async def go():
        model = RanModel(SCEN, seed=0)
        e2t = await RmrEndpoint.open(0, src_id="127.0.0.1", bind_if="127.0.0.1", env={})
        shell = await NodeShell.open(node_configs(SCEN)[0], model, e2t.src)
        said: list[str] = []
        inj = FaultInjector((parse_fault("ack-loss:at=0,for=0.5"),), Targets(sim=_Sim(shell)),
                            notify=lambda e, what: said.append(f"{e['kind']} {what}"))
        inj.start()
        await asyncio.sleep(0.1)
        installed = shell.ack_shaper is not None
        await e2t.wormhole_send(shell.ep.src, _control(1))
        lost = True
        try:
            await e2t.receive(timeout=0.3)
            lost = False
        except TimeoutError:
            pass
        await asyncio.sleep(0.3)
        await e2t.wormhole_send(shell.ep.src, _control(2))
        back = await e2t.receive(timeout=1.0)
        await inj.close()
        await shell.close()
        await e2t.close()
        return installed, lost, back, inj.timeline, said

    installed, lost, back, timeline, said = asyncio.run(go())
    assert installed and lost and back.mtype == 12041
    assert said == ["ack-loss start", "ack-loss end"]
    [e] = timeline
    assert e["kind"] == "ack-loss" and e["end_s"] >= e["start_s"] + 0.5 and e["counts"]["lost"] == 1


# -- the TCP proxy -----------------------------------------------------------------------------------

async def _echo_server():
    async def handle(r, w):
        while data := await r.read(4096):
            w.write(data)
            await w.drain()
        w.close()
    srv = await asyncio.start_server(handle, "127.0.0.1", 0)
    return srv, srv.sockets[0].getsockname()[1]


def test_proxy_forwards_stalls_and_trickles():
    async def go():
        srv, port = await _echo_server()
        proxy = await TcpProxy("127.0.0.1", port).start()
        r, w = await asyncio.open_connection("127.0.0.1", proxy.port)
        w.write(b"hello")
        await w.drain()
        assert await asyncio.wait_for(r.readexactly(5), 1.0) == b"hello"
        # partition: nothing passes for the stall, everything after it, on the same connection
        proxy.stall("both", 0.6)
        t0 = time.monotonic()
        w.write(b"ping")
        await w.drain()
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(r.readexactly(4), 0.4)
        rest = await asyncio.wait_for(r.readexactly(4), 2.0)
        stalled_for = time.monotonic() - t0
        # slow reader: the return direction trickles at 100 B/s
        proxy.trickle("down", 100, 5.0)
        t1 = time.monotonic()
        w.write(b"x" * 50)
        await w.drain()
        await asyncio.wait_for(r.readexactly(50), 3.0)
        trickle_s = time.monotonic() - t1
        proxy.heal()
        w.write(b"y" * 1000)
        await w.drain()
        await asyncio.wait_for(r.readexactly(1000), 1.0)
        w.close()
        await proxy.close()
        srv.close()
        return rest, stalled_for, trickle_s, proxy.stats

    rest, stalled_for, trickle_s, stats = asyncio.run(go())
    assert rest == b"ping" and stalled_for >= 0.55
    assert trickle_s >= 0.3  # 50 bytes at 100 B/s in 5-byte slices
    assert stats.connections == 1 and stats.bytes["down"] == 5 + 4 + 50 + 1000


def test_proxy_stall_is_bounded():
    """A stalled direction holds at most one chunk in the proxy: the sender backs up instead."""
    async def go():
        got = bytearray()

        async def sink(r, w):
            while data := await r.read(65536):
                got.extend(data)

        srv = await asyncio.start_server(sink, "127.0.0.1", 0)
        proxy = await TcpProxy("127.0.0.1", srv.sockets[0].getsockname()[1], chunk=4096).start()
        proxy.stall("up", 0.5)
        r, w = await asyncio.open_connection("127.0.0.1", proxy.port)
        w.write(b"z" * 200_000)
        await asyncio.sleep(0.3)
        during = len(got)
        await asyncio.wait_for(w.drain(), 3.0)
        await asyncio.sleep(0.3)
        w.close()
        await proxy.close()
        srv.close()
        return during, len(got)

    during, after = asyncio.run(go())
    assert during == 0 and after == 200_000


# -- process faults ----------------------------------------------------------------------------------

SPIN_FOREVER = "import sys\nprint('ready', flush=True)\nwhile True: pass\n"


def test_sigstop_really_stops_the_process(tmp_path):
    sup = Supervisor(log_dir=tmp_path)
    child = sup.start("xapp", [sys.executable, "-c", SPIN_FOREVER])
    try:
        child.wait_for_line("ready", 10)
        s = ProcCpuSampler(child.proc.pid)
        s.sample()

        async def go():
            inj = FaultInjector((XappStall(at_s=0.0, ms=600),), Targets(supervisor=sup))
            inj.start()
            await asyncio.sleep(0.15)
            state = open(f"/proc/{child.proc.pid}/stat").read().rsplit(")", 1)[1].split()[0]
            s.sample()
            await asyncio.sleep(0.3)
            stopped_cpu = s.sample()
            await asyncio.sleep(0.4)  # SIGCONT at 0.6 s
            s.sample()
            await asyncio.sleep(0.3)
            running_cpu = s.sample()
            await inj.close()
            return state, stopped_cpu, running_cpu, inj.timeline

        state, stopped_cpu, running_cpu, timeline = asyncio.run(go())
        assert state == "T"
        assert stopped_cpu == 0.0
        assert running_cpu > 0.05
        assert timeline[0]["end_s"] - timeline[0]["start_s"] >= 0.6
    finally:
        sup.stop_all()


def test_xapp_kill_restarts_with_the_same_command(tmp_path):
    sup = Supervisor(log_dir=tmp_path)
    code = "import os\nprint('ready', os.environ['MARK'], os.getpid(), flush=True)\nimport time\ntime.sleep(60)\n"
    first = sup.start("xapp", [sys.executable, "-c", code], env={"MARK": "m1"})
    try:
        first.wait_for_line("ready", 10)
        old_pid = first.proc.pid

        async def ready(child):
            await asyncio.to_thread(child.wait_for_line, "ready", 10)

        async def go():
            inj = FaultInjector((XappKill(at_s=0.0, down_s=0.2),), Targets(supervisor=sup, xapp_ready=ready))
            inj.start()
            await asyncio.sleep(0.1)
            failed_during = [c.name for c in sup.failed()]
            while not inj.timeline or inj.timeline[0]["end_s"] is None:
                await asyncio.sleep(0.05)
            await inj.close()
            return failed_during, inj.timeline

        failed_during, timeline = asyncio.run(go())
        new = sup.get("xapp")
        assert first.proc.returncode == -9  # SIGKILL, not a clean stop
        assert new.proc.pid != old_pid and new.alive and new.wait_for_line(r"ready \S+", 5).group(0) == "ready m1"
        assert failed_during == [] and sup.failed() == []
        assert str(old_pid) in timeline[0]["note"]
    finally:
        sup.stop_all()


def test_slow_reader_and_partition_act_on_the_site_proxy():
    async def go():
        srv, port = await _echo_server()
        proxy = await TcpProxy("127.0.0.1", port).start()
        inj = FaultInjector((SlowReader(at_s=0.0, site=0, for_s=0.5, rate=0),
                             Partition(at_s=0.8, site=0, for_s=0.5)), Targets(proxies={0: proxy}))
        r, w = await asyncio.open_connection("127.0.0.1", proxy.port)
        inj.start()
        await asyncio.sleep(0.1)
        w.write(b"a")
        await w.drain()
        t0 = time.monotonic()
        await asyncio.wait_for(r.readexactly(1), 2.0)
        slow = time.monotonic() - t0
        await asyncio.sleep(max(0.0, 0.9 - inj.now()))
        w.write(b"b")
        await w.drain()
        t1 = time.monotonic()
        await asyncio.wait_for(r.readexactly(1), 2.0)
        part = time.monotonic() - t1
        await asyncio.sleep(0.5)
        await inj.close()
        w.close()
        await proxy.close()
        srv.close()
        return slow, part, inj.timeline

    slow, part, timeline = asyncio.run(go())
    assert slow >= 0.3 and part >= 0.3
    assert [e["kind"] for e in timeline] == ["slow-reader", "partition"]


def test_node_restart_and_lost_node_in_the_simulation():
    from testbed.sim import SimConfig, Simulation

    async def go():
        sim = await Simulation.start(SimConfig(n_sites=1, n_cells=1, keepalive_s=None))
        try:
            sim.model.set_envelope(0, 50)
            setups = sim.ric.e2term.stats.setups
            port0 = sim.nodes[0].ep.src
            inj = FaultInjector((NodeRestart(at_s=0.0, site=0, down_s=0.1),
                                 NodeLost(at_s=0.5, site=0, down_s=0.3)), Targets(sim=sim))
            inj.start()
            await asyncio.sleep(0.35)
            after_restart = (sim.model.envelope[0], sim.ric.e2term.stats.setups, sim.nodes[0].ep.src,
                             sim.nodes[0].node.connected)
            sim.model.set_envelope(0, 60)
            await asyncio.sleep(0.3)
            during_loss = 0 in sim.stopped
            await asyncio.sleep(0.8)
            after_loss = (sim.model.envelope[0], sim.ric.e2term.stats.setups, 0 in sim.stopped)
            await inj.close()
            return setups, port0, after_restart, during_loss, after_loss, inj.timeline
        finally:
            await sim.close()

    setups, port0, after_restart, during_loss, after_loss, timeline = asyncio.run(go())
    env, n, addr, connected = after_restart
    assert env == float("inf") and n == setups + 1 and addr != port0 and connected
    assert during_loss
    assert after_loss == (60.0, setups + 2, False)  # a lost node keeps its RC state
    assert [e["kind"] for e in timeline] == ["node-restart", "node-lost"]



def _cpu(busy, t0=0.0, t1=0.35, step=0.002):
    t = [t0 + k * step for k in range(int((t1 - t0) / step))]
    cpu, c = [], 0.0
    for x in t:
        cpu.append(c)
        if any(a <= x < b for a, b in busy):
            c += step
    return t, cpu


def test_busy_phase_finds_the_agents_period_grid():
    # busy 40 ms at the front of each 100 ms period from 0.012, with a 2 ms hand-off inside each stretch
    busy = [(s, s + 0.02) for s in (0.012, 0.112, 0.212, 0.312)] + \
           [(s + 0.022, s + 0.04) for s in (0.012, 0.112, 0.212, 0.312)]
    t, cpu = _cpu(busy)
    t_on, into = busy_phase(t, cpu, 0.1)
    assert t_on == pytest.approx(0.312) and into == pytest.approx(0.016, abs=0.001)   # 40 % of 40 ms
    t, cpu = _cpu([(0.0, 0.35)])
    assert busy_phase(t, cpu, 0.1) == (t[-1], 0.0)            # busy throughout: any instant
    t, cpu = _cpu([])
    assert busy_phase(t, cpu, 0.1) is None                     # idle
    t, cpu = _cpu([(0.05, 0.09), (0.2, 0.24)])                 # not a period apart: no grid yet
    assert busy_phase(t, cpu, 0.1) is None
    f = parse_fault("revoke-mid-period:site=0,for=8,down=0.3")
    assert isinstance(f, RevokeMidPeriod) and f.for_s == 8.0 and f.down_s == 0.3 and f.stale == 200.0
