"""Atomic checkpoints: write a temp file in the target directory, fsync it, rename it into place,
fsync the directory; keep the last k. A crash at any point leaves either the old set or the new one.

Files are `ckpt-<step:09d>.pt` holding the trainer's named parts (model, optimizer, train_state,
config) plus any `extra` the caller adds (e.g. the cross-site round). They are created 0600, and the
directory 0700 when this store creates it: weights and run configuration are the operator's, not every
local user's (an existing directory keeps the mode its owner gave it).
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

import torch

NAME = re.compile(r"^ckpt-(\d{9})\.pt$")
FILE_MODE = 0o600
DIR_MODE = 0o700


@dataclass(frozen=True)
class CheckpointInfo:
    path: Path
    step: int


class CheckpointStore:
    def __init__(self, directory: str | Path, keep_last: int = 3):
        if keep_last < 1:
            raise ValueError(f"keep_last must be >= 1, got {keep_last}")
        self.directory = Path(directory)
        self.keep_last = keep_last

    def list(self) -> list[CheckpointInfo]:
        if not self.directory.is_dir():
            return []
        found = [CheckpointInfo(p, int(m.group(1))) for p in self.directory.iterdir() if (m := NAME.match(p.name))]
        return sorted(found, key=lambda c: c.step)

    def latest(self) -> CheckpointInfo | None:
        found = self.list()
        return found[-1] if found else None

    def save(self, state: dict, step: int) -> CheckpointInfo:
        self.directory.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)   # mode: only what mkdir creates
        final = self.directory / f"ckpt-{step:09d}.pt"
        tmp = self.directory / f".{final.name}.tmp-{os.getpid()}"
        try:
            # O_EXCL: never write through a file (or link) someone placed at the temp name; the mode is
            # set at creation, so there is no moment the file is readable by others
            tmp.unlink(missing_ok=True)        # a leftover of a crashed writer with our pid (a link: only it goes)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE)
            os.fchmod(fd, FILE_MODE)           # exactly 0600, whatever bits the umask took away
            with open(fd, "wb") as f:
                torch.save(state, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, final)  # atomic on POSIX within one filesystem
        finally:
            if tmp.exists():
                tmp.unlink()
        # fsync the directory so the rename itself survives a power cut
        fd = os.open(self.directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        self._purge()
        return CheckpointInfo(final, step)

    def load(self, info: CheckpointInfo | None = None) -> dict | None:
        info = info or self.latest()
        if info is None:
            return None
        # weights_only: a checkpoint is data, never code (our state holds only tensors and plain types)
        return torch.load(info.path, map_location="cpu", weights_only=True)

    def _purge(self) -> None:
        for old in self.list()[:-self.keep_last]:
            old.path.unlink(missing_ok=True)
