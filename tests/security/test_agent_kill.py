"""Issue 26 item 4: an agent's death is not a RAN event, and it leaves `weaver up` writing its summary.

The attack from the issue, on a live `weaver up`: anyone who reaches the Lighthouse (now: a process on its own
host; from the network its gate lets no one but admitted sites through, and not to these pages) reads the replica ids on
its `/status` page and `POST /replica/<id>/kill`s one (torchft's Manager then exits its process). Before, that
process was the whole agent and `weaver up` counted 320 training-caused deadline misses in that second and
aborted without a summary. Now the Manager lives in the confined training worker: its death stops the
worker, its supervisor ends, and `weaver up` ends the run with its figures and the cause (`ended_by`), with 0
training-caused misses by the platform's ground truth (a dead tree executes nothing). While it runs, every
listener of the run is on loopback (item 7)."""
from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import time
import urllib.error
import urllib.request

import pytest

from tests.proc_net import listening as listening_of
from tests.security.live_up import TAIL_GUARD, weaver_up

pytestmark = pytest.mark.slow


def _worker_of(site: str, pids: set[int]) -> int:
    """The training worker of `site`'s agent: the child of the supervisor whose command line names the site."""
    for pid in pids:
        try:
            cmd = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
            kids = open(f"/proc/{pid}/task/{pid}/children").read().split()
        except OSError:
            continue
        if b"agent.cli" in cmd and site.encode() in cmd and kids:
            return int(kids[0])
    raise AssertionError(f"no worker of {site} among {sorted(pids)}")


def test_the_lighthouse_kill_reaches_no_one_and_a_killed_worker_ends_the_run_with_its_summary_and_no_ran_harm(tmp_path, repo_root):
    summary_path = tmp_path / "s.json"
    with weaver_up(repo_root, tmp_path / "run", *TAIL_GUARD, "--duration", "60", "--round-ms", "2000",
                   "--json", str(summary_path)) as up:
        def lighthouse_ids():
            # the Lighthouse itself (loopback): its gate shows no one its page (tests/crosssite/test_tier_gate.py);
            # a process on the host can still reach it, and that kill is what this test is about
            lh = re.search(r"weaver up: lighthouse gate://\S+ \(its gate; the Lighthouse itself on (http://\S+)\)",
                           up.text)
            if not lh or up.rounds() < 2:
                return None
            status = urllib.request.urlopen(lh.group(1) + "/status", timeout=5).read().decode()
            ids = sorted(set(re.findall(r"site-0:[0-9a-f-]{36}", status)))
            return (lh.group(1), ids[0]) if ids else None
        found = up.poll_until(lighthouse_ids)
        assert found, "no replica of site-0 on the Lighthouse's status page:\n" + up.text[-3000:]
        lighthouse, replica = found
        listening = listening_of(up.pids())
        # the Lighthouse's own kill reaches no one now: the replica registered its gate's name
        # (agent.crosssite.gate), which only the tier's own resolver turns into a connection
        req = urllib.request.Request(f"{lighthouse}/replica/{replica}/kill", method="POST")
        with contextlib.suppress(urllib.error.HTTPError, TimeoutError):
            urllib.request.urlopen(req, timeout=5).read()
        time.sleep(3.0)
        assert up.proc.poll() is None and "agent:0 exited" not in up.text, up.text[-3000:]
        # so the agent's death is brought about as any death is: its worker (which holds the Manager) is
        # SIGKILLed, the way torchft's Kill ends its process
        os.kill(_worker_of("site-0", up.pids()), signal.SIGKILL)
        up.proc.wait(timeout=120)
    proc, out = up.proc, up.text
    # issue 26 item 7: every listener of the run (weaver up's RIC, the xApp's REST, RMR and broker, the agents'
    # inspection, metrics and tier servers, the workers' torchft Manager and store) on loopback
    assert len(listening) >= 10 and all(a in ("127.0.0.1", "::1") for a, _ in listening), sorted(listening)
    assert proc.returncode == 1, out[-3000:]
    assert "the run ends here" in out and "agent:0" in out, out[-3000:]
    s = json.loads(summary_path.read_text())
    assert "agent:0 exited" in s["ended_by"], s["ended_by"]
    t = s["totals"]
    assert t["deadline_misses_attributable_to_training"] == 0, \
        {k: (v["deadline_misses_attributable_to_training"], v["ground_truth"]["worst_periods"]) for k, v in s["sites"].items()}
    assert s["sites"]["site-0"]["sm_ms_beyond_lease_max"] <= s["guard_sms"] * 100.0, s["sites"]["site-0"]
    assert t["slots"] > 0 and t["tokens_trained"] > 0
