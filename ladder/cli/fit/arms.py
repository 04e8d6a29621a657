"""`ladder fit arms`: what each arm of an ablation (a data recipe, a curation step) buys against the
baseline arm, per domain and per rung, with intervals, and whether it grows with scale
(`fits.eg_scaling`). Registered under `ladder fit` by `ladder/cli/fit/__init__.py`.

`--save FILE` writes the result as a laws file ({"arms": {baseline, ci_level, arms: {arm: {domain: EG
per rung, trend, train_flops_range}}}}: `ladder/cli/fit/laws_file.py`); `ladder extrapolate --laws FILE`
carries each arm's EG to the target's compute on the card (`fits.eg_extrapolate`).
"""

from __future__ import annotations

import argparse
import sys

from ladder.cli.fit.efficiency import check_other_arms
from ladder.cli.fit.inputs import add_ci_level_and_seed, add_floor_arg
from ladder.analysis.recipe_card import eg_pct
from ladder.cli.output import make_table, output_file, print_json, stdout_console
from ladder.errors import LadderInputError


def register(fit_sub: argparse._SubParsersAction, common) -> None:
    q = fit_sub.add_parser("arms", help="EG_FLOPs of each arm against a baseline arm per domain and rung, and its "
                                        "trend with scale")
    common(q)
    q.add_argument("--baseline", required=True, help="value of the arm column naming the baseline arm")
    q.add_argument("--arm", default="arm", help="arm column (default arm)")
    q.add_argument("--rung", default="rung", help="rung column (default rung)")
    q.add_argument("--x", default="train_flops", help="compute column (default train_flops)")
    q.add_argument("--domains", help="comma-separated domains (default: every bpb_<domain> column, and 'all' for bpb)")
    q.add_argument("--block", help="only the runs of this sweep block (a `block` column)")
    q.add_argument("--against", choices=["law", "rung"], default="law",
                   help="read each arm's BPB off the baseline's law (law, the report's EG; default) or against the "
                        "baseline's own runs at the same rung, the law giving its slope (rung: the law's misfit at a "
                        "rung, shared by every arm, cancels; needs repeated seeds for an interval)")
    q.add_argument("--target-width", type=float, default=0.10, metavar="FRACTION",
                   help="with --against rung: say how many seeds a side would make each EG interval this wide "
                        "(its half-width, a fraction), from the measured seed noise (default 0.10: ±10%%)")
    q.add_argument("--pair-on", metavar="COLUMN",
                   help="with --against rung: pair each arm's run with the baseline's run that has the same value in "
                        "this column (seed: runs on one seed start from the same weights, whatever their data, and "
                        "with data_order=keyed read the documents they share in one order), so that share of the "
                        "seed noise cancels; only paired runs count")
    q.add_argument("--seed-noise", choices=["rung", "pooled"],
                   help="with --against rung: the seed noise each rung's interval uses: that rung's own, from every "
                        "arm's repeated seeds there (rung; a rung without repeats borrows the others' pool; default), "
                        "or one pooled over the rungs (pooled: more degrees of freedom, right only if the rungs' noise "
                        "is the same; the JSON's seed_noise.equal_across_rungs tests it)")
    q.add_argument("--raise-seeds", metavar="SPEC",
                   help="with --against rung and --raised-spec: the sweep spec these runs came from, to be written "
                        "back with each arm's seeds at each rung raised to the seeds a side the target width needs "
                        "(in the mean over domains, else the most any domain needs); a run of it trains only the "
                        "new seeds")
    q.add_argument("--raised-spec", type=output_file((".yaml", ".yml")), metavar="OUT",
                   help="where --raise-seeds writes its spec")
    q.add_argument("--bootstrap", type=int, default=200,
                   help="bootstrap resamples of each baseline law (default 200)")
    add_ci_level_and_seed(q)
    add_floor_arg(q)
    q.set_defaults(handler=run_arms)


def seeds_text(cell: dict) -> str:
    """"4 [3–8]": the seeds a side for the target width, and that number at either end of the seed noise's
    interval ("-" where there is none; ">10000" past the search)."""
    from fits.eg_same_rung import SEEDS_SEARCHED

    def one(n: int | None) -> str:
        return str(n) if n is not None else f">{SEEDS_SEARCHED}"

    if "seeds_for_target" not in cell:
        return "-"
    lo, hi = cell.get("seeds_for_target_range") or (None, None)
    return f"{one(cell['seeds_for_target'])} [{one(lo)}–{one(hi)}]"


