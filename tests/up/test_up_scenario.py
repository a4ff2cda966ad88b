"""`weaver up --scenario NAME` (issue 25): the live run builds the sites `weaver bench` builds for the regime
(GPU size, cells, loads, slices) at the live period, and the xApp's per-site config carries them; an unknown
name is one clear line (exit 2) in `weaver up` and in every bench taking a scenario name."""
from __future__ import annotations

import argparse
import json
import subprocess
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest

from testbed import scenarios as named
from testbed.e2node.config import node_configs
from testbed.up import UpConfig, add_arguments, known_scenarios, scenario_for, scenario_line, xapp_controls
from xapp.config import XappConfig

ROOT = Path(__file__).resolve().parents[2]
WEAVER = ROOT / ".venv-xapp" / "bin" / "weaver"


def _fake_sim(sc):
    """What xapp_controls reads of a started Simulation: its scenario, its nodes and the RIC's endpoints."""
    nodes = [SimpleNamespace(meid=nc.inventory_name, node=SimpleNamespace(config=nc)) for nc in node_configs(sc)]
    ric = SimpleNamespace(submgr_url="http://127.0.0.1:1", route_file=Path("/nonexistent/xapp.rt"))
    return SimpleNamespace(model=SimpleNamespace(scenario=sc), nodes=nodes, ric=ric)


def _controls(cfg: UpConfig) -> dict:
    return xapp_controls(cfg, _fake_sim(scenario_for(cfg)), {"rest": 1, "rmr": 2, "broker": 3})


def _parse(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_arguments(p)
    return p.parse_args(argv)


def test_known_names_are_the_bench_regimes_and_demo():
    assert known_scenarios() == ("demo", "gh200-multicell", "heavy-small-gpu", "slow-partition")


@pytest.mark.parametrize("name", ["gh200-multicell", "heavy-small-gpu", "slow-partition"])
def test_named_scenario_is_the_bench_one_at_the_live_period(name):
    cfg = UpConfig.for_scenario(name, period_ms=50.0)
    bench = named.get(name)
    live = scenario_for(cfg)
    assert live.period_slots == 100 and bench.period_slots == 200   # the live run's period, not the bench's
    assert replace(live, period_slots=bench.period_slots) == bench   # every site as the bench builds it
    assert (cfg.sites, cfg.cells) == (bench.n_sites, bench.n_cells)
    assert (live.partition, live.reconfig_s) == (bench.partition, bench.reconfig_s)


def test_demo_is_today_default():
    live = scenario_for(UpConfig())
    assert replace(live, description="") == replace(named.get("demo"), description="")
    assert scenario_for(UpConfig(sites=5, cells=2)).n_sites == 5


def test_heavy_small_gpu_reaches_the_xapp():
    cfg = UpConfig.for_scenario("heavy-small-gpu")
    c = _controls(cfg)
    sites = c["controls"]["sites"]
    assert [s["gpu_sms"] for s in sites] == [48, 48, 48]
    assert [s["granularity"] for s in sites] == [8, 8, 8]
    want = named.get("heavy-small-gpu").sites[0].slices
    assert sites[0]["protected_slices"] == [{"sst": s.sst, "sd": s.sd} for s in want if s.protected]
    assert sites[0]["best_effort_slices"] == [{"sst": s.sst, "sd": s.sd} for s in want if not s.protected]
    assert c["controls"]["period_ms"] == 100
    XappConfig.from_controls(c["controls"])   # the xApp's own validation takes it


def test_sites_and_cells_apply_to_demo_only():
    args = _parse("--scenario", "heavy-small-gpu")
    assert args.sites is None and args.cells is None
    with pytest.raises(ValueError, match="apply to --scenario demo only: gh200-multicell is 3 sites x 8 cells"):
        UpConfig.for_scenario("gh200-multicell", cells=4)
    with pytest.raises(ValueError, match="demo only"):
        UpConfig.for_scenario("heavy-small-gpu", sites=2)
    assert UpConfig.for_scenario("heavy-small-gpu", sites=3, cells=4).sites == 3   # the scenario's own: no conflict


@pytest.mark.parametrize("name,match", [("nope", r"unknown scenario 'nope'; known: demo, gh200-multicell, "
                                                  r"heavy-small-gpu, slow-partition$"),
                                         ("scale", r"128 sites: weaver up runs one agent process per site")])
def test_unknown_or_too_large_is_refused(name, match):
    with pytest.raises(ValueError, match=match):
        UpConfig.for_scenario(name)


def test_scenario_file_slices_and_nodes(tmp_path):
    f = tmp_path / "sc.json"
    f.write_text(json.dumps({"slices": {"*": "2:1,1:1", "1": "2:1,1:5"}, "nodes": {"2": "kpm=v4.00,rc=oai"}}))
    from testbed.sim import parse_node_overrides, read_scenario_file
    slices, nodes = read_scenario_file(str(f))
    cfg = UpConfig.for_scenario("heavy-small-gpu", slices=slices, node_overrides=parse_node_overrides(nodes))
    sc = scenario_for(cfg)
    assert [s.gpu_sms for s in sc.sites] == [48, 48, 48]
    assert [(x.sst, x.sd) for x in sc.sites[1].slices] == [(2, 1), (1, 5)]
    assert [(x.sst, x.sd) for x in sc.sites[0].slices] == [(2, 1), (1, 1)]
    assert node_configs(sc, overrides=cfg.node_overrides)[2].kpm_version == "v4.00"
    with pytest.raises(ValueError, match="sites 0..2"):
        UpConfig.for_scenario("heavy-small-gpu", slices={7: "2:1,1:1"})
    with pytest.raises(ValueError, match="sites 0..2"):
        UpConfig.for_scenario("heavy-small-gpu", node_overrides={5: {"kpm_version": "v4.00"}})


def test_startup_line_names_the_regime():
    cfg = UpConfig.for_scenario("slow-partition")
    line = scenario_line(cfg, scenario_for(cfg))
    assert line.startswith("weaver up: scenario   slow-partition: 3 sites x 8 cells, 132-SM GPUs")
    assert "mps (reconfiguration 0.3 s)" in line


def _weaver(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(WEAVER), *argv], capture_output=True, text=True, timeout=120, cwd=ROOT)


@pytest.mark.parametrize("argv,prefix", [
    (("up", "--scenario", "nope"), "weaver up: unknown scenario 'nope'; known: demo, "),
    (("up", "--scenario", "gh200-multicell", "--cells", "2"), "weaver up: --sites/--cells apply to --scenario demo"),
    (("bench", "policies", "--scenario", "nope"), "weaver bench policies: unknown scenario 'nope'; known: "),
    (("bench", "policies", "--scenarios", "heavy-small-gpu", "nope"), "weaver bench policies: unknown scenario"),
    (("bench", "sim", "--scenario", "nope"), "weaver bench sim: unknown scenario 'nope'; known: "),
])
def test_cli_refuses_in_one_line(argv, prefix):
    proc = _weaver(*argv)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith(prefix) and proc.stderr.count("\n") == 1, proc.stderr
    assert "Traceback" not in proc.stderr
