"""A Hugging Face `transformers` causal LM as a Weaver training job, optionally with `peft` LoRA.

    weaver-agent run --job agent.jobs.hf_causal_lm:make_job --job-arg model_type=llama --job-arg lora_r=8

The model is built from a config (`AutoConfig.for_model`, random init, seeded) or loaded from a local
directory (`weights=PATH`: a `save_pretrained` output; `local_files_only`, nothing is downloaded). Text
comes from local files (default: the shipped Shakespeare slice, agent/data/NOTICE.md) as UTF-8 bytes,
so the vocabulary is the 256 byte values and no tokenizer download is needed. Batches are the same
deterministic windows as the char-GPT's (agent.data.CharCorpus): sample i is a pure function of i.
Dropout is off, so a resumed run is bit-identical on the CPU.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch.nn import functional as F

from agent.data import SHAKESPEARE, CharCorpus
from agent.job import JobContext, SLOs, coerce


@dataclass(frozen=True)
class HFCausalLMConfig:
    model_type: str = "gpt2"        # any transformers causal-LM config type (gpt2, llama, ...)
    weights: str = ""               # local save_pretrained directory; "" = random init from the fields below
    hidden_size: int = 64
    num_layers: int = 2
    num_heads: int = 4
    intermediate_size: int = 256
    block_size: int = 32            # context length in tokens (bytes)
    vocab_size: int = 256           # byte-level text
    text: str = ""                  # comma-separated local text files; "" = agent/data/shakespeare.txt
    val_fraction: float = 0.1
    seed: int = 1337
    lr: float = 1e-3
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    lora_r: int = 0                 # > 0: train LoRA adapters of this rank only (peft), the base frozen
    lora_alpha: int = 16
    lora_targets: str = ""          # comma-separated module names; "" = peft's default for the model type
    min_tokens_per_s: float = 0.0   # SLOs (agent.job.SLOs); 0 = not stated
    max_step_s: float = 0.0
    round_deadline_s: float = 0.0

    def __post_init__(self) -> None:
        for name in ("hidden_size", "num_layers", "num_heads", "block_size", "vocab_size", "intermediate_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.hidden_size % self.num_heads:
            raise ValueError(f"hidden_size ({self.hidden_size}) must be divisible by num_heads ({self.num_heads})")
        if self.vocab_size < 256:
            raise ValueError(f"vocab_size must be >= 256 for byte-level text, got {self.vocab_size}")
        if self.lora_r < 0 or not self.lr > 0:
            raise ValueError("lora_r must be >= 0 and lr > 0")


class ByteTokenizer:
    """UTF-8 bytes as token ids: nothing to download, nothing out of vocabulary."""
    vocab_size = 256

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids) -> str:
        return bytes(int(i) for i in ids).decode("utf-8", errors="replace")


def _text(spec: str) -> str:
    paths = [Path(p.strip()) for p in spec.split(",") if p.strip()] or [SHAKESPEARE]
    for p in paths:
        if not p.is_file():
            raise ValueError(f"text file {p} does not exist")
    return "\n".join(p.read_text(encoding="utf-8") for p in paths)


def build_model(c: HFCausalLMConfig) -> torch.nn.Module:
    from transformers import AutoConfig, AutoModelForCausalLM
    torch.manual_seed(c.seed)
    if c.weights:
        if not Path(c.weights).is_dir():
            raise ValueError(f"weights directory {c.weights} does not exist")
        model = AutoModelForCausalLM.from_pretrained(c.weights, local_files_only=True, dtype=torch.float32)
    else:
        cfg = AutoConfig.for_model(
            c.model_type, vocab_size=c.vocab_size, hidden_size=c.hidden_size, num_hidden_layers=c.num_layers,
            num_attention_heads=c.num_heads, intermediate_size=c.intermediate_size,
            max_position_embeddings=c.block_size, bos_token_id=None, eos_token_id=None, pad_token_id=None,
            # no dropout: a resumed run must see the same arithmetic
            resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, attention_dropout=0.0, hidden_dropout=0.0)
        if c.model_type == "llama":
            cfg.num_key_value_heads = c.num_heads
        elif c.model_type == "gpt2":
            cfg.n_inner = c.intermediate_size     # GPT-2's name for it: intermediate_size alone is ignored
        model = AutoModelForCausalLM.from_config(cfg)
    if c.lora_r:
        from peft import LoraConfig, get_peft_model
        targets = [t.strip() for t in c.lora_targets.split(",") if t.strip()] or None
        model = get_peft_model(model, LoraConfig(r=c.lora_r, lora_alpha=c.lora_alpha, lora_dropout=0.0,
                                                 target_modules=targets))
    return model


class HFCausalLMJob:
    name = "hf_causal_lm"

    def __init__(self, config: HFCausalLMConfig):
        self.config = config
        self.model = build_model(config)
        if self.model.config.vocab_size < 256:
            raise ValueError(f"the model's vocabulary ({self.model.config.vocab_size}) cannot hold byte-level text")
        self.dataset = CharCorpus(_text(config.text), val_fraction=config.val_fraction, seed=config.seed,
                                  tokenizer=ByteTokenizer())
        trainable = [p for p in self.model.parameters() if p.requires_grad]
        decay = [p for p in trainable if p.dim() >= 2]
        no_decay = [p for p in trainable if p.dim() < 2]
        self.optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": config.weight_decay},
                                            {"params": no_decay, "weight_decay": 0.0}],
                                           lr=config.lr, foreach=False)
        self.tokens_per_sample = config.block_size
        self.grad_clip = config.grad_clip
        self.slos = SLOs(config.min_tokens_per_s, config.max_step_s, config.round_deadline_s)

    def batch(self, split: str, start: int, size: int, tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = self.dataset.batch(split, start, size, self.tokens_per_sample)
        return x[:, :tokens], y[:, :tokens]

    def loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        # The targets are already shifted (next byte), so the loss is computed here, not by `labels=`.
        logits = self.model(input_ids=x).logits
        return F.cross_entropy(logits.flatten(0, 1).float(), y.flatten())

    def config_dict(self) -> dict:
        c = asdict(self.config)
        model = {k: c[k] for k in ("model_type", "weights", "hidden_size", "num_layers", "num_heads",
                                   "intermediate_size", "block_size", "vocab_size", "lora_r", "lora_alpha",
                                   "lora_targets")}
        return {"model": model, "job": c}


def make_job(ctx: JobContext, **args) -> HFCausalLMJob:
    return HFCausalLMJob(coerce(HFCausalLMConfig, args, "hf_causal_lm"))
