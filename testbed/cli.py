"""`weaver` - the testbed's command line: `up`, `sim`, `bench <name>`.

Each subcommand lives in its own module exposing `add_arguments(parser)` and `run(args) -> int`;
this file only dispatches, importing a module when its command is used. Benchmarks whose code needs the
agent environment (torch, torchft) run in `.venv-agent` through a subprocess: they are listed in
`AGENT_BENCHES` with the agent-side module to run.
"""
from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

COMMANDS = {
    "up": "testbed.up",
    "sim": "testbed.sim",
}
BENCHES = {
    "codecs": "e2sm.bench",
    "rmr": "xapp.rmr.bench",
    "sim": "testbed.bench.sim",
    "xapp": "xapp.bench",
    "policies": "testbed.bench.policies",
    "safety": "testbed.bench.safety",
    "federated": "testbed.bench.federated",
    "scale": "testbed.bench.scale",
}
AGENT_BENCHES = {
    "agent": "agent.bench",
    "training": "agent.crosssite.bench",
}


def agent_python() -> Path:
    """The agent venv's interpreter (override with WEAVER_AGENT_PYTHON)."""
    override = os.environ.get("WEAVER_AGENT_PYTHON")
    return Path(override) if override else ROOT / ".venv-agent" / "bin" / "python"


def _load(module: str):
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        raise SystemExit(f"weaver: {module} is not available ({exc})") from exc


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) >= 2 and argv[0] == "bench" and argv[1] in AGENT_BENCHES:
        py = agent_python()
        if not py.exists():
            print(f"weaver: agent venv not found at {py}; run scripts/bootstrap", file=sys.stderr)
            return 2
        return subprocess.call([str(py), "-m", AGENT_BENCHES[argv[1]], *argv[2:]], cwd=ROOT)

    parser = argparse.ArgumentParser(prog="weaver", description="Weaver testbed: run, simulate, benchmark")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, module in COMMANDS.items():
        p = sub.add_parser(name, help=f"{name} (see `weaver {name} -h`)")
        p.set_defaults(_module=module)
    bench = sub.add_parser("bench", help="benchmarks, each against a baseline run in the same command")
    bench_sub = bench.add_subparsers(dest="bench", required=True)
    for name, module in BENCHES.items():
        p = bench_sub.add_parser(name)
        p.set_defaults(_module=module)
    for name in AGENT_BENCHES:
        bench_sub.add_parser(name, help="runs in the agent venv")

    # Two-stage parse: the dispatcher finds the module, the module adds its own arguments.
    # `-h` is held back from the first stage so that `weaver bench rmr -h` shows the module's own options.
    first = [a for a in argv if a not in ("-h", "--help")]
    if len(first) == len(argv):
        known, _ = parser.parse_known_args(first)
    else:
        try:
            with contextlib.redirect_stderr(io.StringIO()):
                known, _ = parser.parse_known_args(first)
        except SystemExit:
            parser.parse_args(argv)  # plain `weaver -h` / `weaver bench -h`: argparse prints help and exits
            raise
    module = _load(known._module)
    target = bench_sub.choices[known.bench] if known.command == "bench" else sub.choices[known.command]
    module.add_arguments(target)
    args = parser.parse_args(argv)
    return int(module.run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
