"""What a set of processes listens on, read from /proc (the kernel's view, not what the code says it binds).
Plain standard library: the tests of both venvs use it."""
from __future__ import annotations

import ipaddress
import os


def listening(pids: set[int]) -> set[tuple[str, int]]:
    """(address, port) of every listening TCP socket the processes hold (/proc/<pid>/fd, /proc/net/tcp{,6})."""
    inodes = set()
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:      # closed meanwhile
                continue
            if link.startswith("socket:["):
                inodes.add(link[8:-1])
    out = set()
    for name, size in (("tcp", 4), ("tcp6", 16)):
        for line in open(f"/proc/net/{name}").read().splitlines()[1:]:
            f = line.split()
            if f[3] != "0A" or f[9] not in inodes:        # 0A: LISTEN
                continue
            host, port = f[1].split(":")
            raw = bytes.fromhex(host)
            a = ipaddress.ip_address(b"".join(raw[i:i + 4][::-1] for i in range(0, size, 4)))
            out.add((str(a.ipv4_mapped) if getattr(a, "ipv4_mapped", None) else str(a), int(port, 16)))
    return out
