"""The base causal LM and its LoRA adapters: a `transformers` GPT-2 built from a config (random
initialisation, nothing downloaded) with `peft` LoRA on every linear layer of the blocks.

The base is frozen once built (and briefly pre-trained on a public slice of the corpus, so that the
federated rounds fine-tune a model that already knows something, as a real deployment would); only the
adapters move. An adapter is the `peft` state dict of the LoRA tensors: its names and shapes are the wire
contract between UE, gNB aggregator and cloud.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from peft import LoraConfig, get_peft_model, get_peft_model_state_dict, set_peft_model_state_dict
    from transformers import GPT2Config, GPT2LMHeadModel

Adapter = dict[str, torch.Tensor]


@dataclass(frozen=True, kw_only=True)
class LMConfig:
    """A tiny GPT-2 (defaults: 2 layers, width 64, 4 heads, context 64) and its LoRA (rank 4 on the
    attention and MLP projections; GPT-2's Conv1D stores weights transposed, hence fan_in_fan_out)."""

    vocab_size: int
    n_layer: int = 2
    n_embd: int = 64
    n_head: int = 4
    block_size: int = 64
    lora_rank: int = 4
    lora_alpha: float = 8.0
    lora_targets: tuple[str, ...] = ("c_attn", "c_proj", "c_fc")

    def __post_init__(self) -> None:
        for name in ("vocab_size", "n_layer", "n_embd", "n_head", "block_size", "lora_rank"):
            if getattr(self, name) < 1:
                raise ValueError(f"LMConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.n_embd % self.n_head:
            raise ValueError(f"LMConfig.n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head})")


def build(cfg: LMConfig, seed: int = 0) -> torch.nn.Module:
    """The base model with LoRA attached, adapters at peft's initialisation (B = 0: the adapted model
    equals the base). Dropout is 0 so that a UE's local run is a pure function of its inputs."""
    torch.manual_seed(seed)
    gcfg = GPT2Config(vocab_size=cfg.vocab_size, n_positions=cfg.block_size, n_embd=cfg.n_embd,
                      n_layer=cfg.n_layer, n_head=cfg.n_head, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                      bos_token_id=None, eos_token_id=None)
    base = GPT2LMHeadModel(gcfg)
    lora = LoraConfig(r=cfg.lora_rank, lora_alpha=cfg.lora_alpha, target_modules=list(cfg.lora_targets),
                      lora_dropout=0.0, fan_in_fan_out=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # peft warns that fan_in_fan_out is being set for Conv1D: it is
        return get_peft_model(base, lora)


def adapter_of(model: torch.nn.Module) -> Adapter:
    """A detached copy of the model's adapter tensors."""
    return {k: v.detach().clone() for k, v in get_peft_model_state_dict(model).items()}


def load_adapter(model: torch.nn.Module, adapter: Adapter) -> None:
    with torch.no_grad():
        set_peft_model_state_dict(model, adapter)


def base_parameters(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    return [p for n, p in model.named_parameters() if "lora_" not in n]


def adapter_parameters(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    return [p for n, p in model.named_parameters() if "lora_" in n]


def loss(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    logits = model(input_ids=x).logits
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1))


def pretrain_base(model: torch.nn.Module, batches, lr: float = 3e-3) -> float:
    """Train the base weights (adapters frozen at B = 0) on `batches` of (x, y); returns the last loss.
    Leaves the base frozen and the adapters trainable."""
    base, lora = base_parameters(model), adapter_parameters(model)
    for p in lora:
        p.requires_grad_(False)
    for p in base:
        p.requires_grad_(True)
    opt = torch.optim.AdamW(base, lr=lr, weight_decay=0.0)
    last = float("nan")
    model.train()
    for x, y in batches:
        out = loss(model, x, y)
        if not torch.isfinite(out):
            raise FloatingPointError(f"pre-training loss is {float(out)}")
        opt.zero_grad(set_to_none=True)
        out.backward()
        opt.step()
        last = float(out.detach())
    for p in base:
        p.requires_grad_(False)
    for p in lora:
        p.requires_grad_(True)
    return last


@torch.no_grad()
def evaluate(model: torch.nn.Module, batches) -> float:
    model.eval()
    vals = [float(loss(model, x, y)) for x, y in batches]
    model.train()
    return sum(vals) / len(vals)
