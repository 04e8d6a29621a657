"""Figures of the fitted laws, drawn on matplotlib's Agg canvas (no display, no global backend
switch, so notebooks keep their own) and saved as PNG when a path is given. Every function returns
the Figure, which a notebook shows as is.

- `plot_power_laws`: BPB against FLOPs on log axes per domain, the bootstrap band, the held-out
  rung(s) marked, and the law continued past the data;
- `plot_extrapolation`: each law and its band drawn on from the fitted range out to a target's FLOPs,
  with the prediction there and the recipe card's interval of one run (`ladder extrapolate --plot`);
- `plot_surface` / `plot_hparams`: loss contours in the diagonal coordinates (log LR, log LR·WD)
  with the sampled runs and the optimum; optima against steps and TPP with the fitted laws;
- `plot_efficiency`: EG_FLOPs and EG_time against compute with intervals;
- `plot_dropout`: the per-size dropout optima and the sigmoid law.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from fits.errors import FitInputError


def new_figure(ncols: int = 1, nrows: int = 1, size: tuple[float, float] = (5.0, 4.0)) -> tuple[Figure, np.ndarray]:
    """A headless (Agg) figure of nrows × ncols panels, each `size` inches, and its axes as a flat array."""
    fig = Figure(figsize=(size[0] * ncols, size[1] * nrows), layout="constrained")
    FigureCanvasAgg(fig)
    axes = np.atleast_1d(fig.subplots(nrows, ncols, squeeze=False)).ravel()
    return fig, axes


def save_figure(fig: Figure, path: str | Path | None) -> Figure:
    """Write the figure as a PNG at `path` (its folder made), unless path is None; return it."""
    if path is not None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, format="png", dpi=110)
    return fig


COLUMN_LABELS = {"train_flops": "training FLOPs", "bpb": "held-out BPB (bits per byte)", "tokens": "training tokens",
                 "params_active": "active parameters", "wall_seconds": "wall-clock seconds", "steps": "steps"}


def column_label(column: str) -> str:
    """An axis label for a runs-table column: its quantity and unit (`bpb_code`: "held-out BPB on code
    (bits per byte)"), the column's own name where it is not one the platform writes."""
    if column.startswith("bpb_") and not column.startswith("bpb_se"):
        return f"held-out BPB on {column[4:]} (bits per byte)"
    return COLUMN_LABELS.get(column, column)


def log_axes(ax) -> None:
    """Log-log axes whose y labels are plain numbers: a loss axis spans less than a decade, where
    matplotlib labels every minor tick in mathtext (slow to lay out, and "2.4×10⁰" reads worse than 2.4)."""
    from matplotlib.ticker import FormatStrFormatter

    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(FormatStrFormatter("%.3g"))
    ax.yaxis.set_minor_formatter(FormatStrFormatter("%.3g"))


def plot_power_laws(laws: dict[str, Any], df: pd.DataFrame, *, x: str = "train_flops", y: str = "bpb",
                    group: str | None = "domain", path: str | Path | None = None, holdout_top: int = 1,
                    extend: float = 10.0, backtests: dict[str, Any] | None = None) -> Figure:
    """One panel per law: data, fit, band (when bootstrapped), held-out rung(s) as open markers and,
    given the backtests, the prediction made without them (with its interval). A name mapped to
    None (its law was not identified) gets its data and its backtest without a law line, so it is
    seen rather than left out. A law whose group has no rows in `df` is drawn as its curve alone, over
    the range it was fitted on, and its title says so."""
    names = list(laws)
    if not names:
        raise FitInputError("no laws to plot: pass {name: fitted law (or None)}, one panel each")
    fig, axes = new_figure(ncols=min(len(names), 4), nrows=int(np.ceil(len(names) / 4)))
    for ax, name in zip(axes, names):
        law = laws[name]
        part = df if group is None or group not in df.columns else df[df[group].astype(str) == name]
        xs, ys = part[x].to_numpy(float), part[y].to_numpy(float)
        levels = np.unique(xs)
        held = xs >= levels[-holdout_top] if holdout_top and len(levels) > holdout_top else np.zeros(len(xs), bool)
        no_floor = law is not None and bool(law.extra.get("floor_at_zero"))
        x_range = (xs.min(), xs.max()) if len(xs) else law.extra.get("x_range") if law is not None else None
        if law is not None and x_range is not None:
            grid = np.geomspace(x_range[0], x_range[1] * extend, 200)
            form = "A·C^-α (E=0: no floor)" if no_floor else "E + A·C^-α"
            ax.plot(grid, law.predict(grid), color="C0", label=f"{form}, α={law.params['alpha']:.3g}")
            if law.interval_note is None:  # the one interval rule: no band where the law has no interval
                lo, hi = law.predict_interval(grid)
                ax.fill_between(grid, lo, hi, color="C0", alpha=0.2, label=f"{(law.ci_level or 0.95):.0%} band")
            if not no_floor:  # a floor at zero would only stretch the log axis
                ax.axhline(law.params["E"], color="grey", lw=0.8, ls=":")
        if len(xs):
            ax.scatter(xs[~held], ys[~held], color="k", s=14, zorder=3, label="runs")
        if held.any():
            ax.scatter(xs[held], ys[held], facecolors="none", edgecolors="C3", s=40, zorder=4, label="held-out rung")
        backtest = (backtests or {}).get(name) or {}
        for row in backtest.get("predictions", []):
            label = "predicted without it" + (" (E=0)" if backtest.get("floor_at_zero") else "")
            if "rel_error" in row:  # the backtest's numbers on the figure itself
                inside = row.get("inside") and row.get("interval_available", True)
                level = backtest.get("ci_level") or 0.95
                label += f": {100 * row['rel_error']:+.1f}%" + (f", inside {level:.0%}" if inside else "")
            if row.get("lo") is None or not row.get("interval_available", True):
                ax.plot(row["x"], row["predicted"], "_", color="C3", ms=12, zorder=5, label=label + " (interval n/a)")
                continue
            ax.errorbar(row["x"], row["predicted"], yerr=[[row["predicted"] - row["lo"]], [row["hi"] - row["predicted"]]],
                        fmt="_", color="C3", capsize=4, ms=12, zorder=5, label=label)
        log_axes(ax)
        ax.set_xlabel(column_label(x))
        ax.set_ylabel(column_label(y))
        notes = ([] if len(xs) else ["no runs"]) + (["law not identified"] if law is None else
                                                     ["E = 0"] if no_floor else [])
        ax.set_title(f"{name} ({', '.join(notes)})" if notes else str(name))
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    for ax in axes[len(names):]:
        ax.set_visible(False)
    return save_figure(fig, path)


def plot_extrapolation(laws: dict[str, Any], target_x: float, data: pd.DataFrame | None = None, *,
                       x: str = "train_flops", y: str = "bpb", group: str = "domain",
                       path: str | Path | None = None, target_label: str = "target", level: float = 0.95) -> Figure:
    """One panel per law: its runs (where `data` holds them), the fitted range shaded, the law drawn on
    out to `target_x` (dashed past the data), its band where the one interval rule allows one
    (`FitResult.interval_note`), and the prediction at the target with the recipe card's interval at
    `level` (`fits.extrapolate.bpb_from_law`: one new run's prediction interval, the same numbers the card
    prints), its legend saying which."""
    from fits.extrapolate import bpb_from_law

    names = sorted(laws)
    fig, axes = new_figure(ncols=max(1, min(len(names), 4)), nrows=max(1, int(np.ceil(len(names) / 4))))
    for ax, name in zip(axes, names):
        law = laws[name]
        x_lo, x_hi = law.extra.get("x_range") or (target_x, target_x)
        fitted = np.geomspace(x_lo, x_hi, 60)
        beyond = np.geomspace(x_hi, max(target_x, x_hi) * 1.5, 120)
        form = "A·C^-α (E=0)" if law.extra.get("floor_at_zero") else "E + A·C^-α"
        ax.axvspan(x_lo, x_hi, color="grey", alpha=0.1, label="fitted range")
        ax.plot(fitted, law.predict(fitted), color="C0", label=f"{form}, α={law.params['alpha']:.3g}")
        ax.plot(beyond, law.predict(beyond), color="C0", ls="--", label="extrapolated")
        has_band = law.interval_note is None
        if has_band:
            grid = np.concatenate([fitted, beyond])
            lo, hi = law.predict_interval(grid)
            ax.fill_between(grid, lo, hi, color="C0", alpha=0.2, label=f"{(law.ci_level or 0.95):.0%} band")
        if data is not None and group in data.columns:
            part = data[data[group].astype(str) == name]
            ax.scatter(part[x], part[y], color="k", s=14, zorder=3, label="runs")
        card = bpb_from_law(law, target_x, level)  # what `ladder extrapolate` prints at the target
        value, interval = card["value"], card["interval"]
        label = f"{target_label}: {value:.4g}"
        if interval is None:
            label += " (interval n/a)"
        elif card["interval_kind"].startswith("prediction interval"):
            label += f", {level:.0%} prediction interval of one run (the card's)"
        else:  # a laws file saved by older code: the law's band, no run noise (the card says the same)
            label += f", {level:.0%} band of the law (no run noise)"
        if interval is not None:
            lo, hi = interval
            ax.errorbar(target_x, value, yerr=[[value - lo], [hi - value]], fmt="*", color="C3", ms=10,
                        capsize=4, zorder=5, label=label)
        else:
            ax.plot(target_x, value, "*", color="C3", ms=10, zorder=5, label=label)
        ax.axvline(target_x, color="C3", lw=0.8, ls=":")
        log_axes(ax)
        ax.set_xlabel(column_label(x))
        ax.set_ylabel(column_label(y))
        ax.set_title(f"{name}: ×{target_x / x_hi:.3g} beyond the data", fontsize=9)
        ax.legend(fontsize=7)
    for ax in axes[len(names):]:
        ax.set_visible(False)
    return save_figure(fig, path)


def _fit_axis(surface, j: int, n: int) -> np.ndarray:
    """`n` points spanning coordinate j's samples in fit space, with a margin: 0.3 on a log axis (a
    factor 1.35), a tenth of the span on a linear one (dropout's 0–0.3 would drown in 0.3)."""
    col = surface.samples[:, j]
    margin = 0.3 if surface.log_coords[j] else 0.1 * float(np.ptp(col))
    return np.linspace(col.min() - margin, col.max() + margin, n)


def _natural(surface, pts: np.ndarray) -> np.ndarray:
    """Fit-space points back in natural units, each coordinate by its own log flag."""
    return np.column_stack([np.exp(pts[:, j]) if lg else pts[:, j] for j, lg in enumerate(surface.log_coords)])


def _axis_label(surface, j: int) -> str:
    return f"log {surface.coords[j]}" if surface.log_coords[j] else surface.coords[j]


def plot_surface(surface, ax=None, path: str | Path | None = None) -> Figure:
    """Contours of the fitted quadratic in its fit coordinates (each logged where its log flag says),
    the runs, and the optimum; a 1-D surface (dropout) is its curve of loss over the coordinate."""
    fig, axes = (ax.figure, [ax]) if ax is not None else new_figure()
    ax = axes[0]
    s = surface.samples
    label = "optimum" + (f" ({', '.join(surface.flags)})" if surface.flags else "")
    if len(surface.coords) == 1:
        u = _fit_axis(surface, 0, 200)
        ax.plot(u, surface.predict(_natural(surface, u[:, None])), color="C0", label="fitted quadratic")
        ax.scatter(s[:, 0], s[:, 1], color="k", s=14, zorder=3, label="runs")
        if np.all(np.isfinite(surface.optimum)):
            ax.errorbar(surface.optimum[0], surface.predicted_min, xerr=surface.optimum_se[0], color="C3", marker="*",
                        ms=12, capsize=3, zorder=4, label=label)
        ax.set_xlabel(_axis_label(surface, 0))
        ax.set_ylabel("loss")
        ax.set_title(", ".join(f"{k}={v:.3g}" for k, v in surface.key.items()), fontsize=8)
        ax.legend(fontsize=6)
        return save_figure(fig, path)
    U, V = np.meshgrid(_fit_axis(surface, 0, 80), _fit_axis(surface, 1, 80))
    Z = surface.predict(_natural(surface, np.column_stack([U.ravel(), V.ravel()]))).reshape(U.shape)
    levels = np.unique(np.quantile(s[:, 2], np.linspace(0.02, 0.7, 10)))
    cs = ax.contour(U, V, Z, levels=levels if len(levels) > 1 else 10, cmap="viridis")
    ax.clabel(cs, fontsize=6, fmt="%.3g")
    ax.scatter(s[:, 0], s[:, 1], c=s[:, 2], cmap="viridis", s=18, edgecolors="k", linewidths=0.3)
    if np.all(np.isfinite(surface.optimum)):
        ax.errorbar(*surface.optimum, xerr=surface.optimum_se[0], yerr=surface.optimum_se[1], color="C3", marker="*",
                    ms=12, capsize=3, label=label)
    ax.set_xlabel(_axis_label(surface, 0))
    ax.set_ylabel(_axis_label(surface, 1))
    ax.set_title(", ".join(f"{k}={v:.3g}" for k, v in surface.key.items()), fontsize=8)
    if surface.flags:
        ax.legend(fontsize=6)
    return save_figure(fig, path)


def plot_hparams(fit, out: str | Path) -> list[Path]:
    """Writes OUT_surfaces.png (every slice) and OUT_laws.png (optima vs steps/TPP with the laws);
    `out` is a file stem or a .png path whose stem is used. Adds OUT_dropout.png with a dropout law;
    a dropout-only sweep (LR/WD not swept: no slices, no LR/WD laws) gets OUT_dropout.png alone."""
    out = Path(out)
    stem = out.with_suffix("") if out.suffix == ".png" else out
    paths: list[Path] = []
    if fit.slices and fit.log_lr is not None and fit.lr_wd is not None:
        paths += _plot_lr_wd(fit, stem)
    if fit.dropout is not None:
        paths.append(Path(f"{stem}_dropout.png"))
        plot_dropout(fit.dropout, paths[-1])
    if not paths:
        raise FitInputError("the result has neither LR/WD laws nor a dropout law: nothing to plot")
    return paths


def _plot_lr_wd(fit, stem: Path) -> list[Path]:
    """OUT_surfaces.png and OUT_laws.png of `plot_hparams`."""
    n = len(fit.slices)
    cols = min(n, 5)
    fig, axes = new_figure(ncols=cols, nrows=int(np.ceil(n / cols)), size=(3.6, 3.2))
    for ax, s in zip(axes, fit.slices):
        plot_surface(s, ax=ax)
    for ax in axes[n:]:
        ax.set_visible(False)
    paths = [Path(f"{stem}_surfaces.png")]
    save_figure(fig, paths[0])
    fig, (a1, a2) = new_figure(ncols=2)
    good = [s for s in fit.slices if s.ok]
    steps = np.array([s.key["steps"] for s in good])
    tpps = np.array([s.key["tpp"] for s in good])
    for i, tpp in enumerate(np.unique(tpps)):
        m, color = tpps == tpp, f"C{i}"
        a1.scatter(steps[m], [np.exp(s.optimum[0]) for s, k in zip(good, m) if k], color=color, label=f"TPP {tpp:g}")
        a2.scatter(steps[m], [np.exp(s.optimum[1]) for s, k in zip(good, m) if k], color=color, label=f"TPP {tpp:g}")
        grid = np.geomspace(steps.min() / 2, steps.max() * 2, 50)
        vals = {"log_steps": np.log(grid), "log_tpp": np.full_like(grid, np.log(tpp)),
                "log_params": np.full_like(grid, np.nan)}
        if "log_params" not in fit.log_lr.terms:
            a1.plot(grid, np.exp([fit.log_lr.predict({k: v[j] for k, v in vals.items()})[0] for j in range(len(grid))]),
                    lw=1, color=color)
        if "log_params" not in fit.lr_wd.terms:
            a2.plot(grid, np.exp([fit.lr_wd.predict({k: v[j] for k, v in vals.items()})[0] for j in range(len(grid))]),
                    lw=1, color=color)
    for ax, label in ((a1, "LR*"), (a2, "LR*·WD*")):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("steps")
        ax.set_ylabel(label)
        ax.legend(fontsize=7)
    a1.set_title(f"log LR* ~ {' + '.join(fit.log_lr.terms)}", fontsize=9)
    a2.set_title(f"log LR*·WD* ~ {' + '.join(fit.lr_wd.terms)}", fontsize=9)
    paths.append(Path(f"{stem}_laws.png"))
    save_figure(fig, paths[-1])
    return paths


def mark_beyond_floor(ax, train_flops: list[float], *, color: str, marker: str = "^", label: str | None = None) -> None:
    """Rungs whose BPB lies below the baseline law's floor (an unbounded EG): marks at the panel's top."""
    if train_flops:
        ax.plot(train_flops, [0.96] * len(train_flops), marker, color=color, transform=ax.get_xaxis_transform(),
                clip_on=False, ls="none", label=label)


def plot_efficiency(eg: dict[str, Any], path: str | Path | None = None) -> Figure:
    """EG − 1 against compute for each arm, EG_FLOPs and (when measured) EG_time, with intervals. A rung
    whose BPB lies below the baseline law's floor (an unbounded EG, None in `efficiency_gains`) is a
    triangle at the panel's top, as in `fits.eg_plots`."""
    fig, axes = new_figure()
    ax = axes[0]
    for i, (arm, all_rows) in enumerate(eg["arms"].items()):
        for key, style in (("eg_flops", "o-"), ("eg_time", "s--")):
            label = f"{arm} {key.replace('eg_', 'EG_')}"
            mark_beyond_floor(ax, [r["train_flops"] for r in all_rows if key in r and r[key] is None], color=f"C{i}",
                              marker="^" if key == "eg_flops" else "v",
                              label=f"{label} below the baseline's floor (unbounded)")
            rows = [r for r in all_rows if r.get(key) is not None]
            if not rows:
                continue
            C = np.array([r["train_flops"] for r in rows])
            val = np.array([r[key] for r in rows], dtype=float) - 1
            intervals = [r.get(f"{key}_interval") for r in rows]
            if any(iv is None or None in iv for iv in intervals):  # no interval, or an unbounded end
                ax.plot(C, 100 * val, style, color=f"C{i}", label=f"{label} (interval n/a)")
                continue
            iv = np.array(intervals, dtype=float) - 1
            ax.errorbar(C, 100 * val, yerr=100 * np.abs(iv.T - val), fmt=style, color=f"C{i}", capsize=3, label=label)
    ax.axhline(0, color="grey", lw=0.8)
    ax.set_xscale("log")
    ax.set_xlabel("training FLOPs")
    ax.set_ylabel("efficiency gain (%)")
    ax.set_title(f"against {eg['baseline']}")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7)
    return save_figure(fig, path)


def plot_dropout(law, path: str | Path | None = None) -> Figure:
    from fits.dropout import sigmoid

    fig, axes = new_figure()
    ax = axes[0]
    for s in law.surfaces:
        n = s.key[law.options["size"]]
        ax.errorbar(n, s.optimum[0], yerr=s.optimum_se[0], fmt="o" if s.ok else "x", color="k" if s.ok else "C3", capsize=3)
    sizes = np.array([s.key[law.options["size"]] for s in law.surfaces])
    grid = np.geomspace(sizes.min() / 3, sizes.max() * 10, 200)
    p = law.params
    ax.plot(grid, sigmoid(np.log(grid), p["p_max"], p["k"], p["m"]), color="C0",
            label=f"p_max={p['p_max']:.3g}, k={p['k']:.3g}")
    ax.set_xscale("log")
    ax.set_xlabel("active parameters")
    ax.set_ylabel("dropout*")
    ax.legend(fontsize=7)
    return save_figure(fig, path)
