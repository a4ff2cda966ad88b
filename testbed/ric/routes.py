"""Static RMR route tables for the mini-RIC, its E2 nodes and the xApps that use it (rmr-wire.md §9).

In OSC the routing manager pushes tables built from xApp descriptors and from submgr's requests
("RMRRoutingNeeded"); here the same tables are rendered from what the mini-RIC knows: where the E2
termination, the subscription manager and each node listen, which xApps exist, and which xApp owns
each subscription's sub_id (its indications and the control replies carrying it). The output is the
plain-text table that `RMR_SEED_RT` points at, so a real RMR (C library or ricxappframe) reads it as
well as ours does.

Pure functions: text in, text out; `write_route_table` is the only one that touches a file.
"""
from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

# RIC message types (RIC_message_types.h; e2-facts §1).
RIC_E2_SETUP_REQ, RIC_E2_SETUP_RESP, RIC_E2_SETUP_FAILURE = 12001, 12002, 12003
RIC_SUB_REQ, RIC_SUB_RESP, RIC_SUB_FAILURE = 12010, 12011, 12012
RIC_SUB_DEL_REQ, RIC_SUB_DEL_RESP, RIC_SUB_DEL_FAILURE = 12020, 12021, 12022
RIC_CONTROL_REQ, RIC_CONTROL_ACK, RIC_CONTROL_FAILURE = 12040, 12041, 12042
RIC_INDICATION = 12050
RIC_ERROR_INDICATION = 10030

# What an xApp receives from the E2 termination on its data port (e2-facts §7, rmrdata rx list,
# minus the submgr replies that a REST-subscribing xApp never sees).
XAPP_RX_FROM_E2T = (RIC_CONTROL_ACK, RIC_CONTROL_FAILURE, RIC_ERROR_INDICATION)
CONTROL_REPLIES = (RIC_CONTROL_ACK, RIC_CONTROL_FAILURE)
# What the E2 termination hands to the subscription manager.
SUBMGR_RX_FROM_E2T = (RIC_SUB_RESP, RIC_SUB_FAILURE, RIC_SUB_DEL_RESP, RIC_SUB_DEL_FAILURE)
# What the E2 termination sends towards a node (routed by meid).
TO_NODE = (RIC_E2_SETUP_RESP, RIC_E2_SETUP_FAILURE, RIC_SUB_REQ, RIC_SUB_DEL_REQ, RIC_CONTROL_REQ,
           RIC_ERROR_INDICATION)
# What a node sends (all to the E2 termination, which stands in for the SCTP association).
FROM_NODE = (RIC_E2_SETUP_REQ, RIC_SUB_RESP, RIC_SUB_FAILURE, RIC_SUB_DEL_RESP, RIC_SUB_DEL_FAILURE,
             RIC_CONTROL_ACK, RIC_CONTROL_FAILURE, RIC_INDICATION, RIC_ERROR_INDICATION)


class RouteTableError(ValueError):
    """An endpoint or meid that cannot appear in a route table."""


def _check_endpoint(ep: str) -> str:
    host, sep, port = ep.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536 or any(c in ep for c in "|;, \t\n"):
        raise RouteTableError(f"route endpoint must be host:port, got {ep!r}")
    return ep


def _check_meid(meid: str) -> str:
    # RMR carries the meid in 32 bytes including the NUL (rmr-wire P9); mme_ar splits on spaces.
    if not meid or len(meid) > 31 or any(c.isspace() or c == "|" for c in meid):
        raise RouteTableError(f"meid must be 1..31 characters without spaces or '|', got {meid!r}")
    return meid


@dataclass(frozen=True)
class RicRoutes:
    """Everything the E2 termination's table is made of.

    `subscriptions` maps an RMR sub_id (the E2EventInstanceId) to the xApp RMR endpoint that owns it;
    `nodes` maps a node's meid (RAN inventory name) to the RMR endpoint the node listens on.
    """

    submgr: str
    xapps: tuple[str, ...] = ()
    nodes: Mapping[str, str] = field(default_factory=dict)
    subscriptions: Mapping[int, str] = field(default_factory=dict)


