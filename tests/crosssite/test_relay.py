"""The gate's byte pipes (agent.crosssite.relay): one thread per process whatever the connections, bytes
intact under back-pressure, a half-close passed through, a reset closing both ends, and a gate that keeps a
connection's slot until the pipe closes."""
from __future__ import annotations

import hashlib
import os
import socket
import threading
import time

from agent.crosssite import gate, relay
from schemas import tierpass
from tests.waiting import until

CA = b"r" * 32


def _pair() -> tuple[socket.socket, socket.socket]:
    return socket.socketpair()


def test_a_large_transfer_arrives_intact_through_a_slow_reader_both_ways():
    r = relay.Relay("test-relay")
    a_out, a_in = _pair()
    b_in, b_out = _pair()
    closed = threading.Event()
    r.splice(a_in, b_in, on_close=closed.set)
    blob = os.urandom(8 * 1024 * 1024)
    got = bytearray()

    def slow_read():
        while True:
            chunk = b_out.recv(7000)
            if not chunk:
                return
            got.extend(chunk)
            if len(got) < 512 * 1024:
                time.sleep(0.001)      # the relay must hold back rather than buffer the whole blob

    reader = threading.Thread(target=slow_read)
    reader.start()
    a_out.sendall(blob)
    a_out.shutdown(socket.SHUT_WR)
    reader.join(30)
    assert hashlib.sha256(got).digest() == hashlib.sha256(blob).digest()
    # the other direction still works after the first one ended (a half-close passes through)
    b_out.sendall(b"reply after your EOF")
    b_out.shutdown(socket.SHUT_WR)
    back = b""
    while chunk := a_out.recv(100):
        back += chunk
    assert back == b"reply after your EOF"
    assert closed.wait(5) and r.pairs == 0
    a_out.close()
    b_out.close()


def test_a_reset_on_one_end_closes_the_other_and_calls_on_close_once():
    r = relay.Relay("test-relay")
    a_out, a_in = _pair()
    b_in, b_out = _pair()
    calls = []
    r.splice(a_in, b_in, on_close=lambda: calls.append(1))
    a_out.sendall(b"x")
    assert b_out.recv(10) == b"x"
    b_out.close()                          # the far end goes away: the near end is closed too
    a_out.sendall(b"more")
    a_out.settimeout(5)
    try:
        assert a_out.recv(10) == b""
    except ConnectionResetError:
        pass
    until(lambda: calls == [1], 5, "on_close")
    assert r.pairs == 0
    time.sleep(0.1)
    assert calls == [1]
    a_out.close()


def test_a_pair_that_cannot_be_piped_is_closed_and_every_other_pair_goes_on():
    r = relay.Relay("test-relay")
    a_out, a_in = _pair()
    b_in, b_out = _pair()
    r.splice(a_in, b_in)
    dead_a, dead_b = _pair()
    dead_b.close()                       # its caller closed it before the relay took it: no descriptor
    closed = threading.Event()
    r.splice(dead_a, dead_b, on_close=closed.set)
    assert closed.wait(5)
    # a live pair whose socket is closed under the relay (a caller's bug): that pair ends, not the relay
    c_out, c_in = _pair()
    d_in, d_out = _pair()
    gone = threading.Event()
    r.splice(c_in, d_in, on_close=gone.set)
    c_out.sendall(b"x")
    d_out.settimeout(5)
    assert d_out.recv(10) == b"x"
    c_in.close()
    d_out.sendall(b"to a closed socket")
    assert gone.wait(5)
    a_out.sendall(b"still here")
    b_out.settimeout(5)
    assert b_out.recv(100) == b"still here"
    assert r.pairs == 1
    for s in (a_out, b_out, c_out, d_out):
        s.close()


def _echo_server() -> socket.socket:
    srv = socket.create_server(("127.0.0.1", 0), backlog=512)

    def serve(c):
        with c:
            while data := c.recv(4096):
                c.sendall(data.upper())

    def accept():
        while True:
            try:
                c, _ = srv.accept()
            except OSError:
                return
            threading.Thread(target=serve, args=(c,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    return srv


def test_a_gate_holding_200_connections_pipes_them_all_from_one_thread_and_frees_their_slots():
    """A region's Lighthouse gate holds a connection per site: with a thread for each direction of each, 300
    connections were 600 threads in the gate's process (and as many again in the sites' egress). 200 here keep
    the test's descriptors (four a connection) under a default 1,024."""
    n = 200
    echo = _echo_server()
    now = int(time.time())
    g = gate.GateServer("127.0.0.1", 0, lambda e: tierpass.public_key(CA) if e == 2 else None,
                        {"store": echo.getsockname()[1]}, max_connections=n).start()
    ident = tierpass.issue(CA, 2, "site-0", now + 60)
    before, pairs_before = threading.active_count(), relay.shared().pairs
    conns = []
    try:
        for _ in range(n):
            conns.append(gate.Egress(ident).dial("127.0.0.1", g.port, "store"))
        for i, c in enumerate(conns):
            c.sendall(b"ping %d" % i)
        for i, c in enumerate(conns):
            c.settimeout(5)
            assert c.recv(100) == b"PING %d" % i
        assert g.accepted == n
        # the echo server runs a thread a connection (n); the gate itself adds the relay thread, and the
        # handshake threads have ended
        until(lambda: threading.active_count() - before <= n + 3, 10, "the handshake threads' end")
        # every slot is taken: one more connection is closed at once, unanswered
        with socket.create_connection(("127.0.0.1", g.port), timeout=5) as extra:
            assert extra.recv(100) == b""
        assert g.refused["busy"] == 1
        for c in conns:
            c.close()
        conns = []
        # closed pipes give their slots back: a new connection gets through
        until(lambda: relay.shared().pairs <= pairs_before, 10, "the pipes' close")
        c = gate.Egress(ident).dial("127.0.0.1", g.port, "store")
        conns.append(c)
        c.sendall(b"again")
        c.settimeout(5)
        assert c.recv(100) == b"AGAIN"
    finally:
        for c in conns:
            c.close()
        g.stop()
        echo.close()
