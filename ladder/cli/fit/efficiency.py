"""`ladder fit efficiency` and `ladder fit iso-bpb`: the report's two efficiency readings.

- efficiency: EG_FLOPs and EG_time of every ablation arm against a baseline arm, per rung, with
  bootstrap intervals (columns: arm, rung, train_flops, wall_seconds, and the metric). `--save FILE`
  writes the EG_FLOPs as a laws file's "arms" section, the form `ladder fit arms --save` writes
  (`ladder/cli/fit/laws_file.py`: per arm, one domain named after the metric, "all" for bpb, its EG per
  rung and trend with scale; each rung also keeps its EG_time), so `ladder extrapolate --laws FILE`
  carries the gain to a target's compute;
- iso-bpb: the iso-BPB compute multiplier of fitted laws (a `ladder fit power-law --save` file)
  over reference models (a references YAML, e.g. fits/references/mai_base_2_references.yaml).
Registered under `ladder fit` by `ladder/cli/fit/__init__.py`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ladder.cli.fit.inputs import add_floor_arg
from ladder.errors import LadderInputError
from ladder.cli.output import make_table, print_json, stdout_console

REFERENCES_EXAMPLE = Path(__file__).resolve().parents[3] / "fits" / "references" / "mai_base_2_references.yaml"


def register(fit_sub: argparse._SubParsersAction, common) -> None:
    q = fit_sub.add_parser("efficiency", help="EG_FLOPs / EG_time of ablation arms against a baseline arm")
    common(q)
    q.add_argument("--baseline", required=True, help="value of the arm column naming the baseline")
    q.add_argument("--arm", default="arm", help="arm column (default arm)")
    q.add_argument("--rung", default="rung", help="rung column (default rung)")
    q.add_argument("--y", default="bpb", help="metric column (default bpb)")
    q.add_argument("--x", default="train_flops", help="compute column (default train_flops)")
    q.add_argument("--wall", default="wall_seconds", help="wall-clock column (default wall_seconds; 'none' to skip)")
    q.add_argument("--bootstrap", type=int, default=1000, help="bootstrap resamples for the EG intervals (default 1000)")
    q.add_argument("--ci-level", type=float, default=0.95, help="confidence level of the intervals (default 0.95)")
    add_floor_arg(q)
    q.set_defaults(handler=run_efficiency)

    q = fit_sub.add_parser("iso-bpb", help="iso-BPB compute multiplier of fitted laws over reference models")
    q.add_argument("--laws", required=True, help="laws JSON from `ladder fit power-law --save`")
    q.add_argument("--references", default=str(REFERENCES_EXAMPLE), help="references YAML (default: the report's example)")
    q.add_argument("--json", action="store_true", help="print one JSON object")
    q.set_defaults(handler=run_iso_bpb, fit_command="iso-bpb")


def run_efficiency(args: argparse.Namespace) -> int:
    from fits.efficiency import efficiency_gains
    from fits.errors import FitError

    from ladder.cli.fit.inputs import finish, input_error, load_input

    if not 0 < args.ci_level < 1:
        raise LadderInputError(f"must be in (0, 1), got {args.ci_level}", field="--ci-level")
    if args.bootstrap < 0:
        raise LadderInputError(f"must be 0 or more, got {args.bootstrap}", field="--bootstrap")
    df, source = load_input(args)
    if args.arm in df.columns:  # --baseline is text: an arm column read as numbers (0, 1) is compared as text
        df = df.assign(**{args.arm: df[args.arm].astype(str)})
    check_other_arms(df, args.arm, args.baseline, where=source.get("csv") or f"experiment {source.get('experiment')}")
    try:
        out = efficiency_gains(df, arm=args.arm, baseline=args.baseline, y=args.y, flops=args.x,
                               wall=None if args.wall == "none" else args.wall, rung=args.rung,
                               bootstrap=args.bootstrap, ci_level=args.ci_level, floor=args.floor)
    except FitError as err:
        raise input_error(err, source) from None
    payload = {**out, "source": source}
    if args.plot:
        from fits.plots import plot_efficiency

        plot_efficiency(out, args.plot)
        payload["plot"] = args.plot
    finish(args, payload, source, df, {"arms": arms_section(out, args.y, source)} if args.save else None,
           {arm: {str(r["rung"]): r.get("eg_flops") for r in rows} for arm, rows in out["arms"].items()})
    if args.json:
        print_json(payload)
        return 0
    rows = []
    for arm, arm_rows in out["arms"].items():
        for r in arm_rows:
            iv = r["eg_flops_interval"]  # None where the baseline law has no interval (the one interval rule)
            band = f"[{_bound_text(iv[0])}, {_bound_text(iv[1])}]" if iv else "n/a"
            rows.append([arm, str(r["rung"]), _eg_text(r.get("eg_flops")), "-" if r.get("eg_flops") is None else band,
                         _eg_text(r["eg_time"]) if "eg_time" in r else "-"])
    stdout_console.print(make_table(f"efficiency gain against {args.baseline} (EG − 1)",
                                    ["arm", "rung", "EG_FLOPs", "interval", "EG_time"], rows))
    note = next((r.get("eg_flops_interval_note") for arm_rows in out["arms"].values() for r in arm_rows
                 if r.get("eg_flops_interval_note")), None)
    if note:
        print(f"interval not available: {note}", file=sys.stderr)
    return 0


def _eg_text(eg: float | None) -> str:
    """EG − 1 as a percentage; an EG the baseline's law cannot give (null in the JSON: the arm's BPB is
    below the law's floor, which no compute reaches) said so."""
    return "below the baseline law's floor" if eg is None else f"{eg - 1:+.1%}"


