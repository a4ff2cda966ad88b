"""Federated LoRA fine-tuning through the RAN, torch side (issue 18): UEs fine-tune LoRA adapters on a
small causal LM, the gNB-side aggregator averages their deltas per round, and `worker` serves both to
the testbed's `weaver bench federated` over a pipe. See docs/federated.md.

Modules: `lm` (the base model and its adapters), `updates` (a delta's wire form and size), `ue` (one UE's
local fine-tuning), `aggregate` (buffered asynchronous FedAvg with a bounded aggregate), `announce` (the
REST announcement of an aggregate transfer), `worker` (the JSON-lines process the bench drives).
"""
