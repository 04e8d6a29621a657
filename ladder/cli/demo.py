"""`ladder demo`: the whole flow on embedded defaults (local Ray, SQLite MLflow under runs/).

`--plan-only` prints the planning flow alone (`ladder plan` of the spec's recipe at the rungs its blocks train,
at the recipe's TPP, and of mai-base-2), in seconds; with
`--json` one object `{"demo": "plan-only", "spec": <spec file>, "plans": [<ladder plan --json>, ...]}`,
one plan per recipe (the demo spec's recipe, then mai-base-2).

The spec and the store are checked before anything is written, as `ladder sweep run` checks them: a
`--tracking-uri` that names a missing store is refused unless `--new-store` (the default store is created).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ladder.cli.plan import plan_payload, render_plan
from ladder.cli.output import print_json, stderr_console
from ladder.plan.generator import plan_ladder
from ladder.plan.recipe import load_recipe
from rungs.tracking_uri import DEFAULT_STORE_HELP


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="the whole flow: corpus, ladder sweep, fits, backtest, recipe cards, report")
    p.add_argument("--out", type=Path, default=Path("runs/demo"), help="where the report goes")
    p.add_argument("--tracking-uri", help=f"MLflow store ({DEFAULT_STORE_HELP})")
    p.add_argument("--new-store", action="store_true",
                   help="create the --tracking-uri store when it does not exist (without it a missing store is "
                        "refused, as by `ladder sweep run`)")
    p.add_argument("--spec", default="demo", help="sweep spec name or path (default: sweeps/demo.yaml)")
    p.add_argument("--bootstrap", type=int, default=1000, help="bootstrap resamples for the laws")
    p.add_argument("--plan-only", action="store_true", help="only print the ladder plans")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    if args.plan_only:
        from sweeps.spec import load_spec, resolve_spec_path

        from ladder.analysis.demo import spec_rungs

        where = str(resolve_spec_path(args.spec))
        spec = load_spec(where)  # the demo ladder's own recipe, at the rungs its blocks train
        plans = []
        for name, rungs, gpus in ((spec.recipe, spec_rungs(spec), None), ("mai-base-2", [18, 24, 30, 36, 42, 102], 16000)):
            recipe = load_recipe(name)
            plans.append(plan_payload(recipe, plan_ladder(recipe, rungs),
                                      argparse.Namespace(gpus=gpus, mfu=None, goodput=None)))
        if args.json:
            print_json({"demo": "plan-only", "spec": where, "plans": plans})
            return 0
        for payload in plans:
            render_plan(payload)
        return 0
    from ladder.analysis.demo import run_demo, summary

    result = run_demo(out_dir=args.out, tracking_uri=args.tracking_uri, spec_name=args.spec, bootstrap=args.bootstrap,
                      new_store=args.new_store, progress=lambda msg: stderr_console.print(f"[bold cyan]demo[/] {msg}"))
    if args.json:
        print_json(summary(result))
        return 0
    from ladder.cli.extrapolate import render

    for name, card in result.cards.items():
        # the demo fits no law for mai-base-2 L102 (a CPU ladder; other data and tokenizer): its card says so
        render(card, no_laws="BPB not predicted: the demo's laws are of its own corpus and tokenizer, not this "
                             "recipe's")
    backtest = {d: b["predictions"][0]["rel_error"] for d, b in result.backtests.items() if "error" not in b}
    print("\nbacktest of the top rung (relative BPB error per domain): "
          + ", ".join(f"{d} {100 * e:+.2f}%" for d, e in sorted(backtest.items())))
    print(f"\nreport: {result.report_path.resolve()}  (open it in a browser)")
    store = result.tracking_uri
    print(f"MLflow UI on these runs: .venv/bin/mlflow ui --backend-store-uri {store}  (then http://127.0.0.1:5000)")
    print(f"done in {result.wall_seconds / 60:.1f} min")
    return 0
