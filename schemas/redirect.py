"""The broker contract's one redirect: a broker of an xApp replica that does not control a site's shard
refuses the site's agent with UNAVAILABLE and, where it knows, names the broker that does in this trailing
metadata key (host:port). The agent dials it only if it is one of its configured brokers (agent.lease_client)."""
REDIRECT_METADATA = "weaver-redirect"
