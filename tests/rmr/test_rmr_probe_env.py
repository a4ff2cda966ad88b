"""`python -m xapp.rmr probe` takes the RMR environment as an RMR program does (issue 15): RMR_BIND_IF (it
listens only there and says so in src/srcip), RMR_SRC_ID (the name in src); not the xApp's route table or
route-manager port. The target is a plain-socket peer that answers as C RMR's rts does: it dials the
request's src (else srcip) and writes the HEALTH_CHECK_RESP there."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

from xapp.rmr import Mtype, decode_frame, encode_frame, reply_message

ROOT = Path(__file__).resolve().parents[2]
BIND = "127.0.0.2"  # a loopback address other than 127.0.0.1: Linux answers on all of 127/8


class HealthPeer(threading.Thread):
    """Answers one health check by dialling back; records the request and whether the prober could be
    reached on 127.0.0.1 as well (it must not, when bound elsewhere)."""

    def __init__(self):
        super().__init__(daemon=True)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.request = None
        self.reachable_on_loopback: bool | None = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.listener.settimeout(20)
            conn, _ = self.listener.accept()
            conn.settimeout(20)
            buf = b""
            while len(buf) < 4 or len(buf) < int.from_bytes(buf[:4], "little"):
                data = conn.recv(65536)
                if not data:
                    raise EOFError("prober closed before a whole frame")
                buf += data
            self.request = msg = decode_frame(buf[:int.from_bytes(buf[:4], "little")])
            their_port = int(msg.src.rpartition(":")[2])
            try:
                socket.create_connection(("127.0.0.1", their_port), timeout=2).close()
                self.reachable_on_loopback = True
            except OSError:
                self.reachable_on_loopback = False
            frame = encode_frame(reply_message(msg, Mtype.HEALTH_CHECK_RESP, b"OK\n"), b"peer:1", b"127.0.0.1:1")
            for addr in (msg.src, msg.srcip):  # C rts: src first, then srcip
                host, _, port = addr.rpartition(":")
                try:
                    back = socket.create_connection((host, int(port)), timeout=2)
                except OSError:
                    continue
                back.sendall(frame)
                back.close()
                break
            conn.close()
        except BaseException as exc:
            self.error = exc


def probe(target: str, **rmr_env: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RMR_")}
    env.update(PYTHONPATH=str(ROOT), **rmr_env)
    return subprocess.run([sys.executable, "-m", "xapp.rmr", "probe", target, "--timeout", "10"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=30)


def test_probe_listens_and_names_itself_on_rmr_bind_if():
    peer = HealthPeer()
    peer.start()
    r = probe(f"127.0.0.1:{peer.port}", RMR_BIND_IF=BIND)
    peer.join(20)
    assert peer.error is None, peer.error
    port = peer.request.src.rpartition(":")[2]
    assert (peer.request.src, peer.request.srcip) == (f"{BIND}:{port}", f"{BIND}:{port}")
    assert peer.reachable_on_loopback is False  # bound to RMR_BIND_IF only, not 0.0.0.0
    assert r.returncode == 0 and r.stdout.startswith("OK:"), (r.stdout, r.stderr)


def test_probe_writes_rmr_src_id_and_is_reached_on_the_bound_address():
    peer = HealthPeer()
    peer.start()
    r = probe(f"127.0.0.1:{peer.port}", RMR_BIND_IF=BIND, RMR_SRC_ID="weaver-probe.invalid")
    peer.join(20)
    assert peer.error is None, peer.error
    port = peer.request.src.rpartition(":")[2]
    assert peer.request.src == f"weaver-probe.invalid:{port}"  # the name does not resolve: srcip carries it
    assert peer.request.srcip == f"{BIND}:{port}"
    assert r.returncode == 0 and r.stdout.startswith("OK:"), (r.stdout, r.stderr)


def test_probe_ignores_the_xapps_route_table_and_route_manager_port():
    """Run inside the xApp's container, probe sees the xApp's RMR_RTG_SVC (a port the xApp holds) and
    RMR_SEED_RT: it must neither bind the one nor need the other."""
    peer = HealthPeer()
    peer.start()
    with socket.create_server(("0.0.0.0", 0)) as taken:
        r = probe(f"127.0.0.1:{peer.port}", RMR_RTG_SVC=str(taken.getsockname()[1]),
                  RMR_SEED_RT="/nonexistent/weaver-routes.rt", RMR_SRC_ID="127.0.0.1")
    peer.join(20)
    assert peer.error is None, peer.error
    assert r.returncode == 0 and r.stdout.startswith("OK:"), (r.stdout, r.stderr)