def run_arms(args: argparse.Namespace) -> int:
    from fits.eg_scaling import eg_by_domain
    from fits.errors import FitError

    from ladder.cli.fit.inputs import finish, input_error, load_input

    if not 0 < args.ci_level < 1:
        raise LadderInputError(f"must be in (0, 1), got {args.ci_level}", field="--ci-level")
    if not args.target_width > 0:
        raise LadderInputError(f"must be above 0, got {args.target_width}", field="--target-width")
    if args.bootstrap < 0:
        raise LadderInputError(f"must be 0 or more, got {args.bootstrap}", field="--bootstrap")
    if args.pair_on and args.against != "rung":
        raise LadderInputError("pairs runs against the same rung only: add --against rung", field="--pair-on")
    if args.seed_noise and args.against != "rung":
        raise LadderInputError("sets the seed noise of the intervals against the same rung only: add --against rung",
                               field="--seed-noise")
    if (args.raise_seeds is None) != (args.raised_spec is None):
        raise LadderInputError("--raise-seeds SPEC and --raised-spec OUT go together", field="--raise-seeds")
    spec = None
    if args.raise_seeds is not None:
        if args.against != "rung":
            raise LadderInputError("the seeds a side are named against the same rung only: add --against rung",
                                   field="--raise-seeds")
        from sweeps.spec import load_spec

        spec = load_spec(args.raise_seeds)
    df, source = load_input(args)
    where = source.get("csv") or f"experiment {source.get('experiment')}"
    for column in (args.arm, args.rung, args.x, *([args.pair_on] if args.pair_on else [])):
        if column not in df.columns:
            raise LadderInputError(f"no such column; the table has {sorted(map(str, df.columns))}", where=where,
                                   field=column)
    if args.block:
        if "block" not in df.columns or args.block not in set(df["block"].astype(str)):
            raise LadderInputError(f"no runs of block {args.block!r}", where=where, field="--block")
        df = df[df["block"].astype(str) == args.block]
    df = df.assign(**{args.arm: df[args.arm].astype(str)})
    check_other_arms(df, args.arm, args.baseline, where=where)
    domains = [d.strip() for d in args.domains.split(",") if d.strip()] if args.domains else None
    try:
        out = eg_by_domain(df, arm=args.arm, baseline=args.baseline, rung=args.rung, flops=args.x, domains=domains,
                           bootstrap=args.bootstrap, ci_level=args.ci_level, seed=args.seed, floor=args.floor,
                           against=args.against, target_half_width=args.target_width, pair=args.pair_on,
                           seed_noise=args.seed_noise or "rung")
    except FitError as err:
        raise input_error(err, source) from None
    payload = {**out, "source": source}
    if args.plot:
        from fits.eg_plots import plot_eg_by_domain

        plot_eg_by_domain(out, args.plot)
        payload["plot"] = args.plot
    metrics = {}  # in the MLflow fit run: eg/<arm>/<domain>/L<rung> with its interval (and, against the same
    # rung, the seeds a side for the target width), and the trend's slope
    for arm, per in out["arms"].items():
        for domain, cell in per.items():
            for r in cell["rungs"]:
                key = f"eg/{arm}/{domain}/L{r['rung']}"
                metrics[key] = r["eg"]
                if r["interval"]:
                    metrics[f"{key}/low"], metrics[f"{key}/high"] = r["interval"]
                if r.get("seeds_for_target") is not None:  # against the same rung
                    metrics[f"{key}/seeds_for_target"] = r["seeds_for_target"]
            if cell["trend"].get("slope") is not None:
                metrics[f"eg_slope/{arm}/{domain}"] = cell["trend"]["slope"]
    if spec is not None:
        run_seeds = ({(str(a), int(r)): {int(x) for x in g["seed"].dropna()}
                      for (a, r), g in df.groupby([args.arm, args.rung])} if "seed" in df.columns else None)
        payload["raised_spec"] = write_raised_spec(out, spec, args.baseline, args.raised_spec, run_seeds)
    saved = {"arms": {k: v for k, v in payload.items() if k != "baseline_laws"}}  # the trends, not the laws' draws
    finish(args, payload, source, df, saved, metrics)
    if args.json:
        print_json(payload)
        return 0
    rows, trends = [], []
    seeds_column = "target_half_width" in out  # against the same rung, with a noise estimate
    for arm, per in out["arms"].items():
        for domain, cell in per.items():
            for r in cell["rungs"]:
                iv = r["interval"] if r["interval"] and r["interval"] != [None, None] else None
                rows.append([arm, domain, str(r["rung"]), _eg_text(r["eg"]),
                             f"[{_eg_text(iv[0])}, {_eg_text(iv[1])}]" if iv else "n/a", r["verdict"],
                             *([seeds_text(r)] if seeds_column else [])])
            t = cell["trend"]
            iv = t.get("interval")
            trends.append([arm, domain, f"{t['slope']:+.3f}" if t.get("slope") is not None else "-",
                           f"[{iv[0]:+.3f}, {iv[1]:+.3f}]" if iv else "n/a", t["verdict"]])
    level = f"{out['ci_level']:.0%}"
    reading = "its law" if out["against"] == "law" else "its own runs at the same rung" + (
        f", paired on {args.pair_on}" if args.pair_on else "")
    columns = ["arm", "domain", "rung", "EG − 1", "interval", "reading"]
    if seeds_column:
        columns.append(f"seeds a side for ±{out['target_half_width']:.0%} [{level}]")
    stdout_console.print(make_table(f"EG_FLOPs − 1 against {out['baseline']}, {reading} ({level} intervals)",
                                    columns, rows))
    stdout_console.print(make_table(f"trend: slope of log EG against log compute ({level} intervals)",
                                    ["arm", "domain", "slope", "interval", "reading"], trends))
    if out.get("seed_noise"):
        stdout_console.print(noise_table(out["seed_noise"]))
    notes = sorted({r["interval_note"] for per in out["arms"].values() for cell in per.values()
                    for r in cell["rungs"] if r.get("interval_note")})
    for note in notes:  # the table's n/a, said once each (as `fit efficiency` does)
        print(f"interval not available: {note}", file=sys.stderr)
    for domain, error in out["errors"].items():
        print(f"{domain}: no baseline law ({error})", file=sys.stderr)
    return 0


