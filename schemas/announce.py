"""Lines that another process parses (`weaver up` reads an agent's addresses, the xApp's ports, the Lighthouse's
address from their output), written with one write() each.

`print(line, flush=True)` writes the text and its newline in two calls; in a process whose other threads log
to the same file, a log line can land between the two. It did: an agent's `inspect on 127.0.0.1:38973` was
followed by its lease client's `2026-12-03 06:30:12,004 INFO ...` before the newline, `weaver up` read the
address as `127.0.0.1:389732026-12-03`, and waited two minutes for an agent that had connected at once.
One write() of the whole line keeps a line whole: the logging handlers write theirs the same way.
"""
from __future__ import annotations

import sys
from typing import TextIO


def announce(line: str, stream: TextIO | None = None) -> None:
    out = sys.stdout if stream is None else stream
    out.write(line + "\n")
    out.flush()
