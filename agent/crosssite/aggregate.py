"""Bounded per-site aggregate: what one site puts on the wide-area link per round.

Several workers at one site reduce locally first (in-network aggregation at the gNB), so the site
sends exactly one vector of `numel × wire bytes` per round, whatever its worker count. The vector can
be compressed to bf16 or int8; the rounding error is kept and added to the next round's vector (error
feedback, as in 1-bit SGD / EF-SGD), so compression delays information instead of losing it.

`SiteReducer` does the local reduction over a torch.distributed gloo group of the site's workers;
the leader (rank 0) is the only process that talks to the other sites.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.distributed as dist

COMPRESSIONS = ("none", "bf16", "int8")
_WIRE_BYTES = {"none": 4, "bf16": 2, "int8": 1}


def wire_bytes(numel: int, compression: str) -> int:
    """Bytes of one aggregate on the wire (int8 carries one float32 scale)."""
    if compression not in _WIRE_BYTES:
        raise ValueError(f"unknown compression {compression!r}; expected one of {COMPRESSIONS}")
    return numel * _WIRE_BYTES[compression] + (4 if compression == "int8" else 0)


@dataclass(frozen=True)
class Int8Tensor:
    values: torch.Tensor   # int8, same numel as the source
    scale: float           # source ≈ values * scale

    def dequantize(self) -> torch.Tensor:
        return self.values.to(torch.float32) * self.scale


def quantize_int8(x: torch.Tensor) -> Int8Tensor:
    amax = float(x.abs().max()) if x.numel() else 0.0
    scale = amax / 127.0 if amax > 0 else 1.0
    return Int8Tensor(torch.clamp(torch.round(x / scale), -127, 127).to(torch.int8), scale)


@dataclass
class ErrorFeedback:
    """Compress with memory: residual_{k+1} = (x_k + residual_k) − decompress(compress(x_k + residual_k))."""

    compression: str = "none"
    residual: torch.Tensor | None = field(default=None, repr=False)
    _previous: torch.Tensor | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.compression not in COMPRESSIONS:
            raise ValueError(f"unknown compression {self.compression!r}; expected one of {COMPRESSIONS}")

    def compress(self, x: torch.Tensor) -> torch.Tensor | Int8Tensor:
        """The wire form of x (float32 for 'none', bf16 tensor, or Int8Tensor)."""
        if self.compression == "none":
            return x
        full = x if self.residual is None else x + self.residual
        wire: torch.Tensor | Int8Tensor = (full.to(torch.bfloat16) if self.compression == "bf16"
                                           else quantize_int8(full))
        self._previous = self.residual
        self.residual = full - decompress(wire)
        return wire

    def rollback(self) -> None:
        """The round did not commit: the sent vector never counted, so forget its residual too."""
        self.residual = self._previous


def decompress(wire: torch.Tensor | Int8Tensor) -> torch.Tensor:
    if isinstance(wire, Int8Tensor):
        return wire.dequantize()
    return wire.to(torch.float32)


@dataclass
class SiteReducer:
    """Reduce the site's workers' (stats, payload) onto the leader over a local gloo group.

    With one worker this is the identity and needs no process group. Workers with compression send
    their compressed vector (int8 values + scale are gathered, since int8 sums would overflow); the
    leader sums in float32, so the local link carries K compressed vectors and the wide-area link one.
    """

    rank: int = 0
    world_size: int = 1
    group: dist.ProcessGroup | None = None
    compression: str = "none"
    feedback: ErrorFeedback = field(init=False)

    def __post_init__(self) -> None:
        if self.world_size < 1 or not 0 <= self.rank < self.world_size:
            raise ValueError(f"SiteReducer: bad rank {self.rank} of {self.world_size}")
        if self.world_size > 1 and self.group is None:
            raise ValueError("SiteReducer with several workers needs a process group")
        self.feedback = ErrorFeedback(self.compression)

    @property
    def leader(self) -> bool:
        return self.rank == 0

    def broadcast(self, t: torch.Tensor) -> torch.Tensor:
        """Leader's value to every worker (deadline, global weights, commit flag)."""
        if self.world_size > 1:
            dist.broadcast(t, src=0, group=self.group)
        return t

    def reduce_stats(self, stats: torch.Tensor) -> torch.Tensor:
        if self.world_size > 1:
            dist.reduce(stats, dst=0, op=dist.ReduceOp.SUM, group=self.group)
        return stats

    def reduce_payload(self, payload: torch.Tensor) -> torch.Tensor:
        """Sum of the workers' payloads, on the leader (other ranks get their own, unused, back)."""
        wire = self.feedback.compress(payload)
        if self.world_size == 1:
            return decompress(wire)
        if isinstance(wire, Int8Tensor):
            values = [torch.empty_like(wire.values) for _ in range(self.world_size)] if self.leader else None
            scales = [torch.empty(1) for _ in range(self.world_size)] if self.leader else None
            dist.gather(wire.values, values, dst=0, group=self.group)
            dist.gather(torch.tensor([wire.scale], dtype=torch.float32), scales, dst=0, group=self.group)
            if not self.leader:
                return payload
            return sum(v.to(torch.float32) * s for v, s in zip(values, scales, strict=True))
        buf = decompress(wire) if self.compression == "none" else wire.clone()
        dist.reduce(buf, dst=0, op=dist.ReduceOp.SUM, group=self.group)
        return buf.to(torch.float32)

    def rollback(self) -> None:
        self.feedback.rollback()
