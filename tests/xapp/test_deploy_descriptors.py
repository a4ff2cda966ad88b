"""The two deployments of docs/deploy.md agree with each other and with the schema: the OSC descriptor
(descriptors/config-file.json) and the srsRAN oran-sc-ric docker-compose files (descriptors/oran-sc-ric/).
Both configs validate and load; their controls are the same apart from addresses; the static route file
commits in Weaver's own RMR router and carries every mtype the xApp sends or receives, to the right
component; the ports agree across descriptor, config, routes and compose service."""
from __future__ import annotations

import json
import re
from pathlib import Path
from urllib.parse import urlsplit

import jsonschema
import pytest

from xapp.config import load_config
from xapp.rmr import Router

ROOT = Path(__file__).resolve().parents[2]
OSC = ROOT / "descriptors" / "config-file.json"
SC = ROOT / "descriptors" / "oran-sc-ric"
SCHEMA = json.loads((ROOT / "descriptors" / "schema.json").read_text())

# RIC_message_types.h (ric-plt-lib-rmr), the names the descriptor's rxMessages / txMessages use
MTYPES = {"RIC_SUB_REQ": 12010, "RIC_SUB_RESP": 12011, "RIC_SUB_FAILURE": 12012, "RIC_SUB_DEL_REQ": 12020,
          "RIC_SUB_DEL_RESP": 12021, "RIC_SUB_DEL_FAILURE": 12022, "RIC_CONTROL_REQ": 12040,
          "RIC_CONTROL_ACK": 12041, "RIC_CONTROL_FAILURE": 12042, "RIC_INDICATION": 12050}
FROM_E2TERM = ("RIC_INDICATION", "RIC_CONTROL_ACK", "RIC_CONTROL_FAILURE")  # RMR to the xApp itself
FROM_SUBMGR = ("RIC_SUB_RESP", "RIC_SUB_FAILURE", "RIC_SUB_DEL_RESP")       # SubMgr answers us by REST
TO_E2TERM = ("RIC_CONTROL_REQ", "RIC_SUB_REQ", "RIC_SUB_DEL_REQ")
E2TERM = "10.0.2.10:38000"       # oran-sc-ric .env: E2TERM_IP, e2term.conf nano=38000
SUBMGR_RMR = "10.0.2.13:4560"    # SUBMGR_IP, submgr.yaml rmr.protPort
DBAAS = ("10.0.2.12", "6379")    # DBAAS_IP, DBAAS_PORT
# what differs between the two deployments: where things are, nothing about behaviour
ADDRESSES = (("submgr", "url"), ("submgr", "client_host"), ("rmr", "route_table"))


def desc(path: Path) -> dict:
    return json.loads(path.read_text())


@pytest.fixture(scope="module")
def osc():
    return desc(OSC)


@pytest.fixture(scope="module")
def sc():
    return desc(SC / "config-file.json")


@pytest.fixture(scope="module")
def router(sc):
    r = Router(frozenset())
    notes = r.load_text((SC / "routes.rtg").read_text())
    assert r.ready, notes
    assert not notes, notes
    return r


def without_addresses(controls: dict) -> dict:
    c = json.loads(json.dumps(controls))
    for section, key in ADDRESSES:
        c[section].pop(key)
    for site in c["sites"]:
        site.pop("nodes")  # the E2 nodes' inventory names: the RIC's addresses for them
    return c


@pytest.mark.parametrize("path", [OSC, SC / "config-file.json"], ids=["osc", "oran-sc-ric"])
def test_config_validates_against_the_schema_and_loads(path):
    controls = desc(path)["controls"]
    jsonschema.Draft7Validator(SCHEMA).validate(controls)
    cfg = load_config(path)   # the xApp's own parser, floors included
    assert cfg.submgr.url == controls["submgr"]["url"]


def test_controls_are_the_same_apart_from_addresses(osc, sc):
    assert (sc["name"], sc["version"]) == (osc["name"], osc["version"])
    assert without_addresses(sc["controls"]) == without_addresses(osc["controls"])
    assert sc["controls"]["submgr"]["url"] != osc["controls"]["submgr"]["url"]


