"""The figure of `ladder fit heldout` (`fits.heldout_noise`): one panel per split (a rung), one bar per domain
(and their mean): one seed's sd of log BPB, the part the held-out documents make drawn inside it, and a tick at
the sd that k times the documents would leave."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure

from fits.heldout_noise import split_label
from fits.plots import new_figure, save_figure

MAX_COLUMNS = 4


def plot_heldout_split(splits: list[dict[str, Any]], more_documents: float, *, by: str = "rung",
                       path: str | Path | None = None) -> Figure:
    """`splits`: the `splits` of `ladder fit heldout --json` (each {"by": value, or a list of values for several
    comma-separated `by` columns, "domains": {domain: cell}});
    a split without domains (not split, for want of seeds) is left out."""
    shown = [s for s in splits if s.get("domains")]
    if not shown:
        raise ValueError("no split to plot: every split lacks the seeds to split")
    ncols = min(MAX_COLUMNS, len(shown))
    fig, axes = new_figure(ncols, math.ceil(len(shown) / ncols), size=(3.8, 3.0))
    for ax, split in zip(axes, shown):
        domains = sorted(split["domains"], key=lambda d: (d == "all", d))
        cells = [split["domains"][d] for d in domains]
        x = np.arange(len(domains))
        ax.bar(x, [100 * c["sd_total"] for c in cells], color="C0", alpha=0.35, label="one seed's sd")
        ax.bar(x, [100 * c["sd_documents"] for c in cells], width=0.5, color="C3", label="the held-out documents' part")
        ax.scatter(x, [100 * c["sd_with_more_documents"] for c in cells], marker="_", s=220, color="k", zorder=3,
                   label=f"with {more_documents:g}× the documents")
        ax.set_xticks(x, domains, fontsize=7, rotation=30)
        ax.set_title(f"{split_label(by, split['by'])} ({split['runs']} runs)", fontsize=9)
        ax.set_ylabel("sd of log BPB (%)", fontsize=8)
        ax.tick_params(labelsize=7)
    top = max(ax.get_ylim()[1] for ax in axes[:len(shown)])
    for ax in axes[:len(shown)]:  # one scale for every panel: the rungs' (and arms') noise is what is compared
        ax.set_ylim(0, top)
    for ax in axes[len(shown):]:
        ax.set_visible(False)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncols=3, fontsize=7)
    return save_figure(fig, path)
