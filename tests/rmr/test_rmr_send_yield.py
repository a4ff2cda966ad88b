"""Sends yield to the event loop (issue 15): an application that sends in a loop, with synchronous work
between sends, must not stop its endpoint reading. A C peer answers by `rmr_rts_msg`, which dials our src
and writes without blocking: when our socket is not read, its kernel buffers fill and the reply fails with
RMR_ERR_SENDFAILED (240 of 1,000 lost with 5 ms of work per send). The peer here is a plain-socket thread
that does the same: it answers each message on its own connection to our listen port, with a small
send buffer, and gives a reply up once writing it blocks past a bound."""
from __future__ import annotations

import select
import socket
import threading
import time

from rmr_helpers import free_port

from xapp.rmr import RmrEndpoint, RmrMessage, decode_frame, encode_frame, reply_message

N = 1000
WORK_S = 0.005           # synchronous work per send: the loop does not run meanwhile
PAYLOAD = bytes(4096)    # 1,000 replies of ~4.4 kB: far more than an unread socket's kernel buffers hold
WRITE_BOUND_S = 0.5      # the peer gives a reply up once its write blocks this long (C: SENDFAILED)
MT_REQ, MT_REPLY = 12050, 12051


class RtsPeer(threading.Thread):
    """Reads our frames on the connection we dialled; answers each on a connection it dials to the
    message's src (as C RMR's rts does), non-blocking, with a small SO_SNDBUF."""

    def __init__(self, port: int):
        super().__init__(daemon=True)
        self.listener = socket.create_server(("127.0.0.1", port))
        self.replied = self.failed = 0
        self.longest_block_s = 0.0
        self.done = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self._serve()
        except BaseException as exc:  # surfaced by the test, not lost in the thread
            self.error = exc
        finally:
            self.done.set()

    def _serve(self) -> None:
        conn, _ = self.listener.accept()
        conn.settimeout(30)
        back: socket.socket | None = None
        buf = b""
        seen = 0
        while seen < N:
            data = conn.recv(1 << 16)
            if not data:
                break
            buf += data
            while len(buf) >= 4 and len(buf) >= (n := int.from_bytes(buf[:4], "little")):
                msg, buf = decode_frame(buf[:n]), buf[n:]
                seen += 1
                if back is None:
                    host, _, port = msg.src.rpartition(":")
                    back = socket.socket()
                    back.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 8192)
                    back.connect((host, int(port)))
                    back.setblocking(False)
                self._reply(back, encode_frame(reply_message(msg, MT_REPLY), b"127.0.0.1:0", b"127.0.0.1:0"))
        conn.close()
        if back is not None:
            back.close()

    def _reply(self, sock: socket.socket, frame: bytes) -> None:
        view = memoryview(frame)
        started = time.monotonic()
        while view:
            try:
                view = view[sock.send(view):]
                continue
            except BlockingIOError:
                pass
            left = WRITE_BOUND_S - (time.monotonic() - started)
            if left <= 0 or not select.select([], [sock], [], left)[1]:
                self.failed += 1   # the frame is half written: the stream is now unusable, as in C
                self.longest_block_s = max(self.longest_block_s, time.monotonic() - started)
                raise ConnectionError(f"reply write blocked for {WRITE_BOUND_S}s after {self.replied} replies")
        self.replied += 1
        self.longest_block_s = max(self.longest_block_s, time.monotonic() - started)


def test_replies_are_read_while_the_application_sends_in_a_loop(run, tmp_path):
    port = free_port()
    rt = tmp_path / "rt"
    rt.write_text(f"newrt|start\nrte|{MT_REQ}|127.0.0.1:{port}\nnewrt|end|1\n")
    peer = RtsPeer(port)
    peer.start()

    async def main():
        ep = await RmrEndpoint.open(0, str(rt), src_id="127.0.0.1", env={})
        try:
            for i in range(N):
                await ep.send(RmrMessage(MT_REQ, PAYLOAD, xaction=f"{i:032d}".encode()))
                time.sleep(WORK_S)   # the application's synchronous work between sends
            got = set()
            while len(got) < peer.replied or not peer.done.is_set():
                try:
                    msg = await ep.receive(2.0)
                except TimeoutError:
                    break
                assert msg.mtype == MT_REPLY
                got.add(msg.xaction)
            return got
        finally:
            await ep.close()

    got = run(main(), timeout=60)
    peer.done.wait(10)
    assert peer.error is None, f"{peer.error} ({len(got)} replies read)"
    assert peer.failed == 0 and peer.replied == N
    assert got == {f"{i:032d}".encode() for i in range(N)}, f"{N - len(got)} replies lost"
    assert peer.longest_block_s < WRITE_BOUND_S
