"""A UE's local round with peft on the config-built GPT-2: only adapter tensors change, the delta lowers
the UE's own loss, and the update's size is its encoded bytes (fp16 half of fp32, top-k smaller)."""
from __future__ import annotations

import torch

from agent.data import SHAKESPEARE, CharTokenizer
from agent.federated import lm, updates
from agent.federated.ue import LocalConfig, Shard, local_round


def test_local_round_moves_only_adapters_and_lowers_the_shard_loss():
    text = SHAKESPEARE.read_text(encoding="utf-8")[:20000]
    tok = CharTokenizer.from_text(SHAKESPEARE.read_text(encoding="utf-8"))
    cfg = lm.LMConfig(vocab_size=tok.vocab_size)
    model = lm.build(cfg, seed=0)
    base_before = [p.detach().clone() for p in lm.base_parameters(model)]
    g = lm.adapter_of(model)
    shard = Shard(torch.tensor(tok.encode(text)), cfg.block_size)
    batches = [shard.batch(torch.Generator().manual_seed(i), 16) for i in range(4)]
    lm.load_adapter(model, g)
    before = lm.evaluate(model, batches)
    delta, _ = local_round(model, g, shard, LocalConfig(steps=15, lr=1e-2), seed=1)
    assert all(torch.equal(a, b) for a, b in zip(base_before, lm.base_parameters(model), strict=True))
    assert delta.keys() == g.keys() and all("lora_" in k for k in delta)
    assert any(float(v.abs().max()) > 0 for v in delta.values())
    lm.load_adapter(model, {k: g[k] + delta[k] for k in g})
    assert lm.evaluate(model, batches) < before - 0.05

    fp32 = updates.encode(delta, updates.Compression("fp32"))
    fp16 = updates.encode(delta, updates.Compression("fp16"))
    topk = updates.encode(delta, updates.Compression("topk", 0.1))
    n = sum(v.numel() for v in delta.values())
    assert 4 * n < len(fp32) < 4 * n + 4096 and 2 * n < len(fp16) < 2 * n + 4096 and len(topk) < 0.6 * len(fp16)
    back = updates.decode(fp16)
    for k in delta:
        torch.testing.assert_close(back[k], delta[k], rtol=1e-3, atol=1e-4)


def test_decode_refuses_bytes_that_are_not_an_update():
    import pytest
    for junk in (b"", b"\x00" * 16, b"\xff" * 64):
        with pytest.raises(updates.UpdateFormatError):
            updates.decode(junk)
