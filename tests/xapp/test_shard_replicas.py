"""Three xApp replicas on one SDL namespace with `replicas.shards` (xapp.shards, xapp.app): each controls the
sites of the shards it claims, and only those; a replica's broker sends an agent of another shard to the
broker that serves it; a replica that dies is taken over once its claims ended, and its sites wait out its
leases before the next grant. Real Redis, real gRPC, real XappApp instances; wall clocks are passed in."""
from __future__ import annotations

import asyncio
import math

import grpc
import pytest
from xapp_harness import standalone_controls, until

from schemas.proto.weaver.v1 import lease_pb2
from schemas.redirect import REDIRECT_METADATA
from xapp.app import XappApp
from xapp.config import XappConfig
from xapp.loop import LoopState, controls_site
from xapp.shardkeeper import SHARD_TTL_S
from xapp.shards import assign, shard_of
from xapp.state import open_store

NS = "weaver-shard-replicas"
SITES = [f"site-{i}" for i in range(16)]
N_SHARDS = 6


def controls(shards=N_SHARDS):
    c = standalone_controls(NS)
    c["sites"] = [{"site_id": s, "gpu_sms": 132, "granularity": 8, "nodes": [f"gnb-{i}"]}
                  for i, s in enumerate(SITES)]
    c["e2"]["static_nodes"] = [{"meid": f"gnb-{i}", "kpm_function_id": 2} for i in range(len(SITES))]
    c["broker"]["token_env"] = "WEAVER_TEST_NO_SUCH_SECRET"    # unset: agents register without a proof
    c["replicas"] = {"shards": shards}
    return c


class Clock:
    def __init__(self) -> None:
        import time
        self.time, self.skew = time.time, 0.0

    def __call__(self) -> float:
        return self.time() + self.skew


def _owned(app: XappApp) -> set[str]:
    return set(app.state.controlled_sites or ())


def _expected(apps) -> dict[str, str]:
    shard_owner = assign(N_SHARDS, [a.leader_id for a in apps])
    return {s: shard_owner[shard_of(s, N_SHARDS)] for s in SITES}


def _split_as_assigned(apps) -> bool:
    want = _expected(apps)
    return all(_owned(a) == {s for s, r in want.items() if r == a.leader_id} for a in apps)


def _disjoint(apps) -> None:
    seen: dict[str, str] = {}
    for a in apps:
        for s in SITES:
            if controls_site(a.state, s):
                assert s not in seen, f"{s} controlled by {seen[s]} and {a.leader_id}"
                seen[s] = a.leader_id


async def _register(port: int, site: str):
    """A Register as an agent sends it; returns (status code, details, trailing metadata) or the Welcome."""
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
        call = ch.stream_stream("/weaver.v1.LeaseBroker/Session", request_serializer=lambda b: b,
                                response_deserializer=lease_pb2.BrokerMessage.FromString)
        msg = lease_pb2.AgentMessage(register=lease_pb2.Register(
            site_id=site, agent_id="agent-t", mode="gpu",
            device=lease_pb2.DeviceFacts(kind="cuda", name="H200", sm_count=132, granularity=8)))

        async def requests():
            yield msg.SerializeToString()
            await asyncio.sleep(0.5)
        c = call(requests())
        try:
            first = await c.read()
            c.cancel()
            return first
        except grpc.aio.AioRpcError as exc:
            return exc.code(), exc.details(), dict(exc.trailing_metadata() or ())


def test_three_replicas_split_the_sites_redirect_agents_and_take_over_a_dead_one(redis_env):
    asyncio.run(_three())


