"""The aggregator's side of the announcement contract: POST one aggregate transfer to the xApp's
`/api/v1/transfers/aggregates` (docs/federated.md). The agent does not import the xApp: it speaks the
REST contract with the standard library."""
from __future__ import annotations

import json
import urllib.error
import urllib.request


class AnnounceError(RuntimeError):
    """The xApp refused the announcement or could not be reached; the message carries its answer."""


def announce(url: str, *, site_id: str, round: int, nbytes: int, earliest_start_unix_ms: float,
             deadline_unix_ms: float, destination: str = "cloud", timeout_s: float = 2.0,
             token: str | None = None) -> dict:
    """`token`: the site's broker credential (`weaver-xapp site-token SITE`), required by an xApp with a
    broker secret: a site announces its own aggregates only."""
    body = json.dumps({"site_id": site_id, "round": round, "bytes": nbytes,
                       "earliest_start_unix_ms": earliest_start_unix_ms, "deadline_unix_ms": deadline_unix_ms,
                       "destination": destination}).encode()
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {token}"} if token else {})}
    req = urllib.request.Request(url, data=body, method="POST", headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            return json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        raise AnnounceError(f"{url}: {exc.code} {exc.read()[:300].decode(errors='replace')}") from None
    except (urllib.error.URLError, OSError) as exc:
        raise AnnounceError(f"{url}: {exc}") from None
