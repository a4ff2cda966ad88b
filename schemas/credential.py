"""A site's lease-broker credential and the one-time proof an agent registers with (both sides use this).

The credential is what the operator hands a site's agent (`weaver-xapp site-token SITE`): HMAC-SHA256 of the
site under the broker secret, with an expiry when issued with one ("<expiry_unix>.<hex>", the MAC over
"<site>|<expiry>"; the bare hex form never expires). It never goes on the wire: the agent's Register carries a
proof instead, "p1.<expiry>.<unix_ms>.<nonce>.<hex>", the MAC under the credential of
"<site>|<agent_id>|<unix_ms>|<nonce>". The broker derives the credential from its secret and takes a proof only
once (its nonce), only fresh (`PROOF_FRESH_MS` of its clock) and only if made after the broker started: a
Register captured on the network, or replayed to a restarted xApp ahead of the real agent, is refused.
"""
from __future__ import annotations

import hashlib
import hmac
import os
from dataclasses import dataclass

PROOF_FRESH_MS = 30_000       # an agent's clock within 30 s of the broker's (NTP): a proof older is stale
PREFIX = "p1"


def site_credential(secret: str, site_id: str, expiry_unix: int = 0) -> str:
    """The credential of `site_id` under the broker secret; `expiry_unix` 0: one that does not expire."""
    if expiry_unix <= 0:
        return hmac.new(secret.encode(), site_id.encode(), hashlib.sha256).hexdigest()
    mac = hmac.new(secret.encode(), f"{site_id}|{expiry_unix}".encode(), hashlib.sha256).hexdigest()
    return f"{expiry_unix}.{mac}"


def tier_key(secret: str | None, epoch: int) -> bytes:
    """The key admitted sites sign the cross-site tier with (CrossSiteConfig.tier_key; the heal transport and
    the tier gate): HMAC-SHA256(secret, "weaver-tier <epoch>"), so a restarted xApp's epoch has a key of its own
    and no captured key outlives the epoch; without a broker secret (dev mode) a random one per start. The
    Lighthouse's gate derives the same key from the same secret (agent.crosssite.lighthouse)."""
    if not secret:
        return os.urandom(32)
    return hmac.new(secret.encode(), f"weaver-tier {epoch}".encode(), hashlib.sha256).digest()


def credential_expiry(credential: str) -> int:
    head, dot, _ = credential.partition(".")
    return int(head) if dot and head.isdigit() else 0


def credential_ok(secret: str, site_id: str, given: str, now_unix: float) -> bool:
    """Whether `given` is a credential of `site_id` under `secret` that has not expired (for a bearer use where
    no proof is possible, the REST announcements; constant-time)."""
    expiry = credential_expiry(given)
    if expiry and expiry <= now_unix:
        return False
    return hmac.compare_digest(given.encode(), site_credential(secret, site_id, expiry).encode())


def make_proof(credential: str, site_id: str, agent_id: str, unix_ms: int, nonce: str | None = None) -> str:
    nonce = nonce or os.urandom(12).hex()
    mac = hmac.new(credential.encode(), f"{site_id}|{agent_id}|{unix_ms}|{nonce}".encode(), hashlib.sha256)
    return f"{PREFIX}.{credential_expiry(credential)}.{unix_ms}.{nonce}.{mac.hexdigest()}"


@dataclass(frozen=True)
class Proof:
    expiry_unix: int
    unix_ms: int
    nonce: str
    mac: str


def parse_proof(token: str) -> Proof | None:
    """None for anything that is not a proof (a bare credential, garbage)."""
    parts = token.split(".")
    if len(parts) != 5 or parts[0] != PREFIX or not parts[1].isdigit() or not parts[2].isdigit():
        return None
    if not (8 <= len(parts[3]) <= 64 and len(parts[4]) == 64):
        return None
    return Proof(int(parts[1]), int(parts[2]), parts[3], parts[4])


def proof_mac(credential: str, site_id: str, agent_id: str, p: Proof) -> str:
    return hmac.new(credential.encode(), f"{site_id}|{agent_id}|{p.unix_ms}|{p.nonce}".encode(),
                    hashlib.sha256).hexdigest()