def _bound_text(eg: float | None) -> str:
    """An end of EG's interval as EG − 1; null in the JSON is an end no compute reaches (infinite)."""
    return "+∞" if eg is None else f"{eg - 1:+.1%}"


def check_other_arms(df, arm: str, baseline: str, *, where: str) -> None:
    """Refuse a table whose only arm is the baseline: there is nothing to measure against it (the fits
    would return an empty result). A missing arm column or baseline is left to the fit's own message."""
    if arm not in df.columns:
        return
    present = sorted(set(map(str, df[arm].dropna())))
    if present == [str(baseline)]:
        raise LadderInputError(f"no arm besides the baseline {baseline!r}; arms in the table: {present}", where=where,
                               field=arm)


def arms_section(out: dict, y: str, source: dict) -> dict:
    """`fit efficiency`'s EG_FLOPs in the form `ladder fit arms --save` writes (a laws file's "arms" section,
    `ladder/cli/fit/laws_file.py`): per arm one domain named after the metric ("all" for bpb, the domain of
    a bpb_<domain> column, else the column), its rungs with EG, interval and verdict (and EG_time where
    measured), the trend of log EG with log compute (`fits.eg_scaling.eg_trend`) and the compute measured."""
    import math

    import numpy as np

    from fits.eg_scaling import DOMAIN_PREFIX, OVERALL, eg_trend, eg_verdict
    from fits.results import jsonable

    domain = "all" if y == OVERALL else y[len(DOMAIN_PREFIX):] if y.startswith(DOMAIN_PREFIX) else y
    arms = {}
    for name, rows in out["arms"].items():
        cells = []
        for r in rows:
            iv = r.get("eg_flops_interval")  # an end past the law's floor is infinite, null in the JSON
            reading = "below the baseline law's floor" if r["eg_flops"] is None else \
                eg_verdict(None if iv is None else [math.inf if v is None else v for v in iv])
            cells.append({"rung": r["rung"], "train_flops": r["train_flops"], "bpb": r["bpb"], "eg": r["eg_flops"],
                          "interval": iv, "verdict": reading,
                          **({"interval_note": r["eg_flops_interval_note"]} if r.get("eg_flops_interval_note") else {}),
                          **{k: r[k] for k in ("eg_time", "eg_time_interval", "wall_seconds") if k in r}})
        if all(c["eg"] is not None and c["eg"] > 0 for c in cells):
            trend = eg_trend(np.log([c["train_flops"] for c in cells]), np.array([c["eg"] for c in cells]),
                             [c["interval"] for c in cells], ci_level=out["ci_level"],
                             interval_dofs=[r.get("eg_flops_interval_dof") for r in rows],
                             correlation=(out.get("eg_flops_correlation") or {}).get(name))
        else:  # the words of fits.eg_scaling.eg_by_domain
            trend = {"slope": None, "interval": None, "verdict": "no trend",
                     "note": "an EG the baseline's law cannot give (the arm's BPB is below the law's floor)"}
        measured = [c["train_flops"] for c in cells]
        arms[name] = {domain: {"rungs": cells, "trend": trend,
                               "train_flops_range": [min(measured), max(measured)] if measured else None}}
    return jsonable({"baseline": out["baseline"], "against": "law", "ci_level": out["ci_level"], "domains": [domain],
                     "arms": arms, "errors": {}, "metric": y, "code_version": out.get("code_version"),
                     "source": source, "written_by": "ladder fit efficiency"})


