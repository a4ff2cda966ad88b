"""Shared fixtures: paths to both venvs' interpreters, so that tests spanning the xApp and the agent
start each process with the right environment, plus a real Redis on a free port."""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
VECTORS = ROOT / "tests" / "vectors"          # carried in the repository (provenance in its README.md)


def _venv_python(name: str) -> Path:
    return ROOT / name / "bin" / "python"


@pytest.fixture(scope="session")
def xapp_python() -> Path:
    p = _venv_python(".venv-xapp")
    if not p.exists():
        pytest.fail("xApp venv missing: run scripts/bootstrap")
    return p


@pytest.fixture(scope="session")
def agent_python() -> Path:
    p = _venv_python(".venv-agent")
    if not p.exists():
        pytest.fail("agent venv missing: run scripts/bootstrap")
    return p


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return ROOT


@pytest.fixture(scope="session")
def vectors_dir() -> Path:
    if not VECTORS.is_dir():
        pytest.fail(f"reference vectors not found at {VECTORS}")
    return VECTORS


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture()
def redis_server(tmp_path):
    """A private, real redis-server on a free port (no persistence)."""
    exe = shutil.which("redis-server")
    if exe is None:
        pytest.fail("redis-server is not installed (.ci/run installs it)")
    port = free_port()
    proc = subprocess.Popen([exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                             "--dir", str(tmp_path)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                break
        except OSError:
            time.sleep(0.05)
    yield {"host": "127.0.0.1", "port": port}
    proc.terminate()
    proc.wait(5)


@pytest.fixture()
def redis_env(redis_server, monkeypatch):
    """A private real Redis, handed to the processes under test the way the platform does (DBAAS_*)."""
    monkeypatch.setenv("DBAAS_SERVICE_HOST", redis_server["host"])
    monkeypatch.setenv("DBAAS_SERVICE_PORT", str(redis_server["port"]))
    return redis_server


def run_py(python: Path, *args: str, **kw) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env.setdefault("PYTHONPATH", str(ROOT))
    return subprocess.run([str(python), *args], cwd=ROOT, env=env, capture_output=True, text=True, **kw)


sys.path.insert(0, str(ROOT))
