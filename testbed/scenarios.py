"""Named load regimes for `weaver bench`, `weaver up` and `weaver sim`.

Each scenario states its load regime (measured, not assumed, by `scenario_stats`): cells per GPU, RAN
p99.9 per-slot demand as a share of the GPU, slot-scale coefficient of variation of the site demand,
and mean DL PRB utilisation.

- `gh200-multicell`: 3 sites (residential, business, transport), each 8 cells on a 132-SM GH200-class GPU
  (Aerial's 20-cell GH200 capacity, facts row 19, at lighter load), mean PRB utilisation about 25 %;
  green-context partitions (8 SMs, microseconds to change).
- `heavy-small-gpu`: like the Weaver paper's testbed (LDPC decode on a DGX Spark-class part): 4 busy cells
  on a 48-SM GPU, RAN p99.9 demand >= 80 % of the GPU; green contexts.
- `slow-partition`: `gh200-multicell` with an MPS-like partition mechanism: changing the training
  partition takes 0.3 s (facts row 9), during which only the smaller of old and new grant is usable.
- `scale`: 128 sites of mixed archetypes and lognormal volumes, 4 cells each, a coarser 200 ms period.
- `demo`: 3 sites x 4 cells (residential, business, transport) for `weaver up` / `weaver sim` / `bench sim`.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

import numpy as np

from .model import CellConfig, ModelConfigError, RanModel, Scenario, SiteConfig
from .model.config import parse_slices


def _describe(name: str) -> str:
    """The scenario's bullet of the module doc, as its description."""
    bullet = __doc__.split(f"- `{name}`: ", 1)[1]
    return " ".join(bullet.split("\n- ", 1)[0].split())


def _gh200(name: str = "gh200-multicell", reconfig_s: float = 0.0, partition: str = "green-context") -> Scenario:
    archetypes = ("residential", "business", "transport")
    hours = (0.0, -9.0, -2.0)  # phase offsets so that, at 20 h local, the three sites sit at different points of their day
    sites = tuple(SiteConfig(site_id=i, archetype=a, cells=(CellConfig(load=0.2),) * 8, phase_h=h)
                  for i, (a, h) in enumerate(zip(archetypes, hours, strict=True)))
    return Scenario(name=name, description=_describe(name),
                    sites=sites, partition=partition, reconfig_s=reconfig_s, start_hour=20.0)


def _heavy() -> Scenario:
    sites = tuple(SiteConfig(site_id=i, archetype="mixed", gpu_sms=48, granularity=8,
                             cells=(CellConfig(load=0.66, mcs_mean=22),) * 4, phase_h=i * 0.5)
                  for i in range(3))
    return Scenario(name="heavy-small-gpu", description=_describe("heavy-small-gpu"), sites=sites,
                    start_hour=20.0)


def _scale(n_sites: int = 128) -> Scenario:
    rng = np.random.default_rng(20260)  # fixed layout; traffic still follows the run's seed
    archetypes = ("residential", "business", "transport", "entertainment", "mixed")
    sites = tuple(SiteConfig(site_id=i, archetype=archetypes[i % 5], cells=(CellConfig(load=0.25),) * 4,
                             phase_h=float(rng.uniform(-1, 1)), scale=float(np.clip(rng.lognormal(0, 0.35), 0.4, 2.2)))
                  for i in range(n_sites))
    return Scenario(name="scale", description=_describe("scale"), sites=sites, period_slots=400,
                    start_hour=20.0)


def _demo() -> Scenario:
    sites = tuple(SiteConfig(site_id=i, archetype=a, cells=(CellConfig(load=0.3),) * 4, phase_h=h)
                  for i, (a, h) in enumerate(zip(("residential", "business", "transport"), (0.0, -9.0, -2.0),
                                                 strict=True)))
    return Scenario(name="demo", description=_describe("demo"), sites=sites, start_hour=20.0)


SCENARIOS = {
    "gh200-multicell": _gh200,
    "heavy-small-gpu": _heavy,
    "slow-partition": lambda: _gh200("slow-partition", reconfig_s=0.3, partition="mps"),
    "scale": _scale,
    "demo": _demo,
}


