"""The tier gate: no byte of the cross-site tier's services reaches a peer that holds no pass of the epoch.

torchft's Lighthouse, its ManagerServer and c10d's TCPStore take no credential: whoever reaches them joins
the quorum, reads the round's membership, calls Kill or writes the rendezvous. In a gated tier they bind
127.0.0.1, and the one listener a host puts on the network for them is a gate:

    client -> gate   TCP connect
    gate -> client   "WGATE2 <challenge, 32 hex>\\n"                 16 random bytes, new for each connection
    client -> gate   "WGATE2 <epoch> <site> <service> <expiry> <site key, 64 hex> <pass, 128 hex> <sig, 128 hex>\\n"
                     pass = the broker's signature over (site, epoch, expiry, site key)     (schemas.tierpass)
                     sig  = the site's signature over "weaver-gate|<challenge>|<epoch>|<site>|<service>"
    gate -> client   "OK\\n", then the bytes of <service> both ways; on anything else it closes, saying nothing

Each admitted site holds a pass of its own (schemas.tierpass: Ed25519, the broker's CA key of the epoch signs
(site, epoch, expiry, the site's public key); the site's lease stream hands it its key, its pass and the CA's
public key, and renews the pass while it admits the site). A gate checks the pass against the epoch's CA key and
the hello's signature against the key the pass names: only a site the broker admitted gets through, it gets
through as itself (one site's key cannot speak for another), and not after its pass ends; the challenge makes
a recorded hello worthless. A hello names one of the services the gate was given (a site's gate: its Manager,
its store, its state server; the Lighthouse host's gate: the Lighthouse, and of it gRPC only: an HTTP/1
request - its /status page, its /replica/<id>/kill - is closed unanswered). A pass is checked when a
connection opens: one already open stays up after the pass's end until it closes (torchft's channels
reconnect after a failure, and then need a live pass).

The handshake is sans-IO (`challenge_line`, `hello_line`, `check_hello`); `GateServer` and `Egress` are the
sockets. A site's own clients reach a peer's service through its `Egress`: a loopback port per (peer gate,
service) that says the hello and then pipes. Peers name their services by an advertised host,
`wg<gate port>.<host>` (`advertise`): torchft carries the name (the quorum's manager and store addresses)
and only the tier's resolver (`connect_address`) turns it into a connection; nothing else can resolve it.

What the gate does not do: it does not look inside the pipe, so the replica id a site gives in torchft's
quorum is its word (as torchft trusts its replicas; what a member contributes is bounded by the round's checks,
rounds.contribution_ok and gradient_ok; the gate logs the site each connection authenticated as); loopback is the host's own (the inner listeners answer any local process); gloo's pairwise
connections are made from the addresses exchanged through the gated store and are not themselves
authenticated.
"""
from __future__ import annotations

import logging
import os
import re
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from agent.crosssite import relay
from schemas.tierpass import PassRefused, TierIdentity, TierPass, check_pass, verify

log = logging.getLogger("weaver.gate")

MAGIC = b"WGATE2"
MAX_LINE = 512
HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
_SITE = re.compile(r"[A-Za-z0-9._:-]{1,64}")
_SERVICE = re.compile(r"[a-z]{1,16}")
_ADVERTISED = re.compile(r"wg(\d{1,5})\.(.+)")

CaForEpoch = Callable[[int], "bytes | None"]      # the epoch's CA public key, None: an epoch not taken


class GateRefused(ValueError):
    """A hello the gate does not take; `reason` is one word for the gate's counters."""

    def __init__(self, reason: str, detail: str = ""):
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


@dataclass(frozen=True)
class Hello:
    epoch: int
    site: str
    service: str


# -- the handshake, sans-IO ----------------------------------------------------------------------------
def challenge_line(challenge: bytes) -> bytes:
    return MAGIC + b" " + challenge.hex().encode() + b"\n"


