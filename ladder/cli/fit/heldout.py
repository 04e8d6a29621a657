"""`ladder fit heldout`: how much of the seed noise each rung's held-out BPB carries comes from the held-out
documents, and so what more of them would buy (`fits.heldout_noise`). Registered under `ladder fit` by
`ladder/cli/fit/__init__.py`.

It reads an MLflow experiment's runs and each run's per-document bits (the final eval's `doc_bits` in its
eval.json artifact). Runs with the same `--by` value (default: the rung) are split together; within them,
runs with the same values of `--configs` (default: whichever of arm, lr, wd, dropout the runs have) are seeds
of one configuration, each centred on its own means and their scatter pooled.
"""

from __future__ import annotations

import argparse
import math
import sys
from typing import Any

from ladder.cli.output import make_table, output_file, print_json, stdout_console
from ladder.errors import LadderInputError
from rungs.tracking_uri import DEFAULT_STORE_HELP

CONFIG_COLUMNS = ("arm", "lr", "wd", "dropout")


def register(fit_sub: argparse._SubParsersAction) -> None:
    q = fit_sub.add_parser("heldout", help="split each rung's seed noise into the models' part and the held-out "
                                           "documents' part: what more held-out documents would narrow")
    q.add_argument("--experiment", required=True, help="the MLflow experiment whose runs to read")
    q.add_argument("--tracking-uri", help=f"MLflow store ({DEFAULT_STORE_HELP})")
    q.add_argument("--by", default="rung", help="one split per value of this column, or per combination of these "
                                                "comma-separated columns (default rung; e.g. arm,rung)")
    q.add_argument("--configs", help="comma-separated columns whose values make a configuration, its runs being "
                                     "its seeds (default: whichever of arm, lr, wd, dropout the runs have)")
    q.add_argument("--more-documents", type=float, default=4.0, metavar="K",
                   help="also say one seed's noise with K times the held-out documents, drawn like these (default 4)")
    q.add_argument("--plot", type=output_file((".png",)),
                   help="write a PNG: per rung, each domain's seed sd with the held-out documents' part inside it")
    q.add_argument("--no-log", action="store_true", help="do not log the result back to MLflow")
    q.add_argument("--json", action="store_true", help="print one JSON object")
    q.set_defaults(handler=run_heldout)


def run_heldout(args: argparse.Namespace) -> int:
    from fits.heldout_noise import split_label, split_runs
    from ladder.run.mlflow_runs import final_doc_bits, fit_table, log_fit_run, read_runs
    from rungs.tracking_uri import default_tracking_uri

    if not args.more_documents > 0:
        raise LadderInputError(f"must be above 0, got {args.more_documents}", field="--more-documents")
    uri = default_tracking_uri(args.tracking_uri)
    runs = fit_table(read_runs(args.experiment, uri))
    where = f"experiment {args.experiment}"
    by = [c.strip() for c in args.by.split(",") if c.strip()]
    bad = [c for c in by if c not in runs.columns]
    if not by or bad:
        raise LadderInputError(f"no such column(s) {bad or [args.by]}; the runs have {sorted(map(str, runs.columns))}",
                               where=where, field="--by")
    by_name = ",".join(by)
    configs = ([c.strip() for c in args.configs.split(",") if c.strip()] if args.configs is not None
               else [c for c in CONFIG_COLUMNS if c in runs.columns and c not in by])
    missing = [c for c in configs if c not in runs.columns]
    if missing:
        raise LadderInputError(f"no such column(s) {missing}; the runs have {sorted(map(str, runs.columns))}",
                               where=where, field="--configs")
    diverged = runs[runs["diverged"]]
    runs = runs[~runs["diverged"]]
    bits = final_doc_bits(uri, [str(r) for r in runs["run_id"]])
    without = [r for r, b in bits.items() if b is None]
    if without:
        print(f"{len(without)} of {len(runs)} runs have no per-document bits in their eval.json (trained before the "
              "final eval kept them) and are left out", file=sys.stderr)
    if len(diverged):
        print(f"{len(diverged)} diverged runs left out", file=sys.stderr)
    runs = runs[runs["run_id"].astype(str).map(lambda r: bits.get(r) is not None)]
    if runs.empty:
        raise LadderInputError("no run has per-document bits to split (the final eval keeps them in eval.json: "
                               "rerun the trials with this version)", where=where)
    splits: list[dict[str, Any]] = []
    for value, part in runs.groupby(by, sort=True):
        labels = [tuple(row) for row in part[configs].astype(str).itertuples(index=False)] if configs else None
        values = [v.item() if hasattr(v, "item") else v for v in value]
        entry: dict[str, Any] = {"by": values[0] if len(by) == 1 else values, "runs": len(part),
                                 "configurations": len(set(labels)) if labels else 1}
        try:
            result = split_runs([bits[str(r)] for r in part["run_id"]], labels)
        except ValueError as err:
            entry["not_split"] = str(err)
        else:
            entry["domains"] = {d: {"seeds": h.seeds, "documents": h.documents, "sd_total": h.sd_total,
                                    "sd_model": None if math.isnan(h.sd_model) else h.sd_model,
                                    "sd_documents": h.sd_documents, "documents_share": h.documents_share,
                                    "sd_with_more_documents": h.sd_with_documents(args.more_documents)}
                                for d, h in result.items()}
        splits.append(entry)
    payload = {"experiment": args.experiment, "tracking_uri": uri, "by": by_name, "configs": configs,
               "more_documents": args.more_documents, "splits": splits, "runs_without_doc_bits": without}
    if args.plot:
        from fits.heldout_plots import plot_heldout_split

        try:
            plot_heldout_split(splits, args.more_documents, by=by_name, path=args.plot)
        except ValueError as err:
            raise LadderInputError(str(err), where=where, field="--plot") from None
        payload["plot"] = args.plot
    if not args.no_log:
        metrics = {f"{split_label(by_name, s['by'], '_')}/{d}/{k}": v for s in splits for d, cell in s.get("domains", {}).items()
                   for k, v in cell.items() if k in ("sd_total", "sd_model", "sd_documents", "documents_share")
                   and v is not None}
        options = {"by": by_name, "configs": ",".join(configs), "more_documents": args.more_documents}
        payload["mlflow_fit_run_id"] = log_fit_run(uri, args.experiment, command="heldout", payload=payload,
                                                   source_run_ids=[str(r) for r in runs["run_id"]], options=options,
                                                   metrics=metrics)
    if args.json:
        print_json(payload)
        return 0
    k = f"{args.more_documents:g}"
    for s in splits:
        title = (f"{split_label(by_name, s['by'])}: one seed's sd of log BPB, {s['runs']} run"
                 f"{'s' if s['runs'] > 1 else ''} in {s['configurations']} "
                 f"configuration{'s' if s['configurations'] > 1 else ''}")
        if "not_split" in s:
            print(f"{title}: not split: {s['not_split']}", file=sys.stderr)
            continue
        rows = [[d, c["documents"], f"{100 * c['sd_total']:.3f}%",
                 "-" if c["sd_model"] is None else f"{100 * c['sd_model']:.3f}%", f"{100 * c['sd_documents']:.3f}%",
                 f"{c['documents_share']:.0%}", f"{100 * c['sd_with_more_documents']:.3f}%"]
                for d, c in s["domains"].items()]
        stdout_console.print(make_table(title, ["domain", "documents", "seed noise", "models", "documents",
                                                "documents' share", f"with {k}× documents"], rows))
    return 0
