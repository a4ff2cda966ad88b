"""Corpus, character tokenizer and deterministic batches.

The seam a user plugs into is the `Dataset` protocol: a vocabulary size and
`batch(split, start, size, block_size) -> (x, y)`. A batch is a pure function of its sample
indices `start .. start+size-1` (and the dataset's seed), so the only data state a checkpoint
needs is the number of samples consumed, and a resumed run sees exactly the same batches.
The shipped corpus is a Shakespeare slice (see `agent/data/NOTICE.md`); nothing is downloaded.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

import torch

DATA_DIR = Path(__file__).resolve().parent / "data"
SHAKESPEARE = DATA_DIR / "shakespeare.txt"
SPLITS = ("train", "val")


@runtime_checkable
class Dataset(Protocol):
    """What the trainer needs from a dataset. Implement it to train on your own data."""

    vocab_size: int

    def batch(self, split: str, start: int, size: int, block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Samples `start .. start+size-1` of `split` as (inputs, next-token targets), both (size, block_size) int64."""
        ...


@dataclass(frozen=True)
class CharTokenizer:
    chars: str  # the vocabulary, sorted; id = position

    @classmethod
    def from_text(cls, text: str) -> CharTokenizer:
        return cls("".join(sorted(set(text))))

    @property
    def vocab_size(self) -> int:
        return len(self.chars)

    def encode(self, text: str) -> list[int]:
        table = {c: i for i, c in enumerate(self.chars)}
        try:
            return [table[c] for c in text]
        except KeyError as exc:
            raise ValueError(f"character {exc.args[0]!r} is not in the {self.vocab_size}-symbol vocabulary") from None

    def decode(self, ids) -> str:
        return "".join(self.chars[int(i)] for i in ids)


def _mix64(x: int) -> int:
    """splitmix64 finaliser: a cheap, well-mixed hash from sample index to corpus offset."""
    x = (x + 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    return x ^ (x >> 31)


class CharCorpus:
    """A text held in memory as token ids, split into a training part and a held-out tail."""

    def __init__(self, text: str, *, val_fraction: float = 0.1, seed: int = 1337,
                 tokenizer: CharTokenizer | None = None):
        if not 0.0 < val_fraction < 1.0:
            raise ValueError(f"val_fraction must be in (0, 1), got {val_fraction}")
        self.tokenizer = tokenizer or CharTokenizer.from_text(text)
        self.seed = seed
        ids = torch.tensor(self.tokenizer.encode(text), dtype=torch.long)
        # The held-out slice is the tail, not a random sample, so no training window overlaps it.
        n_val = max(1, int(len(ids) * val_fraction))
        self.splits = {"train": ids[:-n_val], "val": ids[-n_val:]}

    @classmethod
    def shakespeare(cls, **kw) -> CharCorpus:
        return cls(SHAKESPEARE.read_text(encoding="utf-8"), **kw)

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.vocab_size

    def batch(self, split: str, start: int, size: int, block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        if split not in self.splits:
            raise ValueError(f"unknown split {split!r}; expected one of {SPLITS}")
        if size < 1 or start < 0:
            raise ValueError(f"need size >= 1 and start >= 0, got size={size} start={start}")
        data = self.splits[split]
        span = len(data) - block_size - 1
        if span < 1:
            raise ValueError(f"{split} split ({len(data)} tokens) is shorter than block_size+1 ({block_size + 1})")
        salt = (self.seed << 1) | (split == "val")
        offsets = torch.tensor([_mix64((salt << 40) ^ i) % span for i in range(start, start + size)])
        idx = offsets[:, None] + torch.arange(block_size + 1)[None, :]
        window = data[idx]
        return window[:, :-1].contiguous(), window[:, 1:].contiguous()
