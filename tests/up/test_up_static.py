"""`weaver up --policy static`: the descriptor's static reserve (0) is refused as unsafe since the config
floors of issue 13, so `weaver up` tunes the reserve the way `weaver bench policies` does."""
from __future__ import annotations

import json

import pytest

from testbed.up import UpConfig, scenario_for, static_reserve_for
from xapp.config import ConfigError, XappConfig


def _controls(root, reserve: int | None) -> dict:
    c = json.loads((root / "descriptors" / "config-file.json").read_text())["controls"]
    c["policy"]["name"] = "static"
    if reserve is not None:
        c["policy"]["static_reserve_sms"] = reserve
    return c


def test_descriptor_reserve_alone_is_refused(repo_root):
    with pytest.raises(ConfigError, match="static_reserve_sms"):
        XappConfig.from_controls(_controls(repo_root, None))


def test_up_tunes_a_safe_reserve(repo_root):
    cfg = UpConfig(sites=1, policy="static")
    site = scenario_for(cfg).sites[0]
    reserve = static_reserve_for(cfg, calibration_periods=200)
    assert site.granularity <= reserve < site.gpu_sms and reserve % site.granularity == 0
    XappConfig.from_controls(_controls(repo_root, reserve))   # accepted by the same floors
