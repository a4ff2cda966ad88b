"""The xApp's configuration: the descriptor's `controls`, validated, as frozen dataclasses.

`CONFIG_FILE` points at the OSC descriptor (`config-file.json`); only its `controls` section is ours and
it must validate against `descriptors/schema.json` (draft-07), the same file `dms_cli` onboards. On top of
the schema, `XappConfig.from_controls` checks what a schema cannot say (a node in two sites, duplicate
site ids; settings that would break the RAN-first rule, `xapp.invariant.policy_violations`, which owns
those floors) and fills defaults. Every way a config enters goes through it: the file at start, a
reload (`ConfigWatcher`: refused, logged, the old config kept) and `PUT /api/v1/config` (400 naming the
field).

`ConfigWatcher` polls the *content hash* of the file, not inotify on the path: Kubernetes updates a
ConfigMap by swapping the `..data` symlink, which never fires IN_MODIFY on the file itself. A new file
that does not parse or validate is refused, logged once with the reason, and the last good config stays.
"""
from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jsonschema

from xapp.invariant import policy_violations

log = logging.getLogger("weaver.xapp.config")

REPO_SCHEMA = Path(__file__).resolve().parent.parent / "descriptors" / "schema.json"


class ConfigError(ValueError):
    """A config that does not parse or validate; the message says which field and why."""


@dataclass(frozen=True, kw_only=True)
class PolicyConfig:
    name: str
    reliability_target: float = 1e-5
    guard_sms: int = 8
    reactive_margin_sms: int = 16
    static_reserve_sms: int = 0
    hold_periods: int = 50
    quota_dl_sms_per_prb: float = 0.03
    quota_ul_sms_per_prb: float = 0.03
    cell_prbs: int = 273


@dataclass(frozen=True, kw_only=True)
class EstimateConfig:
    quantile: float = 0.999
    window_periods: int = 600
    min_samples: int = 20


@dataclass(frozen=True, kw_only=True)
class ActuationConfig:
    mode: str = "auto"                # auto | quota | envelope | none
    hysteresis_sms: int = 8           # envelope changes smaller than this are not sent
    caps_hysteresis_pct: int = 5      # quota loosening smaller than this (percentage points) waits
    control_timeout_ms: int = 500
    be_delay_budget_ms: int = 20
    rc_ids_fallback: str = "srsran"
    min_ratio: int = 0
    ue_id: int = 0


@dataclass(frozen=True, kw_only=True)
class SliceId:
    sst: int
    sd: int | None = None


@dataclass(frozen=True, kw_only=True)
class SiteConfig:
    site_id: str
    nodes: tuple[str, ...]
    gpu_sms: int = 132
    granularity: int = 8
    protected_slices: tuple[SliceId, ...] = ()
    best_effort_slices: tuple[SliceId, ...] = ()


@dataclass(frozen=True, kw_only=True)
class StaticNode:
    meid: str
    kpm_function_id: int
    kpm_oid: str = "1.3.6.1.4.1.53148.1.3.2.2"
    rc_function_id: int | None = None
    envelope: bool = False


@dataclass(frozen=True, kw_only=True)
class E2Config:
    discovery: str = "static"          # rnib | static
    kpm_measurements: tuple[str, ...] = ("RRU.PrbUsedDl", "RRU.PrbAvailDl", "DRB.UEThpDl",
                                         "GPU.SmUsed.Mean", "GPU.SmUsed.Max")
    kpm_version_override: dict[str, str] = field(default_factory=dict)
    static_nodes: tuple[StaticNode, ...] = ()


@dataclass(frozen=True, kw_only=True)
class SubmgrConfig:
    url: str = "http://service-ricplt-submgr-http.ricplt:8088/ric/v1"
    client_host: str = "service-ricxapp-weaver-http.ricxapp"
    http_port: int = 8080
    rmr_port: int = 4560
    e2_timeout_s: int = 2
    e2_retries: int = 2
    attempts: int = 5
    backoff_s: float = 0.5
    audit_period_s: float = 10.0       # how often SubMgr's list is checked for our subscriptions (issue 13)


@dataclass(frozen=True, kw_only=True)
class RmrConfig:
    backend: str = "python"
    port: int = 4560
    route_table: str | None = None