def e2term_route_table(routes: RicRoutes) -> str:
    """The E2 termination's table: node replies to submgr, indications by sub_id, controls by meid."""
    entries: list[str] = []
    _check_endpoint(routes.submgr)
    for mtype in SUBMGR_RX_FROM_E2T:
        entries.append(f"rte|{mtype}|{routes.submgr}")
    xapps = [_check_endpoint(x) for x in dict.fromkeys(routes.xapps)]
    if xapps:
        # Error indications fan out (';'): every xApp that declared the type gets one.
        entries.append(f"rte|{RIC_ERROR_INDICATION}|{';'.join(xapps)}")
        # Control replies as rtmgr makes them (rpe.go generateXappRoutes): one `mse|<ack>|-1|<xApp>` per
        # xApp, of which RMR keeps the last it reads (a later entry for the same key replaces it). So a
        # reply whose sub_id is no subscription's reaches ONE xApp, not necessarily its sender.
        for mtype in CONTROL_REPLIES:
            entries.append(f"mse|{mtype}|-1|{xapps[-1]}")
    for sub_id, xapp in sorted(routes.subscriptions.items()):
        if not 0 < sub_id < 65536:
            raise RouteTableError(f"sub_id must be 1..65535, got {sub_id}")
        # rtmgr (generateSubscriptionRoutes): the subscription's owner gets its indications and the
        # control replies carrying its sub_id; e2term sets a reply's sub_id to the request's RIC
        # instance ID (sctpThread.cpp), so an xApp's controls come back to it only with that ID.
        for mtype in (RIC_INDICATION, *CONTROL_REPLIES):
            entries.append(f"mse|{mtype}|{sub_id}|{_check_endpoint(xapp)}")
    if routes.nodes:
        for mtype in TO_NODE:
            entries.append(f"mse|{mtype}|-1|%meid")
    lines = ["newrt|start", *entries, f"newrt|end|{len(entries)}"]
    if routes.nodes:
        owners = [f"mme_ar|{_check_endpoint(ep)}|{_check_meid(meid)}" for meid, ep in sorted(routes.nodes.items())]
        lines += ["meid_map|start", *owners, f"meid_map|end|{len(owners)}"]
    return "\n".join(lines) + "\n"


def subscription_route_update(sub_id: int, xapp: str | None) -> str:
    """The records that add (or, `xapp` None, remove) one subscription's routes on top of the table
    `e2term_route_table` made: an `updatert` block, as a route manager's incremental push carries it, so a
    subscription costs its own three routes and not a table of every node's and subscription's."""
    if not 0 < sub_id < 65536:
        raise RouteTableError(f"sub_id must be 1..65535, got {sub_id}")
    mtypes = (RIC_INDICATION, *CONTROL_REPLIES)
    recs = ([f"del|{m}|{sub_id}" for m in mtypes] if xapp is None
            else [f"mse|{m}|{sub_id}|{_check_endpoint(xapp)}" for m in mtypes])
    return "\n".join(["updatert|start", *recs, f"updatert|end|{len(recs)}"]) + "\n"


def meid_map_update(added: Mapping[str, str] = {}, removed: tuple[str, ...] = ()) -> str:  # noqa: B006 - read only
    """A meid map block that adds nodes (meid -> endpoint) and removes others on top of the map in force."""
    recs = [f"mme_ar|{_check_endpoint(ep)}|{_check_meid(meid)}" for meid, ep in sorted(added.items())]
    recs += [f"mme_del|{_check_meid(meid)}" for meid in removed]
    return "\n".join(["meid_map|start", *recs, f"meid_map|end|{len(recs)}"]) + "\n"


def node_route_table(e2term: str) -> str:
    """An E2 node's table: everything it sends goes to the E2 termination (our stand-in for SCTP)."""
    _check_endpoint(e2term)
    entries = [f"rte|{mtype}|{e2term}" for mtype in FROM_NODE]
    return "\n".join(["newrt|start", *entries, f"newrt|end|{len(entries)}"]) + "\n"


def submgr_route_table(e2term: str) -> str:
    """The subscription manager's table: subscription procedures go to the E2 termination."""
    _check_endpoint(e2term)
    entries = [f"rte|{RIC_SUB_REQ}|{e2term}", f"rte|{RIC_SUB_DEL_REQ}|{e2term}"]
    return "\n".join(["newrt|start", *entries, f"newrt|end|{len(entries)}"]) + "\n"


def xapp_route_table(e2term: str, submgr: str | None = None) -> str:
    """The static table an xApp points RMR_SEED_RT at.

    Controls go to the E2 termination (which routes them on by meid). When `submgr` is given the
    RMR subscription types are routed to it too, for xApps that still subscribe over RMR.
    """
    _check_endpoint(e2term)
    entries = [f"rte|{RIC_CONTROL_REQ}|{e2term}"]
    if submgr is not None:
        _check_endpoint(submgr)
        entries += [f"rte|{RIC_SUB_REQ}|{submgr}", f"rte|{RIC_SUB_DEL_REQ}|{submgr}"]
    return "\n".join(["newrt|start", *entries, f"newrt|end|{len(entries)}"]) + "\n"


def write_route_table(path: str | os.PathLike, text: str) -> Path:
    """Write atomically (temp file + rename), so an RMR that re-reads the file never sees half a table."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="ascii") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path

