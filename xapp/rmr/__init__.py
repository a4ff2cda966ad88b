"""Pure-Python, wire-compatible RMR (SI95 transport, header v3); see `shared/design/rmr-wire.md`.

`RmrFramer` is the sans-IO codec, `RmrEndpoint` the asyncio endpoint, `Router`/`RouteParser` the route
table, `open_backend` the `python | native` switch. `python -m xapp.rmr` is the operator CLI.
"""
from .endpoint import RmrEndpoint, parse_port
from .framer import NEED_DATA, RmrFramer, decode_frame, encode_frame
from .message import (
    Mtype,
    RmrClosedError,
    RmrEncodeError,
    RmrError,
    RmrFrameError,
    RmrMessage,
    RmrSendError,
    RmrState,
)
from .routes import RouteEntry, RouteParser, Router, RouteTable, RouteTableError, parse_route_table

__all__ = [
    "NEED_DATA",
    "Mtype",
    "RmrClosedError",
    "RmrEncodeError",
    "RmrEndpoint",
    "RmrError",
    "RmrFrameError",
    "RmrFramer",
    "RmrMessage",
    "RmrSendError",
    "RmrState",
    "RouteEntry",
    "RouteParser",
    "RouteTable",
    "RouteTableError",
    "Router",
    "decode_frame",
    "encode_frame",
    "parse_port",
    "parse_route_table",
]
