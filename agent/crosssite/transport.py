"""The heal path of the cross-site tier without code: a joiner's state arrives as safetensors bytes, signed.

torchft's default checkpoint transport serves `torch.save` pickles over HTTP and loads them with
`weights_only=False`: whoever answers a joiner's fetch runs code in it. Here (a torchft
`CheckpointTransport`) a healing site fetches `GET /checkpoint/<step>` from the address the quorum named,
and nothing it reads is executed or taken on its word:

- the request carries HMAC-SHA256(tier key, "get <step>") and the answer HMAC-SHA256(tier key, step, body):
  the tier key arrives only in the lease stream of a site the broker admitted (CrossSiteConfig.tier_key),
  so an outsider neither reads the global model nor serves one;
- the body is parsed as safetensors (tensors and a JSON header, no code) only after its MAC checks;
- the state is validated against the site's own (`StateCheck`): the same names, shapes and dtypes, finite
  values, the global weights' norm within a bound, and a round step and token ledger no larger than the
  rounds the tier's clock allows since its epoch. Anything else raises `StateRejected` (torchft then
  reports the round errored; the site keeps its own state).

The server binds the configured interface (127.0.0.1 by default) and serves only the state it was handed for
the step being healed, while the round allows it (`disallow_checkpoint` ends it).
"""
from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
import logging
import math
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import torch
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save
from torchft.checkpointing.transport import CheckpointTransport

log = logging.getLogger("weaver.agent.crosssite.transport")


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):   # a peer names one address; it cannot send us elsewhere
        return None


_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}), _NoRedirect)

SCALARS_KEY = "weaver.scalars"     # the safetensors header entry holding the non-tensor leaves, as JSON
MAX_STATE_BYTES = 1 << 31          # a fetch reads at most this much (a model of the tier's size is far less)
SEP = "/"


class StateRejected(ValueError):
    """A peer's state that failed a check; nothing of it was applied."""


# --- the wire format: a nested dict of tensors and plain scalars <-> safetensors bytes ---------------------
def flat_state(state: dict, prefix: str = "") -> dict:
    """A nested state dict as {"a/b/c": leaf}; keys must be strings without the separator."""
    out = {}
    for k, v in state.items():
        if not isinstance(k, str) or SEP in k:
            raise TypeError(f"state key {k!r} must be a string without {SEP!r}")
        key = f"{prefix}{SEP}{k}" if prefix else k
        out.update(flat_state(v, key) if isinstance(v, dict) else {key: v})
    return out


def encode_state(state: dict) -> bytes:
    tensors: dict[str, torch.Tensor] = {}
    scalars: dict[str, int | float | bool | str] = {}
    for key, leaf in flat_state(state).items():
        if isinstance(leaf, torch.Tensor):
            tensors[key] = leaf.detach().cpu().contiguous()
        elif isinstance(leaf, (bool, int, float, str)):
            scalars[key] = leaf
        else:
            raise TypeError(f"state leaf {key!r} is a {type(leaf).__name__}: only tensors and scalars travel")
    return st_save(tensors, metadata={SCALARS_KEY: json.dumps(scalars)})


def decode_state(data: bytes) -> dict:
    """safetensors bytes -> the nested dict (tensors and JSON scalars only; raises StateRejected)."""
    try:
        tensors = st_load(data)
        header_len = int.from_bytes(data[:8], "little")
        header = json.loads(data[8:8 + header_len])
        scalars = json.loads((header.get("__metadata__") or {}).get(SCALARS_KEY, "{}"))
    except Exception as exc:   # noqa: BLE001 - any malformed body is one refusal
        raise StateRejected(f"not a safetensors state: {exc}") from None
    if not isinstance(scalars, dict) or not all(isinstance(v, (bool, int, float, str)) for v in scalars.values()):
        raise StateRejected("the state's scalars are not plain values")
    out: dict = {}
    for flat, value in list(tensors.items()) + list(scalars.items()):
        node = out
        *parents, leaf = flat.split(SEP)
        for p in parents:
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                raise StateRejected(f"state key {flat!r} collides with a leaf")
        node[leaf] = value
    return out


