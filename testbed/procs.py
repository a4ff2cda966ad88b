"""A small process supervisor for `weaver up` and the end-to-end tests.

Children run in their own session (process group) so that a Ctrl-C on the terminal reaches only the
supervisor, which then stops them in a chosen order (xApp first so that leases are revoked, then the
agents so that they write checkpoints, then the testbed) and kills whatever is left. Output lines are
kept in a bounded ring per child and can be waited on (`wait_for_line`), which is how the supervisor
learns where a child listens without guessing ports. A child gets SIGTERM when the supervisor dies, however
it dies (PR_SET_PDEATHSIG; SIGKILL included): each stops as on a Ctrl-C (the xApp revokes its leases, an agent
removes its cgroups) instead of running on as an orphan.
"""
from __future__ import annotations

import collections
import ctypes
import os
import re
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

_PR_SET_PDEATHSIG = 1    # prctl(2)


def _stop_with_parent() -> None:
    """In the child, before exec: SIGTERM when the thread that started it (the supervisor's loop) is gone."""
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


class ChildFailed(RuntimeError):
    """A child exited, or did not print what we waited for in time."""


@dataclass
class Child:
    name: str
    argv: list[str]
    proc: subprocess.Popen
    log_path: Path | None = None
    env: dict[str, str] | None = None
    cwd: Path | None = None
    lines: collections.deque = field(default_factory=lambda: collections.deque(maxlen=2000))
    _cond: threading.Condition = field(default_factory=threading.Condition)

    def _pump(self, echo) -> None:
        log = open(self.log_path, "a", encoding="utf-8") if self.log_path else None
        try:
            for raw in self.proc.stdout:  # type: ignore[union-attr]
                line = raw.rstrip("\n")
                with self._cond:
                    self.lines.append(line)
                    self._cond.notify_all()
                if log:
                    log.write(line + "\n")
                    log.flush()
                if echo:
                    echo(self.name, line)
        finally:
            if log:
                log.close()
            with self._cond:
                self._cond.notify_all()

    def wait_for_line(self, pattern: str, timeout: float) -> re.Match:
        """Block until a line matching `pattern` appears (searching lines already seen too)."""
        rx = re.compile(pattern)
        deadline = time.monotonic() + timeout
        seen = 0
        with self._cond:
            while True:
                lines = list(self.lines)
                for line in lines[seen:] if seen <= len(lines) else lines:
                    m = rx.search(line)
                    if m:
                        return m
                seen = len(lines)
                if self.proc.poll() is not None:
                    tail = "\n".join(list(self.lines)[-20:])
                    raise ChildFailed(f"{self.name} exited with {self.proc.returncode} before /{pattern}/:\n{tail}")
                left = deadline - time.monotonic()
                if left <= 0:
                    tail = "\n".join(list(self.lines)[-20:])
                    raise ChildFailed(f"{self.name}: no line matching /{pattern}/ within {timeout:.0f}s:\n{tail}")
                self._cond.wait(min(left, 0.5))

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None


class Supervisor:
    def __init__(self, log_dir: Path | None = None, echo=None) -> None:
        self.children: list[Child] = []
        self.log_dir = log_dir
        self.echo = echo
        self.expected_down: set[str] = set()  # children a fault stopped on purpose (not a failure)
        if log_dir:
            log_dir.mkdir(parents=True, exist_ok=True)

    def start(self, name: str, argv: list[str], env: dict[str, str] | None = None, cwd: Path | None = None) -> Child:
        full_env = dict(os.environ)
        full_env.update(env or {})
        full_env.setdefault("PYTHONUNBUFFERED", "1")
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                text=True, bufsize=1, env=full_env, cwd=cwd, start_new_session=True,
                                preexec_fn=_stop_with_parent)
        child = Child(name, argv, proc, (self.log_dir / f"{name}.log") if self.log_dir else None, env, cwd)
        threading.Thread(target=child._pump, args=(self.echo,), daemon=True, name=f"pump-{name}").start()
        self.children.append(child)
        return child

    def kill(self, name: str) -> int | None:
        """SIGKILL a child's whole group (no clean shutdown: a crash), reap it; it is then expected down."""
        child = self.get(name)
        self.expected_down.add(name)
        self._signal(child, signal.SIGKILL)
        return self._reap(child, 5.0)

    def terminate(self, name: str) -> float | None:
        """SIGTERM a child's whole group now, without waiting (it is then expected down; `stop_all` reaps
        it later). Returns the instant (unix seconds) just before the signal, None if it was not running."""
        child = self.get(name)
        if not child.alive:
            return None
        self.expected_down.add(name)
        t = time.time()
        self._signal(child, signal.SIGTERM)
        return t

    def restart(self, name: str) -> Child:
        """Start a (stopped or killed) child again with the same command line, environment and directory;
        the new one takes the old one's place."""
        old = self.get(name)
        if old.alive:
            raise RuntimeError(f"{name} is still running")
        self.children.remove(old)
        child = self.start(name, old.argv, old.env, old.cwd)
        self.expected_down.discard(name)
        return child

    def failed(self) -> list[Child]:
        """Children that exited without a fault having stopped them."""
        return [c for c in self.children if not c.alive and c.name not in self.expected_down]

    def get(self, name: str) -> Child:
        for c in self.children:
            if c.name == name:
                return c
        raise KeyError(name)

    def stop(self, child: Child, sig: int = signal.SIGTERM, timeout: float = 10.0) -> int | None:
        """Signal the child's whole process group, wait, then SIGKILL what is left."""
        self._signal(child, sig)
        return self._reap(child, timeout)

    def stop_all(self, order: list[str] | None = None, timeout: float = 10.0) -> None:
        """Stop the children group by group: each name in `order` is a group (a child of that name, or
        every "name:..." child), signalled all at once and then waited for, so that its members stop
        side by side (agents finish one cross-site round together); then the rest, newest first."""
        names = order or [c.name for c in reversed(self.children)]
        groups = [[c for c in self.children if c.name == n or c.name.startswith(n + ":")] for n in names]
        grouped = {id(c) for g in groups for c in g}
        groups += [[c] for c in reversed(self.children) if id(c) not in grouped]
        for group in groups:
            for c in group:
                self._signal(c, signal.SIGTERM)
            for c in group:
                self._reap(c, timeout)

    @staticmethod
    def _signal(child: Child, sig: int) -> None:
        if child.proc.poll() is None:
            try:
                os.killpg(child.proc.pid, sig)
            except ProcessLookupError:
                pass

    @staticmethod
    def _reap(child: Child, timeout: float) -> int | None:
        try:
            child.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            pass
        try:  # grandchildren (e.g. a Lighthouse) share the group: make sure none outlives us
            os.killpg(child.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        if child.proc.poll() is None:
            child.proc.kill()
            child.proc.wait(5)
        return child.proc.returncode