@dataclass(frozen=True, kw_only=True)
class BrokerConfig:
    listen: str = "0.0.0.0:50051"
    token_env: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_client_ca: str | None = None
    max_message_bytes: int = 65536
    heartbeat_ms: int = 1000
    agent_timeout_heartbeats: int = 3
    lighthouse_addr: str = ""
    # The training job every site's agent must run (package.module:factory, as it registers it); "" = any.
    # An agent registering another job is refused before it is leased anything.
    job: str = ""
    round_ms: int = 30000
    round_epoch_ms: int = 0
    # the lifetime of a site's tier pass (schemas.tierpass), renewed at half of it while the site is admitted:
    # how long a site the broker stops admitting may still open tier connections
    tier_pass_s: int = 120

    def secret(self) -> str | None:
        """The broker secret, read from the env var `token_env` names (None: agents need no credential, the
        dev mode). An agent presents its site's credential, HMAC-SHA256(secret, site_id): `weaver-xapp
        site-token SITE` prints it; the secret itself never leaves the xApp."""
        return os.environ.get(self.token_env) or None if self.token_env else None


@dataclass(frozen=True, kw_only=True)
class RestConfig:
    port: int = 8080
    # the interface REST (dashboard, API, /metrics) binds: every one in a pod, where the K8s Service fronts it;
    # `weaver up` binds 127.0.0.1
    host: str = "0.0.0.0"
    config_token_env: str | None = "WEAVER_CONFIG_TOKEN"
    history_minutes: int = 10

    def token(self) -> str | None:
        return os.environ.get(self.config_token_env) or None if self.config_token_env else None


@dataclass(frozen=True, kw_only=True)
class XappConfig:
    period_ms: int
    policy: PolicyConfig
    sites: tuple[SiteConfig, ...]
    lease_valid_periods: int = 3
    stale_periods: float = 2
    estimate: EstimateConfig = EstimateConfig()
    actuation: ActuationConfig = ActuationConfig()
    e2: E2Config = E2Config()
    submgr: SubmgrConfig = SubmgrConfig()
    rmr: RmrConfig = RmrConfig()
    broker: BrokerConfig = BrokerConfig()
    rest: RestConfig = RestConfig()
    sdl_namespace: str = "weaver"
    shards: int = 0          # replicas.shards: 0 = one leader for every site (xapp.shards)
    log_level: str = "INFO"
    controls: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def period_s(self) -> float:
        return self.period_ms / 1000.0

    @functools.cached_property
    def _site_by_meid(self) -> dict[str, SiteConfig]:
        return {m: s for s in self.sites for m in s.nodes}

    @functools.cached_property
    def _site_by_id(self) -> dict[str, SiteConfig]:
        return {s.site_id: s for s in self.sites}

    def site_of(self, meid: str) -> SiteConfig | None:
        # on the indication path (once per KPM report): a lookup, not a scan over every site
        return self._site_by_meid.get(meid)

    def site(self, site_id: str) -> SiteConfig | None:
        return self._site_by_id.get(site_id)

    @classmethod
    def from_controls(cls, controls: dict[str, Any], schema: dict[str, Any] | None = None) -> XappConfig:
        validate_controls(controls, schema)
        c = controls
        sites = tuple(
            SiteConfig(site_id=s["site_id"], nodes=tuple(s["nodes"]), gpu_sms=s.get("gpu_sms", 132),
                       granularity=s.get("granularity", 8),
                       protected_slices=tuple(SliceId(sst=p["sst"], sd=p.get("sd"))
                                              for p in s.get("protected_slices", ())),
                       best_effort_slices=tuple(SliceId(sst=p["sst"], sd=p.get("sd"))
                                                for p in s.get("best_effort_slices", ())))
            for s in c["sites"])
        if c["policy"]["name"] == "oracle":
            raise ConfigError("controls.policy.name: 'oracle' needs the future (benchmarks only); "
                              "use static, reactive or weaver")
        seen_sites: set[str] = set()
        seen_nodes: dict[str, str] = {}
        for s in sites:
            if s.site_id in seen_sites:
                raise ConfigError(f"controls.sites: site_id {s.site_id!r} appears twice")
            seen_sites.add(s.site_id)
            for n in s.nodes:
                if n in seen_nodes:
                    raise ConfigError(f"controls.sites: node {n!r} is in both {seen_nodes[n]!r} and {s.site_id!r}")
                seen_nodes[n] = s.site_id
            if s.gpu_sms % s.granularity:
                log.info("site %s: gpu_sms %d is not a multiple of granularity %d; the remainder is never granted",
                         s.site_id, s.gpu_sms, s.granularity)
        e2 = dict(c.get("e2", {}))
        e2_cfg = E2Config(
            discovery=e2.get("discovery", "static"),
            kpm_measurements=tuple(e2.get("kpm_measurements", E2Config.kpm_measurements)),
            kpm_version_override=dict(e2.get("kpm_version_override", {})),
            static_nodes=tuple(StaticNode(**n) for n in e2.get("static_nodes", ())))
        cfg = cls(
            period_ms=c["period_ms"], policy=PolicyConfig(**c["policy"]), sites=sites,
            lease_valid_periods=c.get("lease_valid_periods", 3), stale_periods=c.get("stale_periods", 2),
            estimate=EstimateConfig(**c.get("estimate", {})), actuation=ActuationConfig(**c.get("actuation", {})),
            e2=e2_cfg, submgr=SubmgrConfig(**c.get("submgr", {})), rmr=RmrConfig(**c.get("rmr", {})),
            broker=BrokerConfig(**c.get("broker", {})), rest=RestConfig(**c.get("rest", {})),
            sdl_namespace=c.get("sdl", {}).get("namespace", "weaver"), shards=c.get("replicas", {}).get("shards", 0),
            log_level=c.get("log_level", "INFO"),
            controls=json.loads(json.dumps(c)))
        unsafe = policy_violations(cfg)
        if unsafe:
            more = f" (and {len(unsafe) - 1} more)" if len(unsafe) > 1 else ""
            raise ConfigError(f"controls.{unsafe[0].field}: unsafe for RAN first: {unsafe[0].why}{more}")
        return cfg


