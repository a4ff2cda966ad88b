"""An adapter delta's wire form: what a UE uploads and what the gNB ships upstream, as safetensors
bytes. The size on the radio and on the transport is `len()` of these bytes, never a formula.

Encodings (`Compression`): `fp32` and `fp16` send every entry; `topk` sends, per tensor, the largest
`topk_fraction` of entries by magnitude as int32 indices + fp16 values (the rest are zero on arrival).
Decoding always gives fp32 dense tensors of the shapes named in the header.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

import torch
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

Adapter = dict[str, torch.Tensor]
ENCODINGS = ("fp32", "fp16", "topk")
MAX_WIRE_BYTES = 64 << 20  # a decoded update larger than this is refused (a hostile or broken sender)


class UpdateFormatError(ValueError):
    """Bytes that are not an adapter delta of the expected form."""


@dataclass(frozen=True)
class Compression:
    encoding: str = "fp16"
    topk_fraction: float = 0.1

    def __post_init__(self) -> None:
        if self.encoding not in ENCODINGS:
            raise ValueError(f"Compression.encoding must be one of {ENCODINGS}, got {self.encoding!r}")
        if not 0.0 < self.topk_fraction <= 1.0:
            raise ValueError(f"Compression.topk_fraction must be in (0, 1], got {self.topk_fraction}")


def encode(delta: Adapter, comp: Compression) -> bytes:
    shapes = {k: list(v.shape) for k, v in delta.items()}
    meta = {"encoding": comp.encoding, "shapes": json.dumps(shapes)}
    if comp.encoding in ("fp32", "fp16"):
        dtype = torch.float32 if comp.encoding == "fp32" else torch.float16
        return st_save({k: v.detach().to(dtype).contiguous() for k, v in delta.items()}, metadata=meta)
    out = {}
    for k, v in delta.items():
        flat = v.detach().reshape(-1).float()
        k_keep = max(1, int(round(comp.topk_fraction * flat.numel())))
        idx = torch.topk(flat.abs(), k_keep, sorted=False).indices.sort().values
        out[k + ".idx"] = idx.to(torch.int32)
        out[k + ".val"] = flat[idx].to(torch.float16)
    return st_save(out, metadata=meta)


def decode(data: bytes) -> Adapter:
    if len(data) > MAX_WIRE_BYTES:
        raise UpdateFormatError(f"update of {len(data)} bytes is over {MAX_WIRE_BYTES}")
    try:
        tensors = st_load(data)
        header_len = int.from_bytes(data[:8], "little")
        meta = json.loads(data[8:8 + header_len]).get("__metadata__", {})
        encoding, shapes = meta["encoding"], json.loads(meta["shapes"])
    except Exception as exc:  # safetensors raises its own error types; one error type leaves here
        raise UpdateFormatError(f"not an adapter delta: {exc}") from None
    if encoding in ("fp32", "fp16"):
        return {k: tensors[k].float() for k in shapes}
    if encoding != "topk":
        raise UpdateFormatError(f"unknown encoding {encoding!r}")
    out = {}
    for k, shape in shapes.items():
        dense = torch.zeros(int(torch.tensor(shape).prod()))
        dense[tensors[k + ".idx"].long()] = tensors[k + ".val"].float()
        out[k] = dense.reshape(shape)
    return out