# --- what a received state must be ----------------------------------------------------------------------
@dataclass(frozen=True)
class StateCheck:
    """The receiving site's own template and the bounds of what a peer may claim."""

    template: Callable[[], dict]       # the site's own state dict, as it would send it
    max_weight_norm: float             # L2 bound on the global weights (a leaf named "global")
    round_ms: int
    round_epoch_ms: int
    max_tokens_per_round: int = 1 << 32
    clock: Callable[[], float] = time.time

    def rounds_possible(self) -> int:
        return max(0, math.floor((self.clock() * 1000 - self.round_epoch_ms) / self.round_ms)) + 1

    def __call__(self, state: dict) -> dict:
        want, got = flat_state(self.template()), flat_state(state)
        if set(want) != set(got):
            missing, extra = sorted(set(want) - set(got)), sorted(set(got) - set(want))
            raise StateRejected(f"state names differ (missing {missing[:3]}, unexpected {extra[:3]})")
        for k, w in want.items():
            g = got[k]
            if isinstance(w, torch.Tensor):
                if not isinstance(g, torch.Tensor) or g.dtype != w.dtype or tuple(g.shape) != tuple(w.shape):
                    raise StateRejected(f"{k}: {getattr(g, 'dtype', type(g).__name__)} "
                                        f"{tuple(getattr(g, 'shape', ()))}, expected {w.dtype} {tuple(w.shape)}")
                if g.is_floating_point():
                    if not torch.isfinite(g).all():
                        raise StateRejected(f"{k}: non-finite values")
                    if k.rsplit(SEP, 1)[-1] == "global" and float(g.double().norm()) > self.max_weight_norm:
                        raise StateRejected(f"{k}: norm {float(g.double().norm()):.3g} above the bound "
                                            f"{self.max_weight_norm:.3g}")
            elif type(g) is not type(w):
                raise StateRejected(f"{k}: a {type(g).__name__}, expected a {type(w).__name__}")
            elif isinstance(g, float) and not math.isfinite(g):
                raise StateRejected(f"{k}: non-finite")
        rounds = self.rounds_possible()
        for k, v in got.items():
            leaf = k.rsplit(SEP, 1)[-1]
            if leaf in ("step", "committed_rounds") and not 0 <= int(v) <= rounds:
                raise StateRejected(f"{k} {v} is more rounds than the tier's clock allows ({rounds})")
            if leaf == "committed_total" and not 0 <= int(v) <= rounds * self.max_tokens_per_round:
                raise StateRejected(f"the token ledger {v} is beyond what {rounds} rounds can commit")
        return state


# --- the signatures ---------------------------------------------------------------------------------------
def request_mac(key: bytes, step: int) -> str:
    return hmac.new(key, f"get {step}".encode(), hashlib.sha256).hexdigest()


def body_mac(key: bytes, step: int, body: bytes) -> str:
    return hmac.new(key, f"state {step} ".encode() + body, hashlib.sha256).hexdigest()


