"""Per-node configuration of the simulated gNB-DU (frozen, validated when built)."""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

KPM_VERSIONS = ("v3.00", "v2.03", "v4.00")
RC_TABLES = ("srsran", "oai", "oai-gnb")  # oai-gnb: flat layout, ASCII values (the OAI gNB parser)
# Whose behaviour a node emulates where DUs differ beyond the ID table (testbed.e2node.dialects): srsRAN's DU
# (ocudu), OAI's gNB, or the standard text. "" = the DU its rc_table stands for (oai: the standard text).
DIALECTS = ("srsran", "oai-gnb", "o-ran")
_DIALECT_OF_TABLE = {"srsran": "srsran", "oai-gnb": "oai-gnb", "oai": "o-ran"}
KPM_PROFILES = ("compute-aware", "gpu", "standard")  # what KPM the node offers (measure.measurements_for)


class NodeConfigError(ValueError):
    """A node configuration the simulator refuses; the message names the field."""


@dataclass(frozen=True)
class SliceId:
    sst: int
    sd: int | None


@dataclass(frozen=True)
class NodeConfig:
    """One E2 node (gNB-DU) serving site `site` of the RAN model.

    `kpm_version` picks the KPM module (and OID) the node advertises and encodes with; `rc_table` picks
    the RC parameter-ID table of its RC RAN function definition and of the controls it accepts
    (srsRAN/OSC spec numbering, OAI/FlexRIC, or OAI's gNB wire form), because real nodes differ (e2-facts §3, §4).
    `dialect` picks whose behaviour it has where DUs differ beyond the table (`testbed.e2node.dialects`).
    `kpm_profile` picks the measurements it offers: `standard` stands in for a stock srsRAN/OAI gNB (3GPP
    PRB and throughput counters only), so the xApp's fallback to estimated policy inputs can be exercised.
    """

    site: int
    n_cells: int
    slices: tuple[SliceId, ...]
    gpu_sms: int = 132
    plmn: str = "00101"
    gnb_id: int | None = None  # default: site + 1
    gnb_id_bits: int = 22
    du_id: int = 1
    kpm_version: str = "v3.00"
    rc_table: str = "srsran"
    dialect: str = ""
    kpm_function_id: int = 2
    rc_function_id: int = 3
    vendor: str = "Weaver testbed"
    kpm_profile: str = "compute-aware"
    ues_per_cell: int = 4  # the per-UE view of styles 2-5 (testbed.model.ues)
    # How long the node takes to answer, from a request's arrival to its response (RMR transit aside): a DU's E2
    # agent handles procedures in order on its own executor and answers once the DU has acted, so a
    # subscription's response, and with it SubMgr's notification and the first indication, trails SubMgr's 201,
    # and a control's ACK comes after the control took effect. The node handles requests in arrival order.
    subscription_delay_ms: float = 5.0   # RICsubscriptionRequest / DeleteRequest -> their response
    control_delay_ms: float = 2.0        # RICcontrolRequest -> its effect and its ACK / FAILURE

    def __post_init__(self) -> None:
        for name in ("subscription_delay_ms", "control_delay_ms"):
            value = getattr(self, name)
            if not (isinstance(value, int | float) and 0.0 <= value <= 10_000.0):
                raise NodeConfigError(f"{name} must be a number of ms in [0, 10000], got {value!r}")
        if self.kpm_profile not in KPM_PROFILES:
            raise NodeConfigError(f"kpm_profile must be one of {KPM_PROFILES}, got {self.kpm_profile!r}")
        if self.kpm_version not in KPM_VERSIONS:
            raise NodeConfigError(f"kpm_version must be one of {KPM_VERSIONS}, got {self.kpm_version!r}")
        if self.rc_table not in RC_TABLES:
            raise NodeConfigError(f"rc_table must be one of {RC_TABLES}, got {self.rc_table!r}")
        if self.dialect and self.dialect not in DIALECTS:
            raise NodeConfigError(f"dialect must be one of {DIALECTS}, got {self.dialect!r}")
        if self.site < 0 or self.n_cells < 1 or not self.slices:
            raise NodeConfigError("site must be >= 0, n_cells >= 1, slices non-empty")
        if not 22 <= self.gnb_id_bits <= 32 or not 0 <= self.node_gnb_id < 1 << self.gnb_id_bits:
            raise NodeConfigError(f"gnb_id {self.node_gnb_id} does not fit gnb_id_bits {self.gnb_id_bits}")
        if self.kpm_function_id == self.rc_function_id:
            raise NodeConfigError("kpm_function_id and rc_function_id must differ")
        if self.n_cells > 1 << (36 - self.gnb_id_bits):
            raise NodeConfigError("too many cells for the NR cell identity's cell bits")
        if not len(self.slices) <= self.ues_per_cell <= 1024:
            raise NodeConfigError(f"ues_per_cell must be in {len(self.slices)}..1024 (a UE per slice at least)")

    @cached_property
    def ues(self):
        """The node's UE population (testbed.model.ues.UePopulation), fixed by the site number."""
        from testbed.model.ues import UePopulation

        return UePopulation.build(self.n_cells, len(self.slices), self.ues_per_cell, seed=self.site)

    @property
    def du(self) -> str:
        """The DU whose behaviour this node emulates (`dialect`, or the one its rc_table stands for)."""
        return self.dialect or _DIALECT_OF_TABLE[self.rc_table]

    @property
    def node_gnb_id(self) -> int:
        return self.site + 1 if self.gnb_id is None else self.gnb_id

    @property
    def global_id(self):
        """The GlobalE2node-ID of its E2 setup: a gNB-DU (gNB ID + gNB-DU ID)."""
        from e2sm.e2ap import GlobalE2NodeId

        return GlobalE2NodeId(plmn=self.plmn, gnb_id=self.node_gnb_id, gnb_id_bits=self.gnb_id_bits, du_id=self.du_id)

    @cached_property  # on every message the node sends (its meid)
    def inventory_name(self) -> str:
        """The RAN name OSC's E2T (and e2mgr, the R-NIB) gives this node: `testbed.ric.names.ran_name`, e.g.
        `gnbd_001_001_000001_1` for gNB ID 1, gNB-DU ID 1 in PLMN 001/01."""
        from testbed.ric.names import ran_name

        return ran_name(self.global_id)

    def nr_cell_id(self, cell: int) -> int:
        """36-bit NR Cell Identity: gNB ID in the leading `gnb_id_bits`, the cell index after it."""
        return (self.node_gnb_id << (36 - self.gnb_id_bits)) | cell

    def cell_of(self, nr_cell_id: int) -> int | None:
        """The cell index for an NR Cell Identity of this node, or None if it is not ours."""
        shift = 36 - self.gnb_id_bits
        cell = nr_cell_id & ((1 << shift) - 1)
        if nr_cell_id >> shift != self.node_gnb_id or cell >= self.n_cells:
            return None
        return cell


def node_configs(scenario, kpm_version: str = "v3.00", rc_table: str = "srsran",
                 overrides: dict[int, dict] | None = None) -> tuple[NodeConfig, ...]:
    """One NodeConfig per site of a `testbed.model.Scenario`; `overrides[site]` replaces fields."""
    out = []
    for site in scenario.sites:
        fields = dict(site=site.site_id, n_cells=len(site.cells), gpu_sms=site.gpu_sms,
                      slices=tuple(SliceId(s.sst, s.sd) for s in site.slices), kpm_version=kpm_version,
                      rc_table=rc_table)
        fields.update((overrides or {}).get(site.site_id, {}))
        out.append(NodeConfig(**fields))
    return tuple(out)
