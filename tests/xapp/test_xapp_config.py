"""Config: schema validation, defaults, semantic checks, and live reload through a ConfigMap-style symlink swap."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from xapp.config import ConfigError, ConfigWatcher, XappConfig, load_config, parse_config_bytes

ROOT = Path(__file__).resolve().parents[2]
DESCRIPTOR = ROOT / "descriptors" / "config-file.json"


def controls(**over):
    c = json.loads(DESCRIPTOR.read_text())["controls"]
    c.update(over)
    return c


def test_descriptor_controls_load_with_every_section():
    cfg = load_config(DESCRIPTOR)
    assert cfg.period_ms == 100 and cfg.period_s == 0.1
    assert cfg.policy.name == "weaver" and cfg.policy.reliability_target == 1e-5
    assert cfg.sites[0].site_id == "site-a" and cfg.site_of("gnb-a").site_id == "site-a"
    assert cfg.broker.max_message_bytes == 65536 and cfg.rmr.backend == "python"


def test_minimal_controls_get_defaults():
    # a static policy needs its reservation (0 is refused as unsafe: xapp.invariant.policy_violations)
    cfg = XappConfig.from_controls({"period_ms": 50, "policy": {"name": "static", "static_reserve_sms": 64},
                                    "sites": [{"site_id": "s1", "nodes": ["n1"]}]})
    assert cfg.lease_valid_periods == 3 and cfg.stale_periods == 2
    assert cfg.sites[0].gpu_sms == 132 and cfg.sites[0].granularity == 8
    assert cfg.actuation.mode == "auto" and cfg.submgr.attempts == 5


@pytest.mark.parametrize("bad, where", [
    ({"period_ms": 5}, "controls.period_ms"),
    ({"period_ms": "100"}, "controls.period_ms"),
    ({"policy": {"name": "greedy"}}, "controls.policy.name"),
    ({"sites": []}, "controls.sites"),
    ({"sites": [{"site_id": "bad id!", "nodes": []}]}, "controls.sites[0].site_id"),
    ({"surprise": 1}, "controls"),
    ({"broker": {"max_message_bytes": 1}}, "controls.broker.max_message_bytes"),
])
def test_schema_violations_name_the_field(bad, where):
    with pytest.raises(ConfigError) as ei:
        XappConfig.from_controls(controls(**bad))
    assert str(ei.value).startswith(where)


def test_semantic_checks_beyond_the_schema():
    two = [{"site_id": "a", "nodes": ["n"]}, {"site_id": "b", "nodes": ["n"]}]
    with pytest.raises(ConfigError, match="node 'n' is in both"):
        XappConfig.from_controls(controls(sites=two))
    dup = [{"site_id": "a", "nodes": ["x"]}, {"site_id": "a", "nodes": ["y"]}]
    with pytest.raises(ConfigError, match="appears twice"):
        XappConfig.from_controls(controls(sites=dup))


@pytest.mark.parametrize("data", [b"", b"{", b"\xff\xfe", b"[]", b"null", b'{"controls": 3}'])
def test_garbage_bytes_give_config_error(data):
    with pytest.raises(ConfigError):
        parse_config_bytes(data)


def _configmap(dirpath: Path, doc: dict, gen: int) -> None:
    """Write the file the way the kubelet does: a new timestamped dir, then an atomic swap of `..data`."""
    d = dirpath / f"..gen{gen}"
    d.mkdir()
    (d / "config-file.json").write_text(json.dumps(doc) if isinstance(doc, dict) else doc)
    tmp = dirpath / "..data_tmp"
    tmp.symlink_to(d.name)
    os.replace(tmp, dirpath / "..data")
    link = dirpath / "config-file.json"
    if not link.is_symlink():
        link.symlink_to("..data/config-file.json")


def test_watcher_follows_symlink_swap_and_refuses_bad_config(tmp_path, caplog):
    doc = json.loads(DESCRIPTOR.read_text())
    _configmap(tmp_path, doc, 1)
    w = ConfigWatcher(tmp_path / "config-file.json")
    first = w.poll()
    assert first is not None and first.config.period_ms == 100
    assert w.poll() is None  # unchanged content, no reload

    doc["controls"]["period_ms"] = 200
    _configmap(tmp_path, doc, 2)
    second = w.poll()
    assert second is not None and second.config.period_ms == 200

    bad = json.loads(json.dumps(doc))
    bad["controls"]["policy"]["name"] = "nope"
    _configmap(tmp_path, bad, 3)
    with caplog.at_level("ERROR"):
        assert w.poll() is None
    assert "refused" in caplog.text and "policy.name" in w.last_error
    assert w.digest == second.digest          # old config still the current one
    assert w.poll() is None                   # refused once, not re-logged every poll

    _configmap(tmp_path, "{ not json", 4)
    assert w.poll() is None and "not JSON" in w.last_error

    doc["controls"]["period_ms"] = 300
    _configmap(tmp_path, doc, 5)
    third = w.poll()
    assert third is not None and third.config.period_ms == 300 and w.last_error is None


def test_watcher_keeps_old_config_when_file_vanishes(tmp_path):
    p = tmp_path / "c.json"
    p.write_text(DESCRIPTOR.read_text())
    w = ConfigWatcher(p)
    assert w.poll() is not None
    p.unlink()
    assert w.poll() is None and "cannot read" in w.last_error
