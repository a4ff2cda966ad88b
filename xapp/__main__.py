"""`weaver-xapp` / `python -m xapp`: run the xApp until SIGTERM/SIGINT.

Config from `--config` or `$CONFIG_FILE` (the OSC descriptor; only `controls` is read). Ports may be
overridden for tests and single-host runs with WEAVER_REST_PORT, WEAVER_RMR_PORT, WEAVER_BROKER_LISTEN.
Prints `weaver-xapp: <key> <value>` lines (rest, rmr, broker) and `weaver-xapp: ready` once serving.

`weaver-xapp site-token SITE [--config F] [--valid-days N]` prints the lease-broker credential of one site,
"<expiry>.<HMAC-SHA256(broker secret, SITE|expiry)>" (schemas.credential), for that site's agent (its
WEAVER_AGENT_TOKEN); the agent registers with one-time proofs of it, never the credential itself. The secret is read from
the env var the config's `broker.token_env` names (never from the command line, which `ps` shows).
"""
from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
import time

from schemas.announce import announce
from xapp import logs
from xapp.appmgr import deregister, register_if_configured
from xapp.config import ConfigError, load_config
from xapp.state import StateError

DEFAULT_SECRET_ENV = "WEAVER_BROKER_SECRET"   # the shipped descriptor's broker.token_env


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="weaver-xapp", description="Weaver xApp: KPM in, RC control and GPU leases out")
    p.add_argument("--config", default=os.environ.get("CONFIG_FILE"), help="descriptor/config file (CONFIG_FILE)")
    p.add_argument("--keep-subscriptions", action="store_true",
                   help="do not delete the KPM subscriptions on shutdown (a restarted xApp reuses them)")
    p.add_argument("--log-level", default=None)
    p.add_argument("--allow-live-loosening", action="store_true",
                   help="let a config PUT or reload loosen RAN first (smaller margins, longer leases or sessions); "
                        "each loosening is logged. Without it such a change needs a restart")
    p.add_argument("--record", default=None, metavar="FILE",
                   help="write every control-loop step (its inputs, actions and decisions) to FILE as JSON lines, "
                        "for a replay through the bench's path (testbed.bench.replay)")
    return p.parse_args(argv)


async def serve(args) -> int:
    from xapp.app import XappApp, env_overrides

    cfg = load_config(args.config)
    logs.configure(cfg, args.log_level)      # plain on a terminal, mdclogpy's JSON on a RIC (xapp.logs)
    x = XappApp(cfg, config_path=args.config, keep_subscriptions=args.keep_subscriptions, record_path=args.record,
                allow_live_loosening=args.allow_live_loosening)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await x.start(**env_overrides())
    except BaseException:
        await x.stop()
        raise
    for key, value in (("rest", x.rest_port), ("rmr", x.rmr.port), ("broker", x.broker.port), ("epoch", x.epoch),
                       ("sdl", x.store.backend)):
        announce(f"weaver-xapp: {key} {value}")
    announce("weaver-xapp: ready")
    reg = asyncio.ensure_future(register_if_configured(x))
    await stop.wait()
    reg.cancel()
    await x.stop()                      # RAN first: leases are revoked before anything else
    if reg.done() and not reg.cancelled() and reg.result():
        await deregister()
    return 0


def site_token(argv: list[str]) -> int:
    from xapp.agents import site_credential

    p = argparse.ArgumentParser(prog="weaver-xapp site-token",
                                description="print a site's lease-broker credential (schemas.credential), with an expiry")
    p.add_argument("site")
    p.add_argument("--config", default=os.environ.get("CONFIG_FILE"),
                   help="descriptor/config file: its broker.token_env names the secret's env var, its sites are checked")
    p.add_argument("--secret-env", default=None, help="env var holding the broker secret (default: broker.token_env, "
                                                      f"else {DEFAULT_SECRET_ENV})")
    p.add_argument("--valid-days", type=float, default=30.0,
                   help="the credential expires after this many days (default 30; 0: never, the old form)")
    args = p.parse_args(argv)
    if args.valid_days < 0:
        print("weaver-xapp: --valid-days must be >= 0", file=sys.stderr)
        return 2
    env = args.secret_env
    if args.config:
        try:
            cfg = load_config(args.config)
        except (ConfigError, OSError) as exc:
            print(f"weaver-xapp: {exc}", file=sys.stderr)
            return 2
        if cfg.site(args.site) is None:
            print(f"weaver-xapp: unknown site {args.site!r} (known: {[s.site_id for s in cfg.sites]})", file=sys.stderr)
            return 2
        env = env or cfg.broker.token_env
    env = env or DEFAULT_SECRET_ENV
    secret = os.environ.get(env)
    if not secret:
        print(f"weaver-xapp: no broker secret: set {env}", file=sys.stderr)
        return 2
    expiry = int(time.time() + args.valid_days * 86400) if args.valid_days > 0 else 0
    print(site_credential(secret, args.site, expiry))
    return 0


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["site-token"]:
        return site_token(argv[1:])
    args = parse_args(argv)
    logs.setup(hold=True)   # lines wait for the config's format (serve), or go out as auto at exit
    if not args.config:
        print("weaver-xapp: no config: pass --config or set CONFIG_FILE", file=sys.stderr)
        return 2
    try:
        return asyncio.run(serve(args))
    except (ConfigError, StateError, OSError) as exc:
        print(f"weaver-xapp: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
