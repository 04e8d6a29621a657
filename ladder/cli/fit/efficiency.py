"""`ladder fit efficiency` and `ladder fit iso-bpb`: the report's two efficiency readings.

- efficiency: EG_FLOPs and EG_time of every ablation arm against a baseline arm, per rung, with
  bootstrap intervals (columns: arm, rung, train_flops, wall_seconds, and the metric);
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

    df, source = load_input(args)
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
    finish(args, payload, source, df, None, {arm: {str(r["rung"]): r.get("eg_flops") for r in rows}
                                             for arm, rows in out["arms"].items()})
    if args.json:
        print_json(payload)
        return 0
    rows = []
    for arm, arm_rows in out["arms"].items():
        for r in arm_rows:
            iv = r["eg_flops_interval"]  # None where the baseline law has no interval (the one interval rule)
            rows.append([arm, str(r["rung"]), f"{r['eg_flops'] - 1:+.1%}",
                         f"[{iv[0] - 1:+.1%}, {iv[1] - 1:+.1%}]" if iv else "n/a",
                         f"{r['eg_time'] - 1:+.1%}" if "eg_time" in r else "-"])
    stdout_console.print(make_table(f"efficiency gain against {args.baseline} (EG − 1)",
                                    ["arm", "rung", "EG_FLOPs", "interval", "EG_time"], rows))
    note = next((r.get("eg_flops_interval_note") for arm_rows in out["arms"].values() for r in arm_rows
                 if r.get("eg_flops_interval_note")), None)
    if note:
        print(f"interval not available: {note}", file=sys.stderr)
    return 0


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
    out = iso_bpb_multipliers(laws, refs["references"])
    if args.json:
        print_json(out)
        return 0
    rows = []
    for ref in out["references"]:
        for domain, r in ref["domains"].items():
            iv = r.get("interval")
            rows.append([ref["reference"], domain, r["bpb_reference"], f"{r['multiplier']:.3g}×",
                         f"[{iv[0]:.3g}, {iv[1]:.3g}]" if iv else "-"])
    stdout_console.print(make_table("iso-BPB compute multiplier (reference FLOPs / FLOPs our law needs)",
                                    ["reference", "domain", "reference BPB", "multiplier", "interval"], rows))
    return 0
