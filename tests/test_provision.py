"""scripts/provision (run first by `make test`, scripts/test and .ci/run): on a machine that lacks a system
package the tests need and cannot install it, it says exactly what to install and stops, before any test
or venv build runs. Real runs of the script with a PATH that hides some commands."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "provision"
BASICS = ("bash", "dirname", "id", "mkdir", "seq", "sleep", "redis-cli", "redis-server")


def fake_path(tmp_path: Path, *extra: str) -> str:
    """A PATH holding only the basics (and `extra`): chromium, openssl, apt-get and sudo are not on it."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in (*BASICS, *extra):
        exe = shutil.which(name)
        assert exe, f"{name} is needed to run this test"
        (bin_dir / name).symlink_to(exe)
    return str(bin_dir)


def provision(path: str, *, as_nobody: bool = False) -> subprocess.CompletedProcess:
    env = {"PATH": path, "PYTHON": sys.executable, "WEAVER_NO_REDIS": "1", "HOME": "/tmp"}
    cmd = ["bash", str(SCRIPT)]
    if as_nobody and os.getuid() == 0:
        cmd = [shutil.which("setpriv"), "--reuid=65534", "--regid=65534", "--clear-groups", *cmd]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)


def test_without_apt_it_names_the_packages_to_install_and_fails(tmp_path):
    r = provision(fake_path(tmp_path))
    assert r.returncode == 1
    assert "the tests need: chromium openssl; cannot install them: no apt-get on this system" in r.stderr
    assert "sudo apt-get install chromium openssl" in r.stderr


def test_not_root_it_does_not_try_apt():
    with tempfile.TemporaryDirectory() as tmp:  # pytest's tmp_path is private to root; nobody must read this
        os.chmod(tmp, 0o755)
        r = provision(fake_path(Path(tmp), "apt-get"), as_nobody=True)
    assert r.returncode == 1
    assert "cannot install them: not root and no passwordless sudo" in r.stderr
    assert "installing" not in r.stderr


def test_with_everything_present_it_passes_silently():
    r = subprocess.run(["bash", str(SCRIPT)], env={**os.environ, "WEAVER_NO_REDIS": "1"}, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stderr == ""
