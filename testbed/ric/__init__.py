"""The mini-RIC: the RIC platform pieces an xApp needs, on the real interfaces.

- `routes`: static RMR route tables (RMR_SEED_RT) for the E2 termination, nodes, submgr and xApps.
- `rnib`: R-NIB entries in SDL namespace `e2Manager`, as e2mgr writes them.
- `subscriptions`: the OSC SubMgr REST model (CamelCase JSON) as frozen dataclasses.
- `submgr`: the subscription manager (REST server + E2 subscription procedures over RMR).
- `e2term`: the E2 termination (forwards E2AP between nodes and xApps over RMR; plays e2mgr for setup).
"""
