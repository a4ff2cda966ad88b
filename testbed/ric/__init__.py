"""The mini-RIC: the RIC platform pieces an xApp needs, on the real interfaces.

- `routes`: static RMR route tables (RMR_SEED_RT) for the E2 termination, nodes, submgr and xApps.
- `rnib`: R-NIB entries in SDL namespace `e2Manager`, as e2mgr writes them.
- `subscriptions`: the OSC SubMgr REST model (CamelCase JSON) as frozen dataclasses.
- `submgr`: the subscription manager (REST server + E2 subscription procedures over RMR).
- `e2term`: the E2 termination (forwards E2AP between nodes and xApps over RMR; plays e2mgr for setup).
- `mini`: all of it assembled in one process (`MiniRic.start(...)`).
"""
from .e2term import E2Termination, ran_name
from .mini import MiniRic
from .rnib import NAMESPACE, NodeRecord, RanFunctionRecord, RnibWriter, read_nodeb
from .routes import RicRoutes, e2term_route_table, node_route_table, write_route_table, xapp_route_table
from .submgr import SubscriptionManager, build_app
from .subscriptions import SubscriptionParams, SubscriptionRequestError, parse_subscription_params

__all__ = [
    "NAMESPACE", "E2Termination", "MiniRic", "NodeRecord", "RanFunctionRecord", "RicRoutes", "RnibWriter",
    "SubscriptionManager", "SubscriptionParams", "SubscriptionRequestError", "build_app", "e2term_route_table",
    "node_route_table", "parse_subscription_params", "ran_name", "read_nodeb", "write_route_table",
    "xapp_route_table",
]
