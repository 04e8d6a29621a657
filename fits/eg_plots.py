"""The figure of `fits.eg_scaling`: EG − 1 against compute, one panel per domain (small multiples), one
line per arm with each rung's interval, and the fitted trend (log EG = a + b·log C) dashed through it,
in the shape of the report's AGC figure (`fits.plots.plot_efficiency`). A rung whose BPB lies below the
baseline law's floor (an unbounded EG) is a triangle at the panel's top."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import NullFormatter

from fits.plots import mark_beyond_floor, new_figure, save_figure

MAX_COLUMNS = 4


def plot_eg_by_domain(result: dict[str, Any], path: str | Path | None = None) -> Figure:
    """One panel per domain of an `eg_by_domain` result (the `all` domain first when present)."""
    domains = sorted(result["domains"], key=lambda d: (d != "all", d))
    if not domains:
        raise ValueError("the result has no domain to plot")
    ncols = min(MAX_COLUMNS, len(domains))
    nrows = math.ceil(len(domains) / ncols)
    fig, axes = new_figure(ncols, nrows, size=(3.6, 3.0))
    for ax, domain in zip(axes, domains):
        for i, (arm, per_domain) in enumerate(result["arms"].items()):
            cell = per_domain.get(domain)
            if cell is None:
                continue
            rows = [r for r in cell["rungs"] if r["eg"] is not None]
            # rungs where the arm's BPB is below the baseline law's floor (an unbounded EG): a mark at the top
            mark_beyond_floor(ax, [r["train_flops"] for r in cell["rungs"] if r["eg"] is None], color=f"C{i}",
                              label=None if rows else f"{arm} (below the baseline's floor)")
            if not rows:
                continue
            C = np.array([r["train_flops"] for r in rows])
            eg = np.array([r["eg"] for r in rows])
            if all(r["interval"] is not None and None not in r["interval"] for r in rows):
                iv = np.array([r["interval"] for r in rows])
                ax.errorbar(C, 100 * (eg - 1), yerr=100 * np.abs(iv.T - eg), fmt="o-", color=f"C{i}", capsize=3,
                            label=arm)
            else:
                ax.plot(C, 100 * (eg - 1), "o-", color=f"C{i}", label=f"{arm} (interval n/a)")
            trend = cell["trend"]
            if trend.get("slope") is not None:
                grid = np.geomspace(C.min(), C.max(), 50)
                fitted = np.exp(trend["intercept"] + trend["slope"] * np.log(grid))
                ax.plot(grid, 100 * (fitted - 1), "--", color=f"C{i}", lw=0.9)
        ax.axhline(0, color="grey", lw=0.8)
        ax.set_xscale("log")
        ax.xaxis.set_minor_formatter(NullFormatter())  # under two decades matplotlib labels every minor tick
        ax.set_title(domain, fontsize=9)
        ax.set_xlabel("training FLOPs", fontsize=8)
        ax.set_ylabel("EG_FLOPs − 1 (%)", fontsize=8)
        ax.tick_params(labelsize=7)
    for ax in axes[len(domains):]:
        ax.set_visible(False)
    axes[0].legend(fontsize=7)
    reading = "its own runs at the same rung" if result.get("against") == "rung" else "its law"
    fig.suptitle(f"efficiency gain against {result['baseline']}, {reading} ({result['ci_level']:.0%} intervals; "
                 "dashed: trend)",
                 fontsize=9)
    return save_figure(fig, path)