def check(name: str, known: Iterable[str] | None = None) -> None:
    """Refuse a name outside `known` (default: every named scenario) with one line that lists them: every
    command taking a scenario name says the same (and none runs on, e.g. on an empty selection)."""
    names = list(SCENARIOS if known is None else known)
    if name not in names:
        raise ModelConfigError(f"unknown scenario {name!r}; known: {', '.join(names)}")


def get(name: str, **overrides) -> Scenario:
    """The named scenario, with `Scenario` fields replaced by `overrides` (e.g. period_slots=400)."""
    check(name)
    return replace(SCENARIOS[name](), **overrides)


def with_slices(sc: Scenario, slices: dict) -> Scenario:
    """`sc` with the slices of `slices` (site or "*" -> "PROTECTED_SST:SD,BEST_EFFORT_SST:SD", as `weaver sim
    --slices` / `--scenario-file` give them) in place of its sites' own; a site it lacks is refused."""
    if not slices:
        return sc
    unknown = [k for k in slices if k != "*" and not (isinstance(k, int) and 0 <= k < sc.n_sites)]
    if unknown:
        raise ModelConfigError(f"--slices for sites {unknown}: the scenario has sites 0..{sc.n_sites - 1}")
    sites = tuple(replace(site, slices=parse_slices(slices[site.site_id if site.site_id in slices else "*"]))
                  if site.site_id in slices or "*" in slices else site for site in sc.sites)
    return replace(sc, sites=sites)


@dataclass(frozen=True)
class ScenarioStats:
    """A scenario's load regime measured on an uncapped run (no training, no shaping)."""

    name: str
    cells_per_gpu: int
    gpu_sms: int
    ran_p999_share: float  # p99.9 of per-slot site demand / GPU SMs (mean over sites)
    ran_mean_share: float
    slot_cv: float  # std / mean of per-slot site demand (mean over sites)
    mean_prb_util: float  # mean DL PRB utilisation over cells
    partition: str
    reconfig_s: float
    seed: int
    n_slots: int


def scenario_stats(scenario: Scenario, seed: int = 0, n_periods: int = 200) -> ScenarioStats:
    model = RanModel(scenario, seed)
    demand, util = [], []
    for _ in range(n_periods):
        rep = model.step_period()
        demand.append(rep.demand)
        util.append(rep.prb_util_dl.mean())
    d = np.concatenate(demand)  # (T, S)
    gpu = np.array([s.gpu_sms for s in scenario.sites], dtype=float)
    return ScenarioStats(
        name=scenario.name, cells_per_gpu=scenario.n_cells, gpu_sms=int(gpu[0]),
        ran_p999_share=float(np.mean(np.quantile(d, 0.999, axis=0) / gpu)),
        ran_mean_share=float(np.mean(d.mean(axis=0) / gpu)),
        slot_cv=float(np.mean(d.std(axis=0) / d.mean(axis=0))), mean_prb_util=float(np.mean(util)),
        partition=scenario.partition, reconfig_s=scenario.reconfig_s, seed=seed, n_slots=d.shape[0])


def main(argv: list[str] | None = None) -> int:
    """`python -m testbed.scenarios [--seed N] [--periods N]`: each scenario's measured load regime."""
    import argparse

    p = argparse.ArgumentParser(prog="python -m testbed.scenarios", description=main.__doc__)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--periods", type=int, default=100)
    p.add_argument("names", nargs="*", default=[n for n in SCENARIOS if n != "scale"])
    args = p.parse_args(argv)
    print(f"{'scenario':16} {'sites':>5} {'cells/GPU':>9} {'GPU SMs':>7} {'RAN p99.9':>9} {'RAN mean':>8} "
          f"{'slot CV':>7} {'PRB util':>8} {'partition':>14}")
    for name in args.names:
        sc = get(name)
        st = scenario_stats(sc, args.seed, args.periods)
        print(f"{name:16} {sc.n_sites:5d} {st.cells_per_gpu:9d} {st.gpu_sms:7d} {100 * st.ran_p999_share:8.0f}% "
              f"{100 * st.ran_mean_share:7.0f}% {st.slot_cv:7.2f} {100 * st.mean_prb_util:7.0f}% "
              f"{st.partition:>10} {st.reconfig_s:.1f}s")
    print(f"seed {args.seed}; {args.periods} periods per scenario, no training, no shaping")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