def seeds_needed(out: dict) -> tuple[dict[tuple[str, int], int], list[str]]:
    """Per (arm, rung), the seeds a side the fit names for its target width: the mean over domains' ("all"),
    else the most any domain needs; and the cells it names none for (no seed noise, or past the search)."""
    from fits.eg_same_rung import SEEDS_SEARCHED

    needed: dict[tuple[str, int], int] = {}
    unnamed: list[str] = []
    for arm, per in out["arms"].items():
        for cell in [per["all"]] if "all" in per else list(per.values()):
            for r in cell["rungs"]:
                rung = int(r["rung"])
                if r.get("seeds_for_target") is None:
                    why = "no seed noise" if "seeds_for_target" not in r else f"more than {SEEDS_SEARCHED}"
                    unnamed.append(f"{arm} L{rung} ({why})")
                    continue
                needed[(arm, rung)] = max(needed.get((arm, rung), 0), int(r["seeds_for_target"]))
    return needed, unnamed


def write_raised_spec(out: dict, spec, baseline: str, path: str, run_seeds: dict | None) -> dict:
    """Write `spec` with the seeds the fit names (`sweeps.raise_seeds`) to `path`; say what it adds on stderr."""
    from pathlib import Path

    import yaml

    from rungs.data.atomic import atomic_write_bytes
    from sweeps.raise_seeds import raised_spec
    from sweeps.spec import parse_spec

    needed, unnamed = seeds_needed(out)
    try:
        data, added, skipped = raised_spec(spec, needed, baseline=baseline, run_seeds=run_seeds)
    except ValueError as err:
        raise LadderInputError(str(err), field="--raise-seeds") from None
    parse_spec(data, path)  # what is written loads
    header = (f"# {spec.name} with each arm's seeds at each rung raised to the seeds a side that\n"
              f"# `ladder fit arms --against rung` names for ±{out['target_half_width']:.0%} (--raise-seeds). Trial "
              "keys name the config,\n# not the block: a run of it trains only the new seeds.\n")
    text = header + yaml.safe_dump(data, sort_keys=False, default_flow_style=None, allow_unicode=True, width=110)
    atomic_write_bytes(Path(path), text.encode())
    new = sum(len(v) for v in added.values())
    print(f"wrote {path}: {new} new seeds" + "".join(f"; {arm} L{rung} +{len(v)}" for (arm, rung), v in
                                                       sorted(added.items())), file=sys.stderr)
    unnamed += [f"{arm} L{rung} (not in {spec.name})" for arm, rung in skipped]
    for cell in unnamed:
        print(f"--raise-seeds: left as it is: {cell}", file=sys.stderr)
    return {"path": path, "added": [{"arm": arm, "rung": rung, "seeds": v} for (arm, rung), v in sorted(added.items())],
            "left_as_is": unnamed}


def noise_table(seed_noise: dict):
    """Against the same rung: each domain's seed noise of log BPB at each rung (sd, degrees of freedom), the
    pool over the rungs, Bartlett's p for equal noise across the rungs and across the arms (each arm's noise
    pooled over its rungs; the intervals pool the arms at a rung), and which the intervals used
    (`fits.rung_noise`)."""
    rungs = sorted({r for n in seed_noise.values() for r in n.get("by_rung", {})}, key=float)

    def sd(n: dict) -> str:
        return f"{n['log_sd']:.2%} ({n['dof']})" if n.get("log_sd") is not None and n.get("dof") else "-"

    def p_value(test: dict | None) -> str:
        return f"{test['p_value']:.3f}" if test else "-"

    rows = []
    for domain, n in seed_noise.items():
        rows.append([domain, *[sd(n.get("by_rung", {}).get(r, {})) for r in rungs], sd(n),
                     p_value(n.get("equal_across_rungs")), p_value(n.get("equal_across_arms"))])
    rule = next(iter(seed_noise.values())).get("rule", "pooled")
    used = ("each rung's own; a rung without repeats ('-') the pool" if rule == "rung" else "the pool, at every rung")
    return make_table(f"seed noise of log BPB between seeds (sd, dof); the intervals use {used}",
                      ["domain", *[f"L{r}" for r in rungs], "pooled", "equal across rungs (Bartlett p)",
                       "equal across arms (Bartlett p)"], rows)


def _eg_text(value: float | None) -> str:
    """EG − 1 as a percentage; None is an unbounded EG (`jsonable`'s infinity: below the baseline law's floor)."""
    return "+∞" if value is None else eg_pct(value)
