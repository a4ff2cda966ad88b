"""Issue 13 item 5: the agent's broker credential stays secret, and checkpoints are the operator's only.

Before: every checkpoint held the effective AgentConfig with `lease.token` in plain text, in a 0644 file
(any local user could read the credential and register as the site). Now the real agent, run against a
real gRPC broker with a credential and a typical 022 umask, writes its shutdown checkpoint 0600 into a
directory it creates 0700; neither the checkpoint's bytes, nor its stored config, nor the config's repr,
nor the agent's log lines or its AgentInspect status hold the credential - while the Register the broker
received did carry it."""
from __future__ import annotations

import logging
import os
import stat
import threading
from dataclasses import replace

import pytest
import torch
from google.protobuf.json_format import MessageToJson

from agent.config import LeaseClientConfig, tiny_cpu
from agent.monitors import cpu_facts
from agent.site_agent import SiteAgent
from schemas.credential import parse_proof, proof_mac
from tests.agent.broker import ScriptedBroker, wait_for

TOKEN = "cred-3f1a9c0e5b7d24688e1f0a6c4b2d9e71-site-0"


@pytest.fixture()
def umask_022():
    old = os.umask(0o022)
    yield
    os.umask(old)


def test_checkpoints_hold_no_credential_and_are_private(tmp_path, umask_022, caplog):
    caplog.set_level(logging.DEBUG)
    broker = ScriptedBroker(heartbeat_ms=100, token=TOKEN)    # refuses a Register without it
    broker.start()
    ckpt = tmp_path / "run" / "agent-0"
    try:
        cfg = tiny_cpu()
        cfg = replace(cfg, modes=replace(cfg.modes, mode="gpu"), checkpoint_dir=str(ckpt), inspect_addr="127.0.0.1:0",
                      lease=LeaseClientConfig(broker=f"127.0.0.1:{broker.port}", site_id="site-0", token=TOKEN,
                                              heartbeat_ms=100, backoff_initial_s=0.05, backoff_max_s=0.2))
        agent = SiteAgent(cfg, device=cpu_facts(1))
        thread = threading.Thread(target=agent.run, kwargs={"max_seconds": 30}, daemon=True)
        thread.start()
        try:
            assert wait_for(lambda: agent.client.connected, 15)
            status = MessageToJson(agent.status())
        finally:
            agent.stop()
            thread.join(20)
        assert not thread.is_alive()
    finally:
        broker.stop()
    first = broker.registers[0]     # it proved the credential (schemas.credential) without sending it
    p = parse_proof(first.token)
    assert TOKEN not in first.token and p is not None
    assert p.mac == proof_mac(TOKEN, first.site_id, first.agent_id, p), "the Register carried a proof of it"

    files = sorted(ckpt.glob("ckpt-*.pt"))
    assert files, "the shutdown checkpoint was written"
    assert stat.S_IMODE(ckpt.stat().st_mode) == 0o700
    for f in files:
        assert stat.S_IMODE(f.stat().st_mode) == 0o600, f
        assert TOKEN.encode() not in f.read_bytes(), f
    state = torch.load(files[-1], map_location="cpu", weights_only=True)
    assert state["agent"]["agent_config"]["lease"]["token"] == ""
    assert state["agent"]["agent_config"]["lease"]["site_id"] == "site-0"
    assert TOKEN not in repr(cfg) and TOKEN not in status
    assert TOKEN not in caplog.text
    assert cfg.to_dict(secrets=True)["lease"]["token"] == TOKEN   # kept in memory for the stream itself


def test_an_existing_checkpoint_directory_keeps_its_mode(tmp_path, umask_022):
    """The store tightens only what it creates: an operator's shared 0750 directory stays 0750, files 0600."""
    from agent.checkpoint import CheckpointStore

    d = tmp_path / "shared"
    d.mkdir(mode=0o750)
    os.chmod(d, 0o750)
    info = CheckpointStore(d).save({"x": torch.zeros(1)}, 1)
    assert stat.S_IMODE(d.stat().st_mode) == 0o750
    assert stat.S_IMODE(info.path.stat().st_mode) == 0o600