# --- the transport --------------------------------------------------------------------------------------
class SignedStateTransport(CheckpointTransport[dict]):
    def __init__(self, key: bytes, check: StateCheck, *, host: str = "127.0.0.1", port: int = 0,
                 advertise: str | None = None, offer_wait_s: float = 10.0) -> None:
        if len(key) < 16:
            raise ValueError("the tier key must be at least 16 bytes")
        self.key, self.check = key, check
        self.offer_wait_s = offer_wait_s     # a member's fetch may come before the sender offers (as torchft's)
        self._lock = threading.Condition()
        self._offer: tuple[int, bytes, str] | None = None     # (step, body, mac) served while allowed
        self.refused = 0                                     # requests refused (bad MAC, wrong step)
        transport = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:   # noqa: N802 - http.server's name
                parts = self.path.strip("/").split("/")
                mac = self.headers.get("X-Weaver-Tier", "")
                if len(parts) != 2 or parts[0] != "checkpoint" or not parts[1].isdigit():
                    return self._refuse(404, "no such resource")
                step = int(parts[1])
                if not hmac.compare_digest(mac, request_mac(transport.key, step)):
                    return self._refuse(403, "not a member of the tier")
                with transport._lock:     # a member waits for the offer of its step, as long as the round allows
                    transport._lock.wait_for(lambda: transport._offer is not None and transport._offer[0] == step,
                                             timeout=transport.offer_wait_s)
                    offer = transport._offer
                if offer is None or offer[0] != step:
                    return self._refuse(409, "no state offered for that step")
                self.send_response(200)
                self.send_header("Content-Type", "application/octet-stream")
                self.send_header("Content-Length", str(len(offer[1])))
                self.send_header("X-Weaver-Mac", offer[2])
                self.end_headers()
                self.wfile.write(offer[1])

            def _refuse(self, code: int, why: str) -> None:
                with transport._lock:
                    transport.refused += 1
                body = json.dumps({"error": why}).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args) -> None:   # the agent's own log says what matters
                pass

        self._server = ThreadingHTTPServer((host, port), Handler)
        self._server.daemon_threads = True
        self.address = f"http://{advertise or host}:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, name="tier-state", daemon=True).start()

    # torchft's side
    def metadata(self) -> str:
        return self.address

    def send_checkpoint(self, dst_ranks: list[int], step: int, state_dict: dict, timeout: timedelta) -> None:
        body = encode_state(state_dict)
        with self._lock:
            self._offer = (step, body, body_mac(self.key, step, body))
            self._lock.notify_all()

    def disallow_checkpoint(self) -> None:
        with self._lock:
            self._offer = None

    def recv_checkpoint(self, src_rank: int, metadata: str, step: int, timeout: timedelta) -> dict:
        url = _checked_peer_url(metadata)
        req = urllib.request.Request(f"{url}/checkpoint/{int(step)}",
                                     headers={"X-Weaver-Tier": request_mac(self.key, step)})
        try:
            with _OPENER.open(req, timeout=timeout.total_seconds()) as resp:
                body = resp.read(MAX_STATE_BYTES + 1)
                mac = resp.headers.get("X-Weaver-Mac", "")
        except urllib.error.HTTPError as exc:
            raise StateRejected(f"the peer refused the fetch ({exc.code})") from None
        except (OSError, ValueError) as exc:
            raise StateRejected(f"no state from the peer: {exc}") from None
        if len(body) > MAX_STATE_BYTES:
            raise StateRejected("the peer's state is larger than any the tier sends")
        if not hmac.compare_digest(mac, body_mac(self.key, step, body)):
            raise StateRejected("the peer's state is not signed with the tier key")
        return self.check(decode_state(body))

    def shutdown(self, wait: bool = True) -> None:
        self._server.shutdown()
        self._server.server_close()


def _checked_peer_url(metadata: str) -> str:
    """The address a peer's Manager named for its state: plain http to an IP literal and a port, nothing else
    (no redirect target, no path, no credentials in it). A gated peer names its gate (`wg<port>.<IP>`): the
    fetch goes through this site's egress to it (agent.crosssite.gate)."""
    from agent.crosssite import gate

    u = urllib.parse.urlsplit(metadata)
    host = u.hostname or ""
    gated = gate.parse_advertised(host)
    try:
        ipaddress.ip_address(gated[0] if gated else host)
        port = u.port
    except ValueError:
        port = None
    if u.scheme != "http" or port is None or u.path not in ("", "/") or u.query or u.username:
        raise StateRejected(f"the peer's state address {metadata[:80]!r} is not http://IP:PORT")
    if gated:
        try:
            host, port = gate.connect_address(host, port, "state")
        except ConnectionRefusedError as exc:
            raise StateRejected(f"no way to the peer's gate: {exc}") from None
        return f"http://{host}:{port}"
    return f"http://{u.netloc}"
