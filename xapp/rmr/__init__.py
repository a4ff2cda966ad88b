"""Pure-Python, wire-compatible RMR (SI95 transport, header v3); see `shared/design/rmr-wire.md`.

`RmrFramer` is the sans-IO codec, `RmrEndpoint` the asyncio endpoint, `Router`/`RouteParser` the route
table, `open_backend` the `python | native` switch. `python -m xapp.rmr` is the operator CLI.
"""
from .backend import BACKENDS, NativeUnavailable, RmrBackend, open_backend
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
    reply_message,
    rmr_consts_json,
)
from .routes import RouteEntry, RouteParser, Router, RouteTable, RouteTableError, parse_route_table

__all__ = [
    "BACKENDS",
    "NEED_DATA",
    "NativeUnavailable",
    "RmrBackend",
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
    "open_backend",
    "parse_route_table",
    "reply_message",
    "rmr_consts_json",
]
