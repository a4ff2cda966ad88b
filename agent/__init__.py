"""Weaver site agent: PyTorch training that lives strictly inside its GPU lease.

Modules (one job each): `model` (char GPT), `data` (corpus, tokenizer, Dataset protocol), `config`
(dataclasses + presets), `trainer` (step API), `checkpoint` (atomic store), `enforcer` (lease -> may the
next micro-batch start and how big; no torch), `lease_client` (gRPC stream to the xApp's broker),
`partition` (green contexts), `modes` (Gaia-style execution modes), `monitors` (device facts, NVML),
`site_agent` (the daemon loop), `inspect_service` + `cli` (`weaver-agent`), `metrics` (/metrics),
`bench` (`weaver bench agent`), `gpu_check` (CUDA host check). Nothing is imported here so that
`import agent` stays cheap (torch loads only where it is needed).
"""
