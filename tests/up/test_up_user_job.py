"""A user's job is found where the user keeps it (issue 25 item 8): `weaver up --job mymod:make_job` run
from the user's folder gives every agent the caller's working directory and PYTHONPATH after the checkout,
so `mymod` loads as Python would load it there (before, the agents' PYTHONPATH was the checkout alone)."""
from __future__ import annotations

import os
import subprocess

import pytest

from testbed.up import ROOT, agent_python, agent_pythonpath

JOB = '''
from agent.jobs.chargpt import CharGPTJob


class MyJob(CharGPTJob):
    name = "my-job"


def make_job(ctx):
    return MyJob(ctx.train)
'''


def test_the_checkout_comes_first_then_the_callers_folder_and_pythonpath():
    p = agent_pythonpath(cwd="/home/me/work", pythonpath="/opt/lib:/home/me/work:")
    assert p.split(os.pathsep) == [str(ROOT), "/home/me/work", "/opt/lib"]


@pytest.mark.skipif(not agent_python().exists(), reason="needs the agent venv")
@pytest.mark.parametrize("where", ["cwd", "pythonpath"])
def test_an_agent_loads_a_job_from_the_users_folder(tmp_path, where):
    (tmp_path / "mymod.py").write_text(JOB)
    path = agent_pythonpath(cwd=str(tmp_path) if where == "cwd" else "/nonexistent",
                            pythonpath=str(tmp_path) if where == "pythonpath" else "")
    env = {**os.environ, "PYTHONPATH": path}
    r = subprocess.run([str(agent_python()), "-m", "agent.cli", "inspect-job", "mymod:make_job", "--json"],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert '"job": "mymod:make_job"' in r.stdout or "mymod:make_job" in r.stdout
    bare = subprocess.run([str(agent_python()), "-m", "agent.cli", "inspect-job", "mymod:make_job"], cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=120)
    assert bare.returncode == 2 and "mymod" in bare.stderr      # the old PYTHONPATH: not found
