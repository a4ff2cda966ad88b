"""docker/Dockerfile.agent, parsed: a CUDA-capable PyTorch base, the agent extra installed, the
pinned torch kept, a non-root user, a checkpoint volume and `weaver-agent` as the entrypoint."""
from __future__ import annotations

import configparser
import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "docker" / "Dockerfile.agent"


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with comments dropped and backslash continuations joined."""
    out, buf = [], ""
    for raw in text.splitlines():
        line = raw.strip()
        if not buf and (not line or line.startswith("#")):
            continue
        if line.endswith("\\"):
            buf += line[:-1] + " "
            continue
        buf += line
        word, _, rest = buf.partition(" ")
        out.append((word.upper(), rest.strip()))
        buf = ""
    assert not buf, "dangling line continuation"
    return out


def test_dockerfile_agent_is_well_formed_and_cuda_capable():
    ins = instructions(DOCKERFILE.read_text())
    known = {"ARG", "FROM", "ENV", "WORKDIR", "COPY", "RUN", "USER", "VOLUME", "HEALTHCHECK", "ENTRYPOINT",
             "CMD", "LABEL", "EXPOSE"}
    assert {k for k, _ in ins} <= known
    args = dict(a.split("=", 1) for k, a in ins if k == "ARG" and "=" in a)
    base = args["BASE_IMAGE"]
    assert base.startswith("pytorch/pytorch:") and "cuda" in base
    assert ins[[k for k, _ in ins].index("FROM")][1] == "${BASE_IMAGE}"
    # the base's torch is the version the agent extra pins, so pip keeps the CUDA build
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    pinned = re.search(r"torch==([\d.]+)", cfg["options.extras_require"]["agent"]).group(1)
    assert base.split(":")[1].startswith(pinned + "-")


def test_dockerfile_agent_installs_the_agent_extra_and_runs_the_agent():
    ins = instructions(DOCKERFILE.read_text())
    runs = " ".join(a for k, a in ins if k == "RUN")
    assert re.search(r"pip install \"?\.\[agent(,jobs)?\]\"?", runs)
    copies = [a.split()[0] for k, a in ins if k == "COPY"]
    assert {"agent", "schemas", "setup.cfg"} <= set(copies)
    assert not {"xapp", "testbed", "e2sm"} & set(copies)          # the agent image carries no xApp code
    user = [a for k, a in ins if k == "USER"]
    assert user and user[-1] not in ("root", "0")
    entry = json.loads(next(a for k, a in ins if k == "ENTRYPOINT"))
    assert entry == ["weaver-agent"]
    cmd = json.loads(next(a for k, a in ins if k == "CMD"))
    assert cmd[0] == "run" and "--checkpoint-dir" in cmd
    assert any(k == "VOLUME" and cmd[cmd.index("--checkpoint-dir") + 1] in a for k, a in ins)


def test_the_agent_never_imports_the_xapp_side():
    for path in (ROOT / "agent").rglob("*.py"):
        text = path.read_text()
        assert not re.search(r"^\s*(from|import)\s+(xapp|testbed|e2sm)\b", text, re.M), path
