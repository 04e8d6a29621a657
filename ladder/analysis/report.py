"""The demo's report: figures (PNG) and one self-contained HTML page (figures embedded)."""

from __future__ import annotations

import base64
import html
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ladder.analysis.demo_result import DemoResult
from ladder.analysis.recipe_card import card_rows
from ladder.plan.recipe import HparamLaws


def write_figures(result: DemoResult, best: pd.DataFrame, runs: pd.DataFrame) -> dict[str, Path]:
    from fits.plots import new_figure, save_figure, plot_power_laws, plot_surface

    out = result.out_dir
    figures = {"bpb_vs_flops": out / "bpb_vs_flops.png"}
    if result.power_laws or any("error" not in b for b in result.backtests.values()):
        panels = {d: result.power_laws.get(d) for d in sorted(set(result.power_laws) | set(result.backtests))}
        plot_power_laws(panels, best, path=figures["bpb_vs_flops"], holdout_top=1,
                        backtests={d: b for d, b in result.backtests.items() if "error" not in b})
    else:
        save_figure(_data_only_figure(best), figures["bpb_vs_flops"])
    if result.surfaces:
        fig, axes = new_figure(ncols=len(result.surfaces), size=(4.2, 3.6))
        for ax, surface in zip(axes, result.surfaces):
            plot_surface(surface, ax=ax)
        figures["lr_wd_surfaces"] = out / "lr_wd_surfaces.png"
        save_figure(fig, figures["lr_wd_surfaces"])
    figures["backtest"] = out / "backtest.png"
    save_figure(_backtest_figure(result), figures["backtest"])
    return figures


def _data_only_figure(best: pd.DataFrame):
    """The ladder's BPB against FLOPs per domain when no law could be fitted: the data still show."""
    from fits.plots import new_figure

    fig, axes = new_figure(size=(6.0, 4.0))
    ax = axes[0]
    for domain, part in best.groupby("domain"):
        part = part.sort_values("train_flops")
        ax.plot(part["train_flops"], part["bpb"], marker="o", label=str(domain))
    ax.set(xscale="log", yscale="log", xlabel="training FLOPs", ylabel="held-out BPB",
           title="ladder runs (no law fitted: see the table)")
    ax.legend(fontsize=7)
    return fig


def _backtest_figure(result: DemoResult):
    from fits.plots import new_figure

    fig, axes = new_figure(size=(6.0, 3.2))
    ax = axes[0]
    rows = [(d, b["predictions"][0]) for d, b in sorted(result.backtests.items()) if "error" not in b]
    if not rows:
        ax.text(0.5, 0.5, "no backtest: no law could be fitted", ha="center", va="center", transform=ax.transAxes)
        return fig
    names = [d for d, _ in rows]
    errs = np.array([100 * p["rel_error"] for _, p in rows])
    # A held-out prediction from too few rungs has no valid interval (fits.backtest): no error bar for it.
    has = np.array([p.get("interval_available", True) for _, p in rows])
    lo = np.array([100 * (p["lo"] - p["actual"]) / p["actual"] if p.get("interval_available", True) else 0.0
                   for _, p in rows])
    hi = np.array([100 * (p["hi"] - p["actual"]) / p["actual"] if p.get("interval_available", True) else 0.0
                   for _, p in rows])
    y = np.arange(len(rows))
    if has.any():
        ax.errorbar(errs[has], y[has], xerr=[errs[has] - lo[has], hi[has] - errs[has]], fmt="o", color="C0",
                    capsize=3, label="prediction, 95% interval")
    if (~has).any():
        ax.plot(errs[~has], y[~has], "o", color="C1", label="prediction (interval n/a: too few rungs)")
    ax.axvline(0, color="k", lw=0.8)
    ax.axvspan(-3, 3, color="C2", alpha=0.12, label="±3%")
    ax.set_yticks(y, names)
    ax.set_xlabel("top rung: (predicted − actual) / actual BPB, %")
    ax.set_title("held-out top rung, law fitted on the rungs below", fontsize=9)
    ax.legend(fontsize=7)
    return fig


def _img(path: Path) -> str:
    data = base64.b64encode(path.read_bytes()).decode()
    return f'<img alt="{html.escape(path.stem)}" src="data:image/png;base64,{data}">'


def _table(columns: list[str], rows: list[list[Any]]) -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(_fmt(v))}</td>" for v in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _fmt(v: Any) -> str:
    if isinstance(v, float):  # the form chosen on the value as rounded: 999999.9 is 1.000e+06, as 1e6 is
        return f"{v:.4g}" if 1e-3 <= abs(float(f"{v:.4g}")) < 1e6 or v == 0 else f"{v:.3e}"
    if isinstance(v, (list, tuple)) and len(v) == 2 and all(isinstance(x, float) for x in v):
        return f"[{_fmt(v[0])}, {_fmt(v[1])}]"
    return str(v)


CSS = """body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;color:#222}
table{border-collapse:collapse;margin:0.6em 0 1.4em}td,th{border:1px solid #ccc;padding:3px 8px;font-size:13px}
th{background:#f3f3f3}img{max-width:100%;margin:0.5em 0}code{background:#f5f5f5;padding:1px 4px}
.note{color:#555;font-size:13px}"""


