"""Helpers for the RMR tests: the §4 example frame byte for byte, raw TCP peers that see exactly the bytes on the wire."""
from __future__ import annotations

import asyncio
import socket
import struct

from xapp.rmr import decode_frame

# rmr-wire.md §4, row by row (frame offsets in the comments).
EXAMPLE_PAYLOAD = b"count=0 received= 0 ts=1795965246 1804289383 stand up and cheer!\0"
EXAMPLE_SRC = b"127.0.0.1:43086"
EXAMPLE_FRAME = b"".join([
    bytes.fromhex("8f 01 00 00"),                      # 0x000 length, native (LE) = 399
    bytes.fromhex("00 00 01 8f"),                      # 0x004 length, BE
    bytes.fromhex("24"),                               # 0x008 '$'
    bytes(41),                                         # 0x009-0x031 unused transport bytes
    bytes.fromhex("00 00 2f 12"),                      # 0x032 mtype 12050
    bytes.fromhex("00 00 00 41"),                      # 0x036 plen 65
    bytes.fromhex("00 00 00 03"),                      # 0x03a rmr_ver 3
    bytes(32),                                         # 0x03e xid
    bytes(32),                                         # 0x05e sid
    EXAMPLE_SRC.ljust(64, b"\0"),                      # 0x07e src
    bytes(32),                                         # 0x0be meid
    bytes(20),                                         # 0x0de pad, ts
    bytes.fromhex("00 00 00 00"),                      # 0x0f2 flags (LE)
    bytes.fromhex("00 00 01 18"),                      # 0x0f6 len0 280
    bytes.fromhex("00 00 00 00"),                      # 0x0fa len1
    bytes.fromhex("00 00 00 04"),                      # 0x0fe len2
    bytes.fromhex("00 00 00 00"),                      # 0x102 len3
    bytes.fromhex("ff ff ff ff"),                      # 0x106 sub_id -1
    EXAMPLE_SRC.ljust(64, b"\0"),                      # 0x10a srcip
    bytes.fromhex("00 00 00 00"),                      # 0x14a d1
    EXAMPLE_PAYLOAD,                                   # 0x14e payload
])
assert len(EXAMPLE_FRAME) == 399 and EXAMPLE_FRAME.index(b"count=") == 0x14E


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RawConn:
    """One raw TCP connection that splits what arrives into frames by the LE length word (keeping the
    exact bytes) and decodes each with `decode_frame`."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.reader, self.writer = reader, writer
        self.buf = b""

    async def frame(self, timeout: float = 5.0):
        """The next (message, raw frame bytes)."""
        while True:
            if len(self.buf) >= 4:
                n = int.from_bytes(self.buf[:4], "little")
                if len(self.buf) >= n:
                    raw, self.buf = self.buf[:n], self.buf[n:]
                    return decode_frame(raw), raw
            data = await asyncio.wait_for(self.reader.read(65536), timeout)
            if not data:
                raise EOFError("peer closed")
            self.buf += data

    async def send(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    async def eof(self, timeout: float = 5.0) -> bool:
        """True once the peer has closed this connection (reads until EOF)."""
        while True:
            try:
                data = await asyncio.wait_for(self.reader.read(65536), timeout)
            except (ConnectionResetError, BrokenPipeError):
                return True
            if not data:
                return True

    def close(self) -> None:
        self.writer.close()


async def raw_connect(port: int, host: str = "127.0.0.1") -> RawConn:
    reader, writer = await asyncio.open_connection(host, port)
    return RawConn(reader, writer)


class RawListener:
    """A plain TCP server standing in for a peer: records every accepted connection."""

    def __init__(self):
        self.conns: list[RawConn] = []
        self._new = asyncio.Event()
        self.server = None
        self.port = 0

    async def start(self, port: int = 0) -> RawListener:
        self.server = await asyncio.start_server(self._accept, "127.0.0.1", port, reuse_address=True)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    @property
    def name(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def _accept(self, reader, writer):
        self.conns.append(RawConn(reader, writer))
        self._new.set()

    async def accepted(self, n: int = 1, timeout: float = 5.0) -> RawConn:
        """Wait until at least n connections were accepted; return the n-th."""
        async def wait():
            while len(self.conns) < n:
                self._new.clear()
                await self._new.wait()
        await asyncio.wait_for(wait(), timeout)
        return self.conns[n - 1]

    async def close(self) -> None:
        for c in self.conns:
            c.close()
        self.server.close()
        await self.server.wait_closed()


async def eventually(predicate, timeout: float = 5.0, what: str = "condition") -> None:
    """Wait (by polling the loop, not a fixed sleep) until predicate() is true."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.005)


def build_frame(mtype=7, payload=b"x", *, src=b"127.0.0.1:1", srcip=b"", xid=b"", meid=b"", flags=0,
                trace=b"", d1=b"\0\0\0\0", sub_id=-1, plen=None, length=None, len0=280) -> bytes:
    """A frame built by hand (not by our encoder), to play C's part."""
    hdr = bytearray(len0)
    struct.pack_into(">iii", hdr, 0, mtype, len(payload) if plen is None else plen, 3)
    hdr[12:12 + len(xid)] = xid
    hdr[76:76 + len(src)] = src
    hdr[140:140 + len(meid)] = meid
    struct.pack_into("<I", hdr, 192, flags)
    struct.pack_into(">iiiii", hdr, 196, len0, len(trace), len(d1), 0, sub_id)
    hdr[216:216 + len(srcip)] = srcip
    body = bytes(hdr) + trace + d1 + payload
    n = 50 + len(body) if length is None else length
    return struct.pack("<I", n & 0xFFFFFFFF) + struct.pack(">I", n & 0xFFFFFFFF) + b"$" + bytes(41) + body