def run_iso_bpb(args: argparse.Namespace) -> int:
    from fits.efficiency import iso_bpb_multipliers, load_references
    from fits.errors import FitInputError

    from ladder.cli.fit.laws_file import load_laws

    laws = load_laws([args.laws])["power_law"]
    if not laws:
        raise LadderInputError("no power laws in the file; write it with `ladder fit power-law --save`", where=args.laws)
    try:
        refs = load_references(args.references)
    except FitInputError as err:
        raise LadderInputError(err.detail, where=args.references) from None
    unmatched = {ref["name"]: sorted(set(ref["bpb"]) - set(laws)) for ref in refs["references"]}
    if not any(set(ref["bpb"]) & set(laws) for ref in refs["references"]):
        raise LadderInputError(f"no reference domain has a law: the references give "
                               f"{sorted({d for ref in refs['references'] for d in ref['bpb']})}, the laws "
                               f"({args.laws}) are for {sorted(laws)}", where=args.references, field="bpb")
    out = iso_bpb_multipliers(laws, refs["references"])
    for name, domains in unmatched.items():
        if domains:
            print(f"{name}: no law for {domains} (the laws are for {sorted(laws)}): left out", file=sys.stderr)
    if args.json:
        print_json(out)
        return 0
    rows, below = [], False
    for ref in out["references"]:
        for domain, r in ref["domains"].items():
            iv = r.get("interval")
            if r.get("below_floor"):  # no compute reaches it: the multiplier's 0 and its interval say nothing
                below = True
                rows.append([ref["reference"], domain, r["bpb_reference"],
                             f"below the law's floor E={laws[domain].params['E']:.4g}: no compute reaches it", "-"])
                continue
            rows.append([ref["reference"], domain, r["bpb_reference"], f"{r['multiplier']:.3g}×",
                         f"[{iv[0]:.3g}, {iv[1]:.3g}]" if iv else "n/a"])
    stdout_console.print(make_table("iso-BPB compute multiplier (reference FLOPs / FLOPs our law needs)",
                                    ["reference", "domain", "reference BPB", "multiplier", "interval"], rows))
    if below:
        print("a reference BPB below a law's floor E is one our law reaches at no compute (the JSON's "
              "\"below_floor\": true, multiplier 0)", file=sys.stderr)
    for note in sorted({r["interval_note"] for ref in out["references"] for r in ref["domains"].values()
                        if r.get("interval_note")}):
        print(f"interval not available: {note}", file=sys.stderr)
    return 0