def write_report(result: DemoResult, best: pd.DataFrame) -> Path:
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>ladder demo report</title><style>{CSS}</style>"
             "</head><body>", "<h1>Scaling-ladder demo: ladder → laws → recipe cards</h1>",
             f"<p class='note'>MLflow experiment <code>{html.escape(result.experiment)}</code> in "
             f"<code>{html.escape(result.tracking_uri)}</code>; sweep: {html.escape(str(result.sweep))}; "
             f"wall-clock {result.wall_seconds:.0f} s.</p>"]
    parts.append("<h2>BPB vs training FLOPs, per held-out domain</h2>")
    parts.append("<p class='note'>BPB(C) = E + A·C<sup>−α</sup>, summed Huber (δ=1e-3) on log residuals, "
                 "bootstrap over runs for the 95% band; open red markers: the held-out top rung. Where the rungs "
                 "show no loss floor, E is at zero and the law is A·C<sup>−α</sup> (marked E = 0).</p>")
    parts.append(_img(result.figures["bpb_vs_flops"]))
    law_rows = [[d, "", "", "", "", "", b.get("law_error") or b.get("error", "")]
                for d, b in sorted(result.backtests.items()) if d not in result.power_laws]
    for d, law in sorted(result.power_laws.items()):
        ci = law.ci if law.interval_note is None else {}  # the one interval rule: "n/a" where there is none
        if law.extra.get("floor_at_zero"):  # E on its bound: no value to report, nor an interval
            law_rows.append([d, "0 (no floor seen: A·C^−α)", law.params["A"], law.params["alpha"], "not identified",
                             ci.get("alpha", "n/a"), _rungs_and_runs(best, d, law.n_points)])
            continue
        law_rows.append([d, law.params["E"], law.params["A"], law.params["alpha"], ci.get("E", "n/a"),
                         ci.get("alpha", "n/a"), _rungs_and_runs(best, d, law.n_points)])
    parts.append(_table(["domain", "E", "A", "α", "E 95% CI", "α 95% CI", "rungs (runs) / why not fitted"], law_rows))
    parts.append("<h2>Backtest: the top rung predicted from the rungs below</h2>")
    parts.append(_img(result.figures["backtest"]))
    bt_rows = []
    for d, b in sorted(result.backtests.items()):
        if "error" in b:
            bt_rows.append([d, "", "", "", "", b["error"], ""])
            continue
        p = b["predictions"][0]
        available = p.get("interval_available", True)
        bt_rows.append([d, p["actual"], p["predicted"], [p["lo"], p["hi"]] if available else "n/a",
                        f"{100 * p['rel_error']:+.2f}%"
                        + (" (E = 0: no floor below the top)" if b.get("floor_at_zero") else ""),
                        ("inside" if p["inside"] else "outside") if available
                        else f"n/a: {p.get('interval_reason', 'too few rungs')}",
                        _width(p)])
    parts.append(_table(["domain", "actual BPB", "predicted", "95% interval", "error", "interval",
                         "± and what makes it (variance shares)"], bt_rows))
    if result.surfaces:
        parts.append("<h2>LR/WD surfaces in (log LR, log LR·WD)</h2>")
        parts.append(_img(result.figures["lr_wd_surfaces"]))
        srows = [[f"{s.key['params_active']:.3g}", f"{s.key['steps']:.0f}", s.optimum_natural()["lr"],
                  s.optimum_natural()["lr_wd"], ", ".join(s.flags) or "ok", ", ".join(s.notes)] for s in result.surfaces]
        parts.append(_table(["active params", "steps", "LR*", "LR*·WD*", "flags", "notes"], srows))
    for err in result.surface_errors:
        parts.append(f"<p class='note'>surface not fitted at {html.escape(str(err))}</p>")
    parts.append("<h2>Recipe cards</h2>")
    for name, card in result.cards.items():
        parts.append(f"<h3>{html.escape(name)}</h3>")
        rows = card_rows(card) + [["hyperparameters from", card["hyperparameters"].get("source", ""), ""]]
        parts.append(_table(["", "value", "95% interval"], rows))
        for warning in card.get("warnings") or []:
            parts.append(f"<p class='note'>warning: {html.escape(warning)}</p>")
    laws = HparamLaws()  # the report's laws, written once (ladder/plan/recipe.py)
    parts.append("<p class='note'>The mai-base-2 L102 card uses the MAI-Base-2 report's published laws "
                 f"(LR*·WD* = {laws.lr_wd_text()}, log LR* = {laws.log_lr_text()}): a CPU ladder cannot "
                 "fit a 2.8T model's laws. Its BPB is not predicted (different data and tokenizer).</p>")
    parts.append("</body></html>")
    result.report_path.write_text("\n".join(parts))
    return result.report_path


def _width(prediction: dict) -> str:
    """'±3.2% (seed noise 57%, parameters 43%)': the interval's width and its sources (fits.prediction)."""
    if not prediction.get("interval"):
        return ""
    from fits.prediction import describe_shares

    text = f"±{prediction['half_width_rel']:.1%} ({describe_shares(prediction['interval']['shares'])})"
    common = prediction["interval"].get("heldout_sampling_common")
    return text + (f"; held-out set ±{common:.1%}, common to every rung (not in the interval)" if common else "")


def _rungs_and_runs(best: pd.DataFrame, domain: str, runs: int) -> str:
    """"6 (12)": the rungs (distinct compute) a domain's law was fitted on, and its runs (two seeds a rung)."""
    return f"{best.loc[best['domain'] == domain, 'train_flops'].nunique()} ({runs})"
