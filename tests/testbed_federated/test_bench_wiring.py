"""`weaver bench federated` end to end on a tiny population (12 UEs, 2 rounds): the learning worker runs
in the agent venv, the optical arm's transfers are the ones its aggregators announced over the xApp's
REST API, and the three arms account for the same UE updates."""
from __future__ import annotations

import math

from testbed.bench.federated import ARMS, BenchConfig, run_bench


def test_bench_wiring_tiny(agent_python, repo_root):
    cfg = BenchConfig(rounds=2, ues_per_cell=1, local_steps=1, pretrain_steps=2)
    out = run_bench(cfg, agent_python, repo_root, log=lambda *_: None)
    arms = out["arms"]
    assert set(arms) == set(ARMS)
    opt, pkt, aon = arms["optical"], arms["packet"], arms["always-on"]
    produced = sum(out["participants_per_round"])
    assert all(a["updates_produced"] == produced for a in arms.values())
    # per-UE flows vs one aggregate per site and round
    assert pkt["transport_flows"] == out["updates_reaching_gnb"]
    assert opt["transport_flows"] == aon["transport_flows"] <= cfg.rounds * 3
    assert opt["transport_bytes"] == aon["transport_bytes"]
    # the optical schedule came from the announcements: one booking interval per transfer, none early
    transfers = [iv for iv in opt["intervals"] if iv[3] == "transfer"]
    assert len(transfers) == opt["transport_flows"]
    assert opt["circuit_s_used"] <= opt["circuit_s_held"] + 1e-12
    assert aon["circuit_s_held"] == 3 * cfg.rounds * cfg.round_s
    for a in arms.values():
        assert len(a["val_loss"]) == cfg.rounds and all(math.isfinite(v) for v in a["val_loss"])
        assert a["updates_made_their_round"] + a["updates_admitted_late"] <= produced
    assert len(out["reconfig_sweep"]) == 4
    # the RAN's side of the same uploads (testbed.federated.rancost): their PRBs and GPU, RAN first held with them
    rc = out["ran_cost"]
    assert rc["updates_prb_slots"] > 0 and rc["updates_ran_gpu_sm_s"] > 0 and rc["updates_bytes_carried"] > 0
    assert rc["runs"]["with updates"]["deadline_misses_attributable_to_training"] == 0
