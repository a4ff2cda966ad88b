"""Weaver xApp: KPM in, compute-smoothing RC control and GPU leases out (`weaver-xapp`).

Modules, one job each (nothing is imported here, so `import xapp.rmr` stays light):
- `config`   controls from CONFIG_FILE, validated against descriptors/schema.json; hash-polled reload
- `state`    SDL (Redis via DBAAS_*, else embedded): subscriptions, site envelopes/caps, lease ledger, epoch
- `submgr`   OSC SubMgr REST client (CamelCase body, correct URLs, parked notifications, retries)
- `rnib`     node discovery from the R-NIB (SDL e2Manager) or a static list
- `appmgr`   registration when the platform variables are present
- `ingest`   KPM indication -> KpmSample (per node version; bad input -> IngestError)
- `estimate` RAN SM demand per site (GPU.SmUsed.* or an online PRB cost model)
- `actuate`  envelope/quota mode per node and the RC control bytes
- `loop`     the pure control loop: step(state, now, inputs) -> (state, actions), next_deadline(state)
- `agents`, `broker`  lease bookkeeping and the gRPC LeaseBroker
- `rest`     operator REST API, health, metrics, OpenAPI
- `app`, `__main__`  the asyncio process wiring them together
- `policy`   grant policies (owned by the model/policy side); `rmr` the pure-Python RMR endpoint
"""
