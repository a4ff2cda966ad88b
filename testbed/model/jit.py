"""`njit`: numba's compiler where it is installed (the testbed extra pins it), otherwise the plain
Python function. The few sequential loops of the model (a queue's slot-by-slot service) are written
once, as plain Python over numpy arrays, and compiled here; tests run both forms against each other."""
from __future__ import annotations

try:
    from numba import njit
except ImportError:  # pragma: no cover - exercised only where numba is missing
    def njit(*args, **kwargs):
        return args[0] if args and callable(args[0]) else (lambda f: f)

__all__ = ["njit"]
