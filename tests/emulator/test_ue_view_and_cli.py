"""The per-UE view (testbed/model/ues.py) adds up to the cell numbers the node reports; the UE-level
conditions select as documented; `weaver sim --help` documents slices, styles and KPM versions; --slices
and --scenario-file configure each site's slices."""
from __future__ import annotations

import contextlib
import io
import json

import pytest

from e2sm import kpm
from testbed import cli
from testbed.e2node import from_period_report, node_configs
from testbed.e2node.measure import UE_LEVEL, measure, measure_ue
from testbed.e2node.uestyles import matches
from testbed.model import RanModel
from testbed.model.config import ModelConfigError, parse_slices
from testbed.model.ues import UePopulation, apportion
from testbed.sim import SimConfig, build_scenario, parse_slice_specs, read_scenario_file


def test_ues_of_a_cell_sum_to_the_cell_for_every_additive_name():
    sc = build_scenario(SimConfig(n_sites=1, n_cells=3, slices={"*": "2:1,1:1"}))
    model = RanModel(sc, seed=5, track_delay=False)
    (cfg,) = node_configs(sc)
    for _ in range(3):
        m = from_period_report(model.step_period(), 0, 132)
        for cell in range(3):
            ues = cfg.ues.in_cell(cell)
            for name in ("RRU.PrbUsedDl", "RRU.PrbUsedUl", "DRB.UEThpDl", "DRB.UEThpUl"):
                total = measure(m, cfg.slices, name, None, cell)
                parts = [measure_ue(m, cfg.slices, cfg.ues, u, name, None) for u in ues]
                if name.startswith("RRU."):
                    assert sum(parts) == total and all(isinstance(p, int) for p in parts)   # exact, integers
                else:
                    assert sum(parts) == pytest.approx(total, rel=1e-9)
            # a UE reports its own slice only
            u = ues[0]
            other = cfg.slices[1 - u.slice]
            assert measure_ue(m, cfg.slices, cfg.ues, u, "DRB.UEThpDl", (other.sst, other.sd)) is None
    assert set(UE_LEVEL) >= {"DRB.UEThpDl", "DRB.UEThpUl"}


def test_population_and_apportion():
    pop = UePopulation.build(n_cells=2, n_slices=2, ues_per_cell=4, seed=1)
    assert [u.f1ap_id for u in pop.ues] == list(range(8)) and pop.get(0).cell == 0 and pop.get(7).cell == 1
    for cell in range(2):
        for s in range(2):
            assert sum(u.share for u in pop.in_cell(cell) if u.slice == s) == pytest.approx(1.0)
    assert apportion({1: 0.5, 2: 0.3, 3: 0.2}, 7) == {1: 4, 2: 2, 3: 1}
    assert sum(apportion({k: k * 0.37 for k in range(9)}, 101).values()) == 101
    with pytest.raises(ModelConfigError):
        UePopulation.build(1, 2, ues_per_cell=1)


def test_conditions_and_logical_or():
    (cfg,) = node_configs(build_scenario(SimConfig(n_sites=1, n_cells=1, slices={"*": "2:1,1:1"})))
    ue = cfg.ues.get(0)
    lt = kpm.TestCond("ul-rSRP", "lessthan", ("valueInt", ue.ul_rsrp))
    gt = kpm.TestCond("ul-rSRP", "greaterthan", ("valueInt", ue.ul_rsrp - 1))
    own = cfg.slices[ue.slice]
    assert not matches((lt,), ue, cfg) and matches((gt,), ue, cfg)
    assert not matches((gt, lt), ue, cfg) and matches((kpm.OrNext(lt), gt), ue, cfg)
    assert matches((kpm.MeasLabel(kpm.Snssai(own.sst, own.sd)),), ue, cfg)
    assert not matches((kpm.MeasLabel(kpm.Snssai(own.sst, own.sd + 7)),), ue, cfg)


def test_weaver_sim_help_documents_slices_styles_and_kpm_versions():
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        cli.main(["sim", "--help"])
    text = out.getvalue()
    for needle in ("--slices", "2:1,1:1", "--scenario-file", "v4.00", "v3.00", "v2.03", "message format 3",
                   "gnbd_001_001_000001_1", "--ues-per-cell", "oai-gnb"):
        assert needle in text, needle
    for style in range(1, 6):
        assert f"\n               {style} " in text


def test_slices_per_site_from_flags_and_scenario_file(tmp_path):
    specs = parse_slice_specs(["2:1,1:1", "1=2:1,1:0x5"])
    assert specs == {"*": "2:1,1:1", 1: "2:1,1:0x5"}
    sc = build_scenario(SimConfig(n_sites=2, n_cells=1, slices=specs))
    assert [(s.sst, s.sd) for s in sc.sites[0].slices] == [(2, 1), (1, 1)]
    assert [(s.sst, s.sd) for s in sc.sites[1].slices] == [(2, 1), (1, 5)]
    assert [(s.sst, s.sd) for s in node_configs(sc)[1].slices] == [(2, 1), (1, 5)]
    f = tmp_path / "scenario.json"
    f.write_text(json.dumps({"slices": {"*": "2:1,1:1", "1": "1:5,1:1"}, "nodes": {"1": "kpm=v4.00,rc=oai-gnb"}}))
    slices, nodes = read_scenario_file(str(f))
    assert slices == {"*": "2:1,1:1", 1: "1:5,1:1"} and nodes == ["1:kpm=v4.00,rc=oai-gnb"]
    for bad in ("2:1", "2:1,2:1", "2:1,300:1", "a:b,1:1"):
        with pytest.raises(ModelConfigError):
            parse_slices(bad)
    with pytest.raises(ValueError):
        build_scenario(SimConfig(n_sites=1, n_cells=1, slices={5: "2:1,1:1"}))