def parse_challenge(line: bytes) -> bytes:
    parts = line.strip().split(b" ")
    if len(parts) != 2 or parts[0] != MAGIC or not re.fullmatch(rb"[0-9a-f]{32}", parts[1]):
        raise GateRefused("challenge", "the peer is not a tier gate")
    return bytes.fromhex(parts[1].decode())


def _hello_message(challenge: bytes, epoch: int, site: str, service: str) -> bytes:
    return b"weaver-gate|" + challenge + f"|{epoch}|{site}|{service}".encode()


def hello_line(identity: TierIdentity, challenge: bytes, service: str) -> bytes:
    p = identity.tier_pass
    if not _SITE.fullmatch(p.site) or not _SERVICE.fullmatch(service):
        raise ValueError(f"a gate hello needs a plain site id and service name, got {p.site!r} {service!r}")
    sig = identity.sign(_hello_message(challenge, p.epoch, p.site, service))
    return b" ".join([MAGIC, str(p.epoch).encode(), p.site.encode(), service.encode(), str(p.expiry_unix).encode(),
                      p.site_public.hex().encode(), p.ca_signature.hex().encode(), sig.hex().encode()]) + b"\n"


def check_hello(line: bytes, challenge: bytes, ca_for_epoch: CaForEpoch, services, now_unix: float) -> Hello:
    """The hello a client sent for `challenge`, or GateRefused: malformed, unknown service or epoch, a pass the
    epoch's CA did not sign or that has ended, or a signature that is not the pass's site's."""
    if len(line) > MAX_LINE or not line.endswith(b"\n"):
        raise GateRefused("malformed", "no hello line")
    try:
        magic, epoch_s, site, service, expiry_s, pub, pass_sig, sig = line.strip().decode("ascii").split(" ")
    except (UnicodeDecodeError, ValueError):
        raise GateRefused("malformed", "not eight fields") from None
    if magic != MAGIC.decode() or not epoch_s.isdigit() or len(epoch_s) > 19 or not _SITE.fullmatch(site) \
            or not _SERVICE.fullmatch(service) or not expiry_s.isdigit() or len(expiry_s) > 12 \
            or not re.fullmatch(r"[0-9a-f]{64}", pub) or not re.fullmatch(r"[0-9a-f]{128}", pass_sig) \
            or not re.fullmatch(r"[0-9a-f]{128}", sig):
        raise GateRefused("malformed", "bad field")
    epoch = int(epoch_s)
    if service not in services:
        raise GateRefused("service", service)
    ca = ca_for_epoch(epoch)
    if not ca:
        raise GateRefused("epoch", str(epoch))
    p = TierPass(site, epoch, int(expiry_s), bytes.fromhex(pub), bytes.fromhex(pass_sig))
    try:
        check_pass(p, ca, now_unix)
    except PassRefused as exc:
        raise GateRefused(exc.reason, site) from None
    if not verify(p.site_public, bytes.fromhex(sig), _hello_message(challenge, epoch, site, service)):
        raise GateRefused("signature", site)
    return Hello(epoch, site, service)


def advertise(host: str, gate_port: int) -> str:
    """The name a gated site gives its services in the quorum: its gate, not the services' loopback ports."""
    return f"wg{gate_port}.{host}"


def parse_advertised(name: str) -> tuple[str, int] | None:
    m = _ADVERTISED.fullmatch(name or "")
    return (m.group(2), int(m.group(1))) if m and 0 < int(m.group(1)) < 65536 else None


# -- sockets ----------------------------------------------------------------------------------------------
def _read_line(sock: socket.socket, limit: int = MAX_LINE) -> bytes:
    """One handshake line. Nothing is pipelined in the handshake: bytes after the line are refused."""
    buf = b""
    while b"\n" not in buf and len(buf) < limit:
        chunk = sock.recv(limit - len(buf))
        if not chunk:
            break
        buf += chunk
    if b"\n" in buf and not buf.endswith(b"\n"):
        raise GateRefused("malformed", "bytes after the line")
    return buf