def load_schema(path: str | os.PathLike | None = None) -> dict[str, Any]:
    """The controls schema: `path`, else $WEAVER_SCHEMA_FILE, else schema.json beside $CONFIG_FILE
    (where the OSC chart mounts both), else the repository's descriptors/schema.json."""
    candidates = [path, os.environ.get("WEAVER_SCHEMA_FILE")]
    if os.environ.get("CONFIG_FILE"):
        candidates.append(Path(os.environ["CONFIG_FILE"]).parent / "schema.json")
    candidates.append(REPO_SCHEMA)
    for p in candidates:
        if p and Path(p).is_file():
            return json.loads(Path(p).read_text())
    raise ConfigError("no schema.json found (set WEAVER_SCHEMA_FILE)")


_SCHEMA_CACHE: dict[str, Any] = {}


def validate_controls(controls: Any, schema: dict[str, Any] | None = None) -> None:
    """Raise ConfigError naming the first offending field; return None when `controls` is valid."""
    if schema is None:
        schema = _SCHEMA_CACHE.setdefault("default", load_schema())
    if not isinstance(controls, dict):
        raise ConfigError(f"controls must be a JSON object, got {type(controls).__name__}")
    errors = sorted(jsonschema.Draft7Validator(schema).iter_errors(controls), key=lambda e: list(e.absolute_path))
    if errors:
        e = errors[0]
        where = "controls" + "".join(f"[{p!r}]" if isinstance(p, int) else f".{p}" for p in e.absolute_path)
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        raise ConfigError(f"{where}: {e.message}{more}")


def parse_config_bytes(data: bytes, schema: dict[str, Any] | None = None) -> XappConfig:
    """Bytes of a descriptor (with `controls`) or of a bare controls object -> XappConfig."""
    try:
        doc = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"config is not JSON: {exc}") from None
    if isinstance(doc, dict) and "controls" in doc:
        doc = doc["controls"]
    return XappConfig.from_controls(doc, schema)


def load_config(path: str | os.PathLike, schema: dict[str, Any] | None = None) -> XappConfig:
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read config {path}: {exc}") from None
    return parse_config_bytes(data, schema)


@dataclass(frozen=True)
class ConfigChange:
    config: XappConfig
    digest: str


class ConfigWatcher:
    """Polls a config file by content hash (works through symlink swaps). Call `poll()` from a timer;
    it returns a ConfigChange for a new valid config, None otherwise. `last_error` holds the reason the
    latest new content was refused (None once a good one loads)."""

    def __init__(self, path: str | os.PathLike, schema: dict[str, Any] | None = None) -> None:
        self.path = Path(path)
        self.schema = schema
        self.digest: str | None = None
        self.last_error: str | None = None
        self._refused_digest: str | None = None

    def poll(self) -> ConfigChange | None:
        try:
            data = self.path.read_bytes()
        except OSError as exc:
            # Mid-swap a ConfigMap's symlink can dangle for an instant: keep the old config, retry later.
            self.last_error = f"cannot read {self.path}: {exc}"
            return None
        digest = hashlib.sha256(data).hexdigest()
        if digest == self.digest or digest == self._refused_digest:
            return None
        try:
            cfg = parse_config_bytes(data, self.schema)
        except ConfigError as exc:
            self._refused_digest = digest
            self.last_error = str(exc)
            log.error("config %s refused, keeping the previous one: %s", self.path, exc)
            return None
        self.digest, self.last_error, self._refused_digest = digest, None, None
        return ConfigChange(cfg, digest)