async def _three():
    cfg = XappConfig.from_controls(controls())
    clocks = [Clock(), Clock(), Clock()]
    apps = [XappApp(cfg, wall=c) for c in clocks]
    started = []
    try:
        for a in apps:
            await a.start(rest_port=0, broker_listen="127.0.0.1:0", rmr_port=0)
            started.append(a)
        await until(lambda: _split_as_assigned(apps), 8, "the shards to settle over three replicas")
        _disjoint(apps)
        assert all(a.readiness()["leader"] for a in apps if _owned(a))
        # every SDL claim is held by the replica the assignment names
        claims = open_store(NS).shard_claims()
        names = {a.leader_id for a in apps}
        assert {c.owner for c in claims.values()} <= names and len(claims) == N_SHARDS

        # an agent of a site reaches a replica that does not control it: refused, sent to the one that does
        owner = {s: next(a for a in apps if s in _owned(a)) for s in SITES}
        site = SITES[0]
        other = next(a for a in apps if a is not owner[site])
        code, details, md = await _register(other.broker.port, site)
        assert code == grpc.StatusCode.UNAVAILABLE and "another xApp replica" in details
        assert md[REDIRECT_METADATA] == f"127.0.0.1:{owner[site].broker.port}"
        assert other.broker.refused_registrations.get("other-shard") == 1
        welcome = await _register(owner[site].broker.port, site)
        assert welcome.welcome.site_id == site

        # the loop of a replica acts only on its own sites: the others' are "other-shard"
        await asyncio.sleep(0.3)
        for a in apps:
            for s in SITES:
                rt = a.state.sites[s]
                if s not in _owned(a) and rt.last_view is not None:
                    assert rt.grant_sms == 0

        # a replica dies (no hand-over, no release): its claims run out, then the others take its shards
        dead = max(apps, key=lambda a: len(_owned(a)))
        dead_sites = _owned(dead)
        assert dead_sites
        for t in dead._tasks:
            t.cancel()
        await asyncio.gather(*dead._tasks, return_exceptions=True)
        dead._tasks = []
        t_kill = clocks[0]()
        live = [a for a in apps if a is not dead]
        await until(lambda: dead_sites <= _owned(live[0]) | _owned(live[1]), SHARD_TTL_S + 6,
                    "the dead replica's sites to be taken over")
        took_at = clocks[0]()
        assert took_at - t_kill >= SHARD_TTL_S - 1.5     # not before its claims could have ended
        assert _split_as_assigned(live)
        _disjoint(live)
        # each taken site waits out the dead replica's leases (at least a lease lifetime) before a grant
        lifetime = cfg.lease_valid_periods * cfg.period_s
        for a in live:
            for s in dead_sites & _owned(a):
                nb = a.state.site_grant_not_before.get(s, -math.inf)
                assert nb >= a.now() - 2.0 and nb - lifetime > a.now() - 3.0, (s, nb, a.now())
                assert all(n.known is None for n in a.state.sites[s].safety.nodes.values())
        claims = open_store(NS).shard_claims()
        for k in {shard_of(s, N_SHARDS) for s in dead_sites}:
            assert claims[k].owner != dead.leader_id and claims[k].epoch >= 2
    finally:
        for a in started:
            await a.stop()
    assert all(not c.live(clocks[0]()) for c in open_store(NS).shard_claims().values())   # released at stop


def test_without_shards_the_leader_controls_every_site():
    st = LoopState.__dataclass_fields__
    assert st["controlled_sites"].default is None     # None: the leader lease alone decides (every site)


@pytest.mark.parametrize("bad", [-1, 5000, "3"])
def test_a_bad_shard_count_is_refused(bad):
    from xapp.config import ConfigError
    with pytest.raises(ConfigError, match="replicas"):
        XappConfig.from_controls(controls(shards=bad))


async def _open_session(port: int, site: str) -> tuple[asyncio.Task, asyncio.Event]:
    """An agent's stream that stays open (it heartbeats nothing: the broker's agent timeout is longer than the
    test); the task ends when the broker closes it."""
    welcomed = asyncio.Event()
    ch = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    call = ch.stream_stream("/weaver.v1.LeaseBroker/Session", request_serializer=lambda b: b,
                            response_deserializer=lease_pb2.BrokerMessage.FromString)
    msg = lease_pb2.AgentMessage(register=lease_pb2.Register(
        site_id=site, agent_id=f"agent-{site}", mode="gpu",
        device=lease_pb2.DeviceFacts(kind="cuda", name="H200", sm_count=132, granularity=8)))
    stop = asyncio.Event()

    async def requests():
        yield msg.SerializeToString()
        await stop.wait()

    async def read():
        c = call(requests())
        try:
            async for m in c:
                if m.WhichOneof("body") == "welcome":
                    welcomed.set()
        except grpc.aio.AioRpcError:
            pass
        finally:
            stop.set()
            await ch.close()
    return asyncio.ensure_future(read()), welcomed


def test_a_replica_that_hands_a_shard_over_closes_its_agents_streams(redis_env):
    # An agent left connected to the old owner would never reach the new one (the redirect is given at
    # registration only): its site would get no lease again. The old owner closes the stream, the agent
    # registers again and is sent to the new owner.
    asyncio.run(_hand_over_closes_streams())


async def _hand_over_closes_streams():
    c = controls()
    c["broker"]["heartbeat_ms"] = 5000                  # the streams stay up on their own for the test
    cfg = XappConfig.from_controls(c)
    a, b = XappApp(cfg), XappApp(cfg)
    sessions: dict = {}
    try:
        await a.start(rest_port=0, broker_listen="127.0.0.1:0", rmr_port=0)
        assert _owned(a) == set(SITES)                  # alone: every shard
        for s in SITES:
            sessions[s] = await _open_session(a.broker.port, s)
        for s in SITES:
            await asyncio.wait_for(sessions[s][1].wait(), 5)
        await b.start(rest_port=0, broker_listen="127.0.0.1:0", rmr_port=0)
        await until(lambda: _split_as_assigned([a, b]), 8, "the shards to split over two replicas")
        moved, kept = _owned(b), _owned(a)
        assert moved and kept
        await until(lambda: all(sessions[s][0].done() for s in moved), 5, "the moved sites' streams to close")
        await asyncio.sleep(0.3)
        assert not any(sessions[s][0].done() for s in kept)          # its own sites' agents stay
        assert set(a.broker.sessions) == kept
    finally:
        for task, _ in sessions.values():
            task.cancel()
        await a.stop()
        await b.stop()