def _read_exact(sock: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            break
        buf += chunk
    return buf


class GateServer:
    """The one network listener of a gated host: authenticates each connection, then pipes it to the
    loopback port of the service its hello named. `services` may be given (and changed) after start."""

    def __init__(self, host: str, port: int, ca_for_epoch: CaForEpoch, services: dict[str, int] | None = None,
                 *, grpc_only: tuple[str, ...] = (), max_connections: int = 64, hello_timeout_s: float = 2.0,
                 name: str = "gate", on_hello: Callable[[Hello], None] | None = None,
                 wall: Callable[[], float] = time.time):
        self.ca_for_epoch = ca_for_epoch
        self.wall = wall
        self.sites: Counter = Counter()        # connections let through, by the site they authenticated as
        self.on_hello = on_hello
        self.services: dict[str, int] = dict(services or {})
        self.grpc_only = grpc_only
        self.hello_timeout_s = hello_timeout_s
        self.name = name
        self.refused: Counter = Counter()
        self.accepted = 0
        self._slots = threading.BoundedSemaphore(max_connections)
        self._sock = socket.create_server((host, port), backlog=64)
        self.host, self.port = host, self._sock.getsockname()[1]
        self._closed = False
        self._thread = threading.Thread(target=self._accept, daemon=True, name=f"{name}-accept")

    def start(self) -> GateServer:
        self._thread.start()
        return self

    def set_service(self, service: str, port: int) -> None:
        self.services[service] = port

    def _accept(self) -> None:
        while not self._closed:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            if not self._slots.acquire(blocking=False):   # a flood waits for nothing: it is closed
                self.refused["busy"] += 1
                conn.close()
                continue
            threading.Thread(target=self._serve, args=(conn,), daemon=True, name=f"{self.name}-conn").start()

    def _serve(self, conn: socket.socket) -> None:
        upstream = None
        try:
            conn.settimeout(self.hello_timeout_s)
            challenge = os.urandom(16)
            conn.sendall(challenge_line(challenge))
            hello = check_hello(_read_line(conn), challenge, self.ca_for_epoch, self.services, self.wall())
            self.sites[hello.site] += 1
            if self.on_hello is not None:
                self.on_hello(hello)
            head = b""
            if hello.service in self.grpc_only:
                conn.sendall(b"OK\n")
                head = _read_exact(conn, len(HTTP2_PREFACE))
                if head != HTTP2_PREFACE:
                    raise GateRefused("http1", hello.site)
            upstream = socket.create_connection(("127.0.0.1", self.services[hello.service]), timeout=5)
            if not head:
                conn.sendall(b"OK\n")
            upstream.sendall(head)
            conn.settimeout(None)
            upstream.settimeout(None)
            self.accepted += 1
        except GateRefused as exc:
            self.refused[exc.reason] += 1
            log.info("%s refused a connection: %s", self.name, exc)
            conn.close()
            self._slots.release()
        except OSError as exc:
            self.refused["io"] += 1
            log.debug("%s: %s", self.name, exc)
            conn.close()
            if upstream is not None:
                upstream.close()
            self._slots.release()
        else:     # the slot is held while the connection is open
            relay.shared().splice(conn, upstream, on_close=self._slots.release)

    def stop(self) -> None:
        self._closed = True
        try:
            self._sock.close()
        except OSError:
            pass


class Egress:
    """A site's way out to peers' gates: one loopback listener per (gate host, gate port, service), each
    connection accepted on it says the hello with the site's pass and then pipes to the peer's service.
    `renew` takes the pass the broker renewed; connections made from then on carry it."""

    def __init__(self, identity: TierIdentity, *, timeout_s: float = 5.0):
        self.identity, self.timeout_s = identity, timeout_s
        self._tunnels: dict[tuple[str, int, str], socket.socket] = {}
        self._lock = threading.Lock()
        self.failures: Counter = Counter()

    @property
    def epoch(self) -> int:
        return self.identity.epoch

    def renew(self, identity: TierIdentity) -> None:
        if (identity.site, identity.epoch) != (self.identity.site, self.identity.epoch):
            raise ValueError("a renewed pass is of the same site and epoch")
        self.identity = identity

    def port_for(self, host: str, gate_port: int, service: str) -> int:
        with self._lock:
            lst = self._tunnels.get((host, gate_port, service))
            if lst is None:
                lst = socket.create_server(("127.0.0.1", 0), backlog=64)
                self._tunnels[(host, gate_port, service)] = lst
                threading.Thread(target=self._accept, args=(lst, host, gate_port, service), daemon=True,
                                 name="egress-accept").start()
            return lst.getsockname()[1]

    def _accept(self, lst: socket.socket, host: str, gate_port: int, service: str) -> None:
        while True:
            try:
                conn, _ = lst.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn, host, gate_port, service), daemon=True,
                             name="egress-conn").start()

    def dial(self, host: str, gate_port: int, service: str) -> socket.socket:
        """A connection to `service` behind the gate at host:gate_port, past the hello."""
        up = socket.create_connection((host, gate_port), timeout=self.timeout_s)
        try:
            challenge = parse_challenge(_read_line(up))
            up.sendall(hello_line(self.identity, challenge, service))
            if _read_line(up, 3) != b"OK\n":
                raise GateRefused("refused", f"the gate at {host}:{gate_port} closed on {service}")
            up.settimeout(None)
            return up
        except BaseException:
            up.close()
            raise

    def _serve(self, conn: socket.socket, host: str, gate_port: int, service: str) -> None:
        try:
            up = self.dial(host, gate_port, service)
        except (OSError, GateRefused) as exc:
            self.failures[service] += 1
            log.warning("egress to %s:%d (%s) failed: %s", host, gate_port, service, exc)
            conn.close()
            return
        relay.shared().splice(conn, up)

    def close(self) -> None:
        with self._lock:
            for lst in self._tunnels.values():
                lst.close()
            self._tunnels.clear()


