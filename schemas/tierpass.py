"""Per-site tier passes: what lets one admitted site, and only it, through the cross-site tier's gates.

The broker holds a signing key per epoch (the tier's CA, Ed25519, seeded from the broker secret so the gated
Lighthouse derives the same one). To each site it admits it hands, in that site's own lease stream:
- the site's signing key (an Ed25519 seed derived from the CA's seed and the site id: never sent elsewhere),
- its pass: the CA's signature over (site, epoch, expiry, the site's public key),
- the CA's public key, with which every gate checks every pass.

A gate's hello (agent.crosssite.gate) carries the pass and the site's signature over the gate's challenge.
So a site proves who it is, not only that it was admitted: a key of one site cannot speak as another (the
pass names the site and binds its key), nothing a site holds lets it make a pass, and a pass ends at its
expiry: the broker renews the passes of the sites it still admits (`PASS_S`, renewed at half its life),
so a site it stops admitting is shut out of the tier's new connections within one pass lifetime, without
an epoch change.

Sans-IO: derivation, issue and checks only; the gate and the broker do the I/O.
"""
from __future__ import annotations

import hashlib
import hmac
import os
import re
from dataclasses import dataclass

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

PASS_S = 120                 # a pass's lifetime; the broker renews it at half of it
SITE_RE = re.compile(r"[A-Za-z0-9._:-]{1,64}")


class PassRefused(ValueError):
    """A pass or a signature that does not hold; `reason` is one word for the gate's counters."""

    def __init__(self, reason: str, detail: str = ""):
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


def ca_seed(secret: str | None, epoch: int) -> bytes:
    """The seed of an epoch's CA key: from the broker secret (the gated Lighthouse derives the same), or
    random where there is no secret (dev mode: only this broker's passes exist)."""
    if not secret:
        return os.urandom(32)
    return hmac.new(secret.encode(), f"weaver-tier-ca {epoch}".encode(), hashlib.sha256).digest()


def public_key(seed: bytes) -> bytes:
    return Ed25519PrivateKey.from_private_bytes(seed).public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)


def sign(seed: bytes, message: bytes) -> bytes:
    return Ed25519PrivateKey.from_private_bytes(seed).sign(message)


def verify(public: bytes, signature: bytes, message: bytes) -> bool:
    try:
        Ed25519PublicKey.from_public_bytes(public).verify(signature, message)
        return True
    except (InvalidSignature, ValueError):
        return False


@dataclass(frozen=True)
class TierPass:
    site: str
    epoch: int
    expiry_unix: int
    site_public: bytes       # 32 bytes, the key the site signs its hellos with
    ca_signature: bytes      # 64 bytes over `message()`

    def message(self) -> bytes:
        return b"weaver-tier-pass|" + f"{self.site}|{self.epoch}|{self.expiry_unix}|".encode() + self.site_public


def check_pass(p: TierPass, ca_public: bytes, now_unix: float) -> None:
    """PassRefused unless the epoch's CA signed this pass and it has not expired."""
    if not SITE_RE.fullmatch(p.site) or len(p.site_public) != 32 or len(p.ca_signature) != 64:
        raise PassRefused("malformed", "pass fields")
    if not verify(ca_public, p.ca_signature, p.message()):
        raise PassRefused("pass", p.site)
    if p.expiry_unix <= now_unix:
        raise PassRefused("expired", f"{p.site} at {p.expiry_unix}")


@dataclass(frozen=True)
class TierIdentity:
    """What an admitted site holds: its pass, its signing key, and the CA key every gate checks passes with."""
    tier_pass: TierPass
    site_key: bytes          # the site's Ed25519 seed (secret)
    ca_public: bytes

    @property
    def site(self) -> str:
        return self.tier_pass.site

    @property
    def epoch(self) -> int:
        return self.tier_pass.epoch

    def sign(self, message: bytes) -> bytes:
        return sign(self.site_key, message)

    def encode(self) -> str:
        """One line for a process's environment (agent.crosssite.site): the secret key is in it."""
        p = self.tier_pass
        return ",".join([str(p.epoch), p.site, str(p.expiry_unix), self.site_key.hex(), self.ca_public.hex(),
                         p.ca_signature.hex()])

    @classmethod
    def decode(cls, text: str) -> TierIdentity:
        try:
            epoch, site, expiry, key, ca, sig = text.strip().split(",")
            key_b, ca_b, sig_b = bytes.fromhex(key), bytes.fromhex(ca), bytes.fromhex(sig)
            p = TierPass(site, int(epoch), int(expiry), public_key(key_b), sig_b)
        except ValueError as exc:
            raise ValueError(f"not a tier identity: {exc}") from None
        return cls(p, key_b, ca_b)


def issue(ca: bytes, epoch: int, site: str, expiry_unix: int) -> TierIdentity:
    """The identity of `site` under the CA seed `ca`: its key (derived, so re-issuing renews only the expiry)
    and a pass to `expiry_unix`."""
    if not SITE_RE.fullmatch(site):
        raise ValueError(f"a tier pass needs a plain site id, got {site!r}")
    site_key = hmac.new(ca, f"weaver-tier-site {site}".encode(), hashlib.sha256).digest()
    p = TierPass(site, epoch, int(expiry_unix), public_key(site_key), b"")
    p = TierPass(p.site, p.epoch, p.expiry_unix, p.site_public, sign(ca, p.message()))
    return TierIdentity(p, site_key, public_key(ca))
