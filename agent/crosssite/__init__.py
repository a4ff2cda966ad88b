"""Cross-site elastic training on torchft: time-boxed, token-weighted rounds (see docs/crosssite.md).

Public API:
    TierConfig.from_proto(cross_site_msg, site_id) -> TierConfig | None
    CrossSiteTier(model, config, *, clock, sleep, reducer, on_transfer_plan, on_round)
        .run_round(local_work: Callable[[deadline_unix_s], LocalWork]) -> RoundRecord
        .close()
    lease_stream_callbacks(lease_client) -> (on_transfer_plan, on_round)
    LocalWork(tokens, steps, loss), RoundPolicy, SiteReducer, Lighthouse, LighthouseConfig
"""
from agent.crosssite.aggregate import SiteReducer
from agent.crosssite.lighthouse import Lighthouse, LighthouseConfig
from agent.crosssite.rounds import LocalWork, RoundPolicy
from agent.crosssite.tier import CrossSiteTier, RoundRecord, TierConfig, TransferPlan, lease_stream_callbacks

__all__ = ["CrossSiteTier", "Lighthouse", "LighthouseConfig", "LocalWork", "RoundPolicy", "RoundRecord",
           "SiteReducer", "TierConfig", "TransferPlan", "lease_stream_callbacks"]