def test_osc_ports_agree(osc):
    c = osc["controls"]
    ports = {p["name"]: p["port"] for p in osc["messaging"]["ports"]}
    assert ports["rmrdata"] == c["rmr"]["port"] == c["submgr"]["rmr_port"]
    assert osc["rmr"]["protPort"] == f"tcp:{c['rmr']['port']}"
    assert ports["http"] == c["rest"]["port"] == c["submgr"]["http_port"]
    assert ports["grpc"] == int(c["broker"]["listen"].rsplit(":", 1)[1])
    for probe in ("livenessProbe", "readinessProbe"):
        assert osc[probe]["httpGet"]["port"] == c["rest"]["port"]


def test_oran_sc_ric_submgr_url_and_client_are_the_compose_addresses(sc):
    c = sc["controls"]
    url = urlsplit(c["submgr"]["url"])
    assert (url.scheme, url.hostname, url.port, url.path) == ("http", "10.0.2.13", 8088, "/ric/v1")
    assert c["submgr"]["client_host"] == "10.0.2.21"
    assert c["e2"]["discovery"] == "rnib"   # e2mgr writes the R-NIB into dbaas, as on OSC
    # OSC's E2T names srsRAN's gNB-DU gnbd_<MCC>_<MNC>_<gNB ID>_<DU ID> (testbed/ric/names.py)
    assert all(re.fullmatch(r"gnbd_\d{3}_\d{3}_[0-9a-f]{6,8}_[0-9a-f]+", n) for s in c["sites"] for n in s["nodes"])


def test_routes_carry_every_mtype_the_xapp_sends_or_receives(osc, sc, router):
    c = sc["controls"]
    weaver = f"{c['submgr']['client_host']}:{c['rmr']['port']}"
    names = set(osc["rmr"]["rxMessages"]) | set(osc["rmr"]["txMessages"])
    assert names == set(FROM_E2TERM) | set(FROM_SUBMGR) | set(TO_E2TERM)
    for name in names:
        assert router.targets(MTYPES[name], -1, ""), f"routes.rtg has no route for {name}"
    for name in FROM_E2TERM:
        assert router.targets(MTYPES[name], -1, "") == [weaver], name
    for name in FROM_SUBMGR:
        assert router.targets(MTYPES[name], -1, "") == [SUBMGR_RMR], name
    for name in TO_E2TERM:
        assert router.targets(MTYPES[name], -1, "") == [E2TERM], name


def test_compose_service_matches_config_and_routes(sc):
    text = (SC / "docker-compose.weaver.yml").read_text()
    c = sc["controls"]

    def env(name: str) -> str:
        m = re.search(rf"^\s*- {name}=(\S*)$", text, re.M)
        assert m, f"compose service does not set {name}"
        return m.group(1)

    assert re.search(rf"ipv4_address: {re.escape(c['submgr']['client_host'])}$", text, re.M)
    assert env("RMR_SRC_ID") == c["submgr"]["client_host"]
    assert env("RMR_SEED_RT") == c["rmr"]["route_table"]
    assert f"target: {c['rmr']['route_table']}" in text
    assert f"target: {env('CONFIG_FILE')}" in text
    assert (env("DBAAS_SERVICE_HOST"), env("DBAAS_SERVICE_PORT")) == DBAAS
    assert env("RMR_RTG_SVC") == "-1"   # static routes: no route manager pushes to Weaver here
    assert re.search(rf'^\s*- "{c["rest"]["port"]}:{c["rest"]["port"]}"$', text, re.M)
    broker_port = c["broker"]["listen"].rsplit(":", 1)[1]
    assert re.search(rf'^\s*- "{broker_port}:{broker_port}"$', text, re.M)
    assert re.search(rf"^\s*- {c['broker']['token_env']}$", text, re.M)  # passed through, never written here
