"""Deployment artefacts: the OSC descriptor (root fields per e2-facts §7, controls against schema.json) and
the xApp Dockerfile (parsed; it cannot be built here)."""
from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import jsonschema
import pytest

ROOT = Path(__file__).resolve().parents[2]
DESC = json.loads((ROOT / "descriptors" / "config-file.json").read_text())
SCHEMA = json.loads((ROOT / "descriptors" / "schema.json").read_text())

RX = ["RIC_SUB_RESP", "RIC_SUB_FAILURE", "RIC_SUB_DEL_RESP", "RIC_INDICATION", "RIC_CONTROL_ACK", "RIC_CONTROL_FAILURE"]
TX = ["RIC_SUB_REQ", "RIC_SUB_DEL_REQ", "RIC_CONTROL_REQ"]
SEMVER = re.compile(r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(-[0-9A-Za-z.-]+)?(\+[0-9A-Za-z.-]+)?$")
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def test_schema_is_draft07_and_controls_validate():
    assert SCHEMA["$schema"] == "http://json-schema.org/draft-07/schema#"
    jsonschema.Draft7Validator.check_schema(SCHEMA)
    jsonschema.Draft7Validator(SCHEMA).validate(DESC["controls"])


def test_every_control_setting_is_present_in_the_descriptor():
    """The descriptor is the operator's reference: every property the schema knows appears in it."""
    def walk(schema, value, path):
        for name, sub in schema.get("properties", {}).items():
            assert name in value, f"descriptor controls lack {path}{name}"
            if sub.get("type") == "object" and "properties" in sub:
                walk(sub, value[name], f"{path}{name}.")
    walk(SCHEMA, DESC["controls"], "")


def test_schema_rejects_a_broken_controls_section():
    bad = json.loads(json.dumps(DESC["controls"]))
    bad["period_ms"] = 0
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft7Validator(SCHEMA).validate(bad)


def test_root_fields():
    assert isinstance(DESC["name"], str) and DNS_LABEL.match(DESC["name"])
    assert SEMVER.match(DESC["version"])
    for c in DESC["containers"]:
        assert {"name", "image"} <= c.keys()
        assert {"registry", "name", "tag"} <= c["image"].keys()
    for probe, path in (("livenessProbe", "/ric/v1/health/alive"), ("readinessProbe", "/ric/v1/health/ready")):
        p = DESC[probe]
        assert p["httpGet"] == {"path": path, "port": 8080}
        assert type(p["initialDelaySeconds"]) is int and type(p["periodSeconds"]) is int
    assert DESC["appenv"]["CONFIG_FILE"] == "/opt/ric/config/config-file.json"


def test_messaging_ports_and_rmr_block_agree():
    ports = {p["name"]: p for p in DESC["messaging"]["ports"]}
    for p in ports.values():
        assert {"name", "container", "port"} <= p.keys() and type(p["port"]) is int
        assert DNS_LABEL.match(p["name"])
        lists = {"txMessages", "rxMessages", "policies"} & p.keys()
        assert lists in (set(), {"txMessages", "rxMessages", "policies"}), "message lists come as a set of three"
        assert p["container"] in {c["name"] for c in DESC["containers"]}
    assert ports["http"]["port"] == 8080 and ports["rmrdata"]["port"] == 4560 and ports["rmrroute"]["port"] == 4561
    rmr_names = [p["name"] for p in DESC["messaging"]["ports"] if "rmr" in p["name"]]
    assert rmr_names[0] == "rmrdata", "rmrdata must be the first rmr port (it names the shared Service)"
    assert "rxMessages" not in ports["rmrroute"]
    data = ports["rmrdata"]
    assert data["rxMessages"] == RX and data["txMessages"] == TX and data["policies"] == []
    rmr = DESC["rmr"]
    assert rmr["protPort"] == "tcp:4560" and rmr["rxMessages"] == RX and rmr["txMessages"] == TX
    assert rmr["policies"] == [] and isinstance(rmr["maxSize"], int) and isinstance(rmr["numWorkers"], int)
    for name in RX + TX:
        assert " " not in name and "," not in name   # one name per string (ric-app-rc packs three in one)
    # the control settings agree with the ports the descriptor declares
    assert DESC["controls"]["rmr"]["port"] == 4560 and DESC["controls"]["rest"]["port"] == 8080
    assert DESC["controls"]["broker"]["listen"].endswith(":" + str(ports["grpc"]["port"]))


def _dockerfile():
    text = (ROOT / "docker" / "Dockerfile.xapp").read_text()
    text = re.sub(r"\\\n", " ", text)
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            op, _, rest = line.partition(" ")
            out.append((op.upper(), rest.strip()))
    return out


def test_dockerfile_installs_the_xapp_extra_and_optional_native_rmr():
    ins = _dockerfile()
    ops = [op for op, _ in ins]
    assert set(ops) <= {"ARG", "FROM", "RUN", "WORKDIR", "COPY", "ENV", "USER", "EXPOSE", "ENTRYPOINT", "CMD"}
    args = {rest.split("=")[0]: rest for op, rest in ins if op == "ARG"}
    assert "python:3.11-slim" in args["PYTHON_IMAGE"]
    froms = [rest for op, rest in ins if op == "FROM"]
    assert all(f.startswith("${PYTHON_IMAGE}") for f in froms)
    runs = " ".join(rest for op, rest in ins if op == "RUN")
    assert 'pip install --no-cache-dir ".[xapp]"' in runs
    assert "RMR_NATIVE" in args and args["RMR_NATIVE"] == "RMR_NATIVE=0"
    assert "packagecloud.io/o-ran-sc/release" in args["RMR_DEB_URL"] and "rmr_${RMR_VERSION}" in args["RMR_DEB_URL"]
    assert '"$RMR_NATIVE" = "1"' in runs and "dpkg -i" in runs
    # every COPY source exists in the repository
    for op, rest in ins:
        if op == "COPY" and not rest.startswith("--from"):
            for src in shlex.split(rest)[:-1]:
                assert (ROOT / src).exists(), src
    expose = next(rest for op, rest in ins if op == "EXPOSE").split()
    assert {"8080", "4560", "4561", "50051"} <= set(expose)
    assert json.loads(next(rest for op, rest in ins if op == "ENTRYPOINT")) == ["weaver-xapp"]
    env = next(rest for op, rest in ins if op == "ENV")
    assert "CONFIG_FILE=/opt/ric/config/config-file.json" in env


def test_setup_cfg_xapp_extra_has_what_the_readme_promises():
    import configparser
    cp = configparser.ConfigParser()
    cp.read(ROOT / "setup.cfg")
    extra = cp["options.extras_require"]["xapp"]
    cfg = cp["options.entry_points"]["console_scripts"]
    for pkg in ("ricxappframe==3.2.2", "protobuf==3.20.3", "pycrate", "asn1tools", "aiohttp", "jsonschema"):
        assert pkg in extra
    assert "weaver-xapp = xapp.__main__:main" in cfg


def test_descriptor_is_ready_for_an_osc_ric():
    """ric-dep's Prometheus scrapes pods by prometheus.io/* annotations (the xapp-std chart copies the
    descriptor's `annotations` onto the pod, strings as they are); the chart sets no APP_NAMESPACE and
    appenv is the pod's environment, where an empty RMR_SEED_RT makes native RMR warn."""
    from xapp.app import XappApp
    from xapp.config import XappConfig
    from xapp.rest import build_app

    ann = DESC["annotations"]
    assert ann == {"prometheus.io/scrape": "true", "prometheus.io/path": "/ric/v1/metrics",
                   "prometheus.io/port": "8080"}
    assert all(isinstance(v, str) for v in ann.values())
    http = next(p for p in DESC["messaging"]["ports"] if p["name"] == "http")
    assert ann["prometheus.io/port"] == str(http["port"]) == str(DESC["controls"]["rest"]["port"])
    served = {r.resource.canonical for r in build_app(XappApp(XappConfig.from_controls(DESC["controls"]))).router.routes()
              if r.method == "GET"}
    assert ann["prometheus.io/path"] in served and "/metrics" in served
    env = DESC["appenv"]
    assert env["APP_NAMESPACE"] == "ricxapp" and env["PLT_NAMESPACE"] == "ricplt"
    assert all(isinstance(v, str) and v != "" for v in env.values()), env
    assert "RMR_SEED_RT" not in env       # the xApp's routes come from rtmgr (the chart sets RMR_RTG_SVC)


def _rmr_steps() -> list[str]:
    """The `&&` steps of the RUN that installs the RMR .deb."""
    run = next((rest for op, rest in _dockerfile() if op == "RUN" and "dpkg -i" in rest), None)
    assert run is not None, "no RUN installs the RMR .deb"
    return [s.strip() for s in run.split("&&")]


def _step(steps: list[str], key: str) -> int:
    found = [i for i, s in enumerate(steps) if key in s]
    assert found, f"the RMR install step has no {key!r}: {steps}"
    return found[0]


def test_dockerfile_provides_the_unversioned_rmr_library():
    """ricxappframe loads CDLL("librmr_si.so"); the runtime .deb has only the versioned name. Within the
    RMR_NATIVE step: dpkg -i, then the librmr_si.so link beside the package's librmr_si.so.<major>, then
    ldconfig, then a load by exactly that name (so the build fails rather than the pod)."""
    steps = _rmr_steps()
    at = {key: _step(steps, key) for key in ("dpkg -i", "dpkg -L rmr", "ln -s", "ldconfig", 'CDLL("librmr_si.so")')}
    assert at["dpkg -i"] < at["dpkg -L rmr"] < at["ln -s"] < at["ldconfig"] < at['CDLL("librmr_si.so")']
    assert "/librmr_si[.]so[.][0-9]*$" in steps[at["dpkg -L rmr"]]
    assert 'ln -s "${so##*/}" "${so%.*}"' in steps[at["ln -s"]]


@pytest.mark.parametrize("deb_has_link", [False, True])
def test_dockerfile_link_step_runs(tmp_path, deb_has_link):
    """The Dockerfile's own shell text, run with `dpkg -L rmr` answering a 4.9.4 runtime package's files
    laid out under tmp_path: librmr_si.so ends up resolving to the versioned library."""
    import subprocess
    lib = tmp_path / "usr" / "local" / "lib"
    lib.mkdir(parents=True)
    (lib / "librmr_si.so.4.9.4").write_bytes(b"\x7fELF")
    (lib / "librmr_si.so.4").symlink_to("librmr_si.so.4.9.4")
    files = [str(lib), str(lib / "librmr_si.so.4.9.4"), str(lib / "librmr_si.so.4")]
    if deb_has_link:
        (lib / "librmr_si.so").symlink_to("librmr_si.so.4")
        files.append(str(lib / "librmr_si.so"))
    steps = _rmr_steps()
    first, last = _step(steps, "dpkg -L rmr"), _step(steps, "ln -s")
    script = " && ".join(steps[first:last + 1]).replace("dpkg -L rmr", "printf '%s\\n' " + " ".join(files))
    subprocess.run(["sh", "-c", script], check=True)
    link = lib / "librmr_si.so"
    assert link.is_symlink() and link.resolve() == (lib / "librmr_si.so.4.9.4").resolve()
    assert link.readlink().name == "librmr_si.so.4"        # relative, as OSC images have it
