"""PNG plots for `weaver bench policies` (matplotlib, Agg backend: no display needed)."""
from __future__ import annotations

from pathlib import Path

import numpy as np

SLOT_MS = 0.5


def _delay_cdf(hist: np.ndarray, sl: int, shaped: bool) -> tuple[np.ndarray, np.ndarray]:
    h = np.asarray(hist[0][sl], dtype=float)
    if shaped and sl == 1 and np.sum(hist[1][1]) > 0:
        extra = np.asarray(hist[1][1], dtype=float)
        h = np.convolve(h / h.sum(), extra / extra.sum())[: len(h)]
    c = np.cumsum(h) / max(h.sum(), 1e-12)
    return np.arange(len(c)) * SLOT_MS, c


def write_plots(results: dict, out_dir: str | Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, r in results.items():
        p = r["_plot"]
        T = p["period_slots"]
        n_sites = len(p["demand"])
        fig, axes = plt.subplots(n_sites, 1, figsize=(10, 2.8 * n_sites), squeeze=False)
        for site, ax in enumerate(axes[:, 0]):
            t = np.arange(len(p["demand"][site])) * SLOT_MS
            ax.plot(t, p["uncapped"][site], lw=0.5, color="0.7", label="RAN demand, uncapped")
            ax.plot(t, p["demand"][site], lw=0.6, color="C0", label="RAN demand, weaver envelope")
            edges = np.arange(len(p["envelope"][site]) + 1) * T * SLOT_MS
            env = np.array(p["envelope"][site], dtype=float)
            ax.stairs(np.where(env > 0, env, np.nan), edges, color="C3", lw=1.5, label="envelope E")
            for arm, style in (("weaver-envelope", "C2"), ("reactive", "C1"), ("oracle", "k")):
                lease = np.array(p["lease"][arm][site], dtype=float)
                ax.stairs(p["gpu_sms"] - lease, edges, color=style, lw=1, ls="--", label=f"GPU - lease ({arm})")
            ax.set(ylabel="SMs", title=f"{name}: site {site} demand vs envelope vs lease",
                   ylim=(0, p["gpu_sms"] * 1.05))
            if site == 0:
                ax.legend(fontsize=7, loc="upper right", ncol=2)
        axes[-1, 0].set_xlabel("time (ms)")
        fig.tight_layout()
        paths.append(out / f"{name}_demand_envelope_lease.png")
        fig.savefig(paths[-1], dpi=100)
        plt.close(fig)

        fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
        for sl, ax in zip((0, 1), axes, strict=True):
            for label, key, shaped in (("uncapped", "uncapped", False), ("weaver envelope", "envelope", True),
                                       ("weaver quota", "quota", False)):
                x, c = _delay_cdf(p["hist"][key], sl, shaped)
                ax.plot(x, c, label=label)
            ax.set(xscale="symlog", xlabel="queueing delay (ms)", ylabel="CDF of bytes",
                   title=f"{name}: {'protected' if sl == 0 else 'best-effort'} slice", ylim=(0, 1.01))
            ax.legend(fontsize=7)
        fig.tight_layout()
        paths.append(out / f"{name}_delay_cdf.png")
        fig.savefig(paths[-1], dpi=110)
        plt.close(fig)

    names = list(results)
    arms = list(next(iter(results.values()))["arms"])
    fig, axes = plt.subplots(2, len(names), figsize=(3.2 * len(names), 6), squeeze=False)
    for j, name in enumerate(names):
        a = results[name]["arms"]
        axes[0, j].bar(range(len(arms)), [a[x]["usable_spare_sm_s"] for x in arms], color=[f"C{i}" for i in range(len(arms))])
        axes[0, j].set(title=name, ylabel="usable spare (SM*s)" if j == 0 else None)
        axes[1, j].bar(range(len(arms)), [100 * a[x]["utilization"] for x in arms], color=[f"C{i}" for i in range(len(arms))])
        axes[1, j].set(ylabel="utilisation (%)" if j == 0 else None, ylim=(0, 105))
        for ax in axes[:, j]:
            ax.set_xticks(range(len(arms)), arms, rotation=45, ha="right", fontsize=7)
    fig.tight_layout()
    paths.append(out / "usable_spare_utilisation.png")
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)
    return paths