# -- the process's resolver: torchft's addresses -> connections ------------------------------------------
_LOCAL: dict[str, dict[str, int]] = {}     # an advertised name of this process -> {service: loopback port}
_EGRESS: list[Egress] = []
_REG_LOCK = threading.Lock()


def register_local(name: str, service: str, port: int) -> None:
    with _REG_LOCK:
        _LOCAL.setdefault(name, {})[service] = port


def register_egress(egress: Egress) -> None:
    with _REG_LOCK:
        _EGRESS.append(egress)


def unregister(name: str, egress: Egress | None) -> None:
    with _REG_LOCK:
        _LOCAL.pop(name, None)
        if egress in _EGRESS:
            _EGRESS.remove(egress)


def connect_address(host: str, port: int, service: str) -> tuple[str, int]:
    """Where to connect for `service` at host:port as torchft names it: a name advertised by this process ->
    its loopback port; another advertised name -> this process's egress tunnel to that gate; anything
    else is returned as it is (an ungated tier)."""
    with _REG_LOCK:
        own = _LOCAL.get(host)
        egress = list(_EGRESS)
    if own is not None:
        if service not in own:
            raise ConnectionRefusedError(f"this site's gate serves no {service!r}")
        return "127.0.0.1", own[service]
    gated = parse_advertised(host)
    if gated is None:
        return host, port
    ids = {(e.identity.site, e.identity.epoch) for e in egress}
    if len(ids) != 1:   # a process holds one site's pass (tests with two in one process must not guess)
        raise ConnectionRefusedError(f"no single tier pass in this process to reach {host} ({len(ids)} held)")
    return "127.0.0.1", egress[-1].port_for(gated[0], gated[1], service)
