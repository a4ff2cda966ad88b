"""Cross-site elastic training on torchft: time-boxed, token-weighted rounds (see docs/crosssite.md).

Public API (imported lazily, so `python -m agent.crosssite.<module>` stays clean):
    TierConfig.from_proto(cross_site_msg, site_id) -> TierConfig | None
    CrossSiteTier(model, config, *, clock, sleep, reducer, on_transfer_plan, on_round)
        .run_round(local_work: Callable[[deadline_unix_s], LocalWork]) -> RoundRecord
        .close()
    lease_stream_callbacks(lease_client) -> (on_transfer_plan, on_round)
    LocalWork(tokens, steps, loss), RoundPolicy, SiteReducer, Lighthouse, LighthouseConfig
"""
from importlib import import_module

_WHERE = {"SiteReducer": "aggregate", "Lighthouse": "lighthouse", "LighthouseConfig": "lighthouse",
          "LocalWork": "rounds", "RoundPolicy": "rounds", "CrossSiteTier": "tier", "RoundRecord": "tier",
          "TierConfig": "tier", "TransferPlan": "tier", "lease_stream_callbacks": "tier"}
__all__ = sorted(_WHERE)


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module 'agent.crosssite' has no attribute {name!r}")
    return getattr(import_module(f"agent.crosssite.{_WHERE[name]}"), name)
