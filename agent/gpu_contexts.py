"""Which CUDA contexts a training worker holds, from the driver: the GPU half of the kernel bound.

    python -m agent.gpu_contexts [--sms 64]      # one JSON object; run by `python -m agent.gpu_check`

A green context protects the RAN's SMs only if the worker has no other context: kernels launched in a
process's primary context may run on SMs reserved for a green context (facts sheet 5.5). This starts as
a worker does (nothing on CUDA before its partition), asks the driver (libcuda, through ctypes, so no
runtime call of its own creates anything) whether the device's primary context is active before the
green context is made, after it, and after leased work ran in it, and says what follows: `green-only`
(the partition is the worker's only context), or `primary-present` (use MPS with
CUDA_MPS_ACTIVE_THREAD_PERCENTAGE for the worker instead, the alternative the design names). NVML's
per-process list is the cross-check where a driver answers.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import sys


def _driver():
    lib = ctypes.CDLL("libcuda.so.1")
    if lib.cuInit(0) != 0:
        raise RuntimeError("cuInit failed")
    dev = ctypes.c_int()
    if lib.cuDeviceGet(ctypes.byref(dev), 0) != 0:
        raise RuntimeError("cuDeviceGet failed")
    return lib, dev


def primary_active(lib, dev) -> bool:
    flags, active = ctypes.c_uint(), ctypes.c_int()
    if lib.cuDevicePrimaryCtxGetState(dev, ctypes.byref(flags), ctypes.byref(active)) != 0:
        raise RuntimeError("cuDevicePrimaryCtxGetState failed")
    return bool(active.value)


def nvml_processes() -> list[int] | None:
    try:
        import pynvml
        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        return [p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h)]
    except Exception:   # no NVML, or no driver answering: the cross-check is optional
        return None


def check(sms: int) -> dict:
    out: dict = {"pid": os.getpid()}
    lib, dev = _driver()
    out["primary_before"] = primary_active(lib, dev)
    import torch

    from agent.partition import create_green_context, green_scope
    ctx = create_green_context(sms)
    out["primary_after_green_create"] = primary_active(lib, dev)
    with green_scope(ctx):
        a = torch.randn(1024, 1024, device="cuda")
        (a @ a).sum().item()
    out["primary_after_leased_work"] = primary_active(lib, dev)
    procs = nvml_processes()
    out["nvml_lists_this_process"] = None if procs is None else os.getpid() in procs
    primary = out["primary_after_green_create"] or out["primary_after_leased_work"]
    out["verdict"] = "primary-present" if primary else "green-only"
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m agent.gpu_contexts")
    p.add_argument("--sms", type=int, default=64)
    args = p.parse_args(argv)
    try:
        res = check(args.sms)
    except Exception as exc:   # no driver, no green contexts: say so, as one JSON object
        res = {"error": f"{type(exc).__name__}: {exc}"}
    print(json.dumps(res))
    return 0 if "verdict" in res else 2


if __name__ == "__main__":
    sys.exit(main())
