"""Issue 26 item 5: a restarted xApp restores its epoch and ledger from SDL, in `weaver up` as on a RIC.

Before, `weaver up` ran the xApp on the embedded in-process store, so an `xapp-kill` fault brought it back with
epoch 1 and an empty ledger (an old lease id could come again). Now, where a Redis answers on the host (the RIC's
DBaaS here; `make test` starts one), the xApp uses it with a namespace of the run's own: the restarted xApp's
epoch is the next one, and the namespace is gone when the run ends. Real processes, real Redis."""
from __future__ import annotations

import json
import re
import subprocess
import threading
import time
import urllib.request

import pytest
import redis

from tests.security.live_up import TAIL_GUARD

pytestmark = pytest.mark.slow


def test_an_xapp_killed_mid_run_comes_back_with_the_next_epoch_from_sdl(tmp_path, repo_root):
    r = redis.Redis("127.0.0.1", 6379, socket_timeout=2)
    r.ping()
    proc = subprocess.Popen([str(repo_root / ".venv-xapp" / "bin" / "weaver"), "up", *TAIL_GUARD, "--duration", "30",
                             "--fault", "xapp-kill", "--fault-at", "10", "--no-cross-site",
                             "--json", str(tmp_path / "s.json"), "--run-dir", str(tmp_path / "run")],
                            cwd=repo_root, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True).start()
    epochs: list[int] = []
    keys_seen = 0
    namespace = ""
    try:
        deadline = time.monotonic() + 200
        while proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.5)
            text = "".join(lines)
            rest = re.search(r"weaver up: rest\s+(http://\S+)", text)
            ns = re.search(r"weaver up: sdl\s+redis \S+ namespace (\S+)", text)
            if not rest or not ns:
                continue
            namespace = ns.group(1)
            keys_seen = max(keys_seen, len(list(r.scan_iter(match="{" + namespace + "},*"))))
            try:
                epoch = json.loads(urllib.request.urlopen(rest.group(1) + "/agents", timeout=2).read())["epoch"]
            except OSError:
                continue                   # killed, restarting
            if not epochs or epochs[-1] != epoch:
                epochs.append(epoch)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    out = "".join(lines)
    assert proc.returncode == 0, out[-3000:]
    assert namespace and keys_seen > 0, out[:3000]
    assert len(epochs) == 2 and epochs[1] == epochs[0] + 1, (epochs, out[-2000:])
    assert not list(r.scan_iter(match="{" + namespace + "},*"))        # the run's namespace is removed
    s = json.loads((tmp_path / "s.json").read_text())
    t = s["totals"]   # none but those in overruns the kernel repaid (testbed.groundtruth.AgentTruth.settle)
    assert t["deadline_misses_attributable_to_training"] - t["deadline_misses_in_repaid_overruns"] == 0, t
