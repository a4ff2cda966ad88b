"""The testbed's handle on the learning worker (`agent.federated.worker`), which runs in the agent venv
(torch, transformers, peft): a child process spoken to in JSON lines over its stdin/stdout."""
from __future__ import annotations

import json
import subprocess
import tempfile
from pathlib import Path


class LearnerError(RuntimeError):
    """The worker refused a request or died; the message carries its error."""


class Learner:
    def __init__(self, python: Path, cwd: Path):
        # stderr (library warnings, a traceback if it dies) goes to a file, quoted when the worker fails
        self.stderr = tempfile.TemporaryFile(mode="w+")
        self.proc = subprocess.Popen([str(python), "-m", "agent.federated.worker"], cwd=cwd, text=True,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.stderr)

    def _tail(self) -> str:
        self.stderr.seek(0)
        return "".join(self.stderr.readlines()[-15:])

    def call(self, op: str, **req) -> dict:
        try:
            self.proc.stdin.write(json.dumps({"op": op, **req}) + "\n")
            self.proc.stdin.flush()
            line = self.proc.stdout.readline()
        except (BrokenPipeError, OSError) as exc:
            raise LearnerError(f"learning worker gone: {exc}\n{self._tail()}") from None
        if not line:
            raise LearnerError(f"learning worker exited with {self.proc.wait()}:\n{self._tail()}")
        reply = json.loads(line)
        if not reply.get("ok"):
            raise LearnerError(f"learning worker: {reply.get('error')}")
        return reply

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.stderr.close()
