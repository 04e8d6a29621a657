"""`ladder data curate MANIFEST --out DIR`: tag every training document (duplicate clusters, topics,
semantic duplicates and diversity weights, quality scores) without changing the corpus;
`ladder data mix DIR --rules RULES.yaml --out ARM_DIR`: an arm (a manifest of the kept documents) from the
attributes and rules; `ladder data inspect DIR --removed STEP -n 5`: documents a step removed.

Exit 2 with one line naming the file and field on bad input (a bad rule, a rule whose tagger did not run, an
--out that is not the command's own directory, a tagger setting other than the one --out was tagged with).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from ladder.cli.output import make_table, print_json, stdout_console
from ladder.errors import LadderInputError
from rungs.data.errors import DataInputError


def register(data_sub: argparse._SubParsersAction) -> None:
    c = data_sub.add_parser("curate", help="tag training documents: duplicate clusters, topics, quality (resumable)",
                            description="Tag training documents into --out (resumable). A tagger's settings are "
                                        "fixed for --out once it has begun there: a rerun keeps those it is not "
                                        "given, and refuses other values (they need a new --out).")
    c.add_argument("manifest", help="corpus manifest YAML, or 'demo' for the shipped demo corpus")
    c.add_argument("--out", required=True, help="the curation directory (new, empty, or one this command wrote)")
    c.add_argument("--taggers", default=None,
                   help="comma-separated taggers: exact, near, topics, semantic, quality (default: all that can run; "
                        "quality needs --quality-model or --quality-positive/--quality-negative)")
    c.add_argument("--workers", type=int, default=1, help="Ray workers (default 1: in this process); the attributes "
                                                          "are the same for any number")
    c.add_argument("--address", default=None, help="a Ray cluster to run the workers on (e.g. ray://head:10001)")
    # The tagger settings default to None (not given): the values --out was tagged with, else the defaults
    # named in the help. A tagger's settings are fixed once it has begun in --out; another value needs a new one.
    c.add_argument("--bands", type=int, default=None, help="MinHash LSH bands (default 14)")
    c.add_argument("--rows", type=int, default=None, help="MinHash rows per band (default 8)")
    c.add_argument("--jaccard", type=float, default=None,
                   help="exact Jaccard of word 5-gram sets at which a candidate pair is a near duplicate (default 0.7)")
    c.add_argument("--topics", type=int, default=None, help="topic buckets (default: one per ~50 documents, <= 100)")
    c.add_argument("--semantic-eps", type=float, default=None,
                   help="semantic duplicates: cosine >= 1 - eps, eps in [0, 2) (default 0.01)")
    c.add_argument("--quality-positive", default="",
                   help="comma-separated sources the quality classifier learns as good (with --quality-negative)")
    c.add_argument("--quality-negative", default="",
                   help="comma-separated sources it learns as the rest (with --quality-positive; no source on both)")
    c.add_argument("--quality-model", default=None,
                   help="a saved quality classifier directory to score with instead (without the two above)")
    c.add_argument("--json", action="store_true", help="print one JSON object")
    c.set_defaults(handler=run_curate, on_interrupt="rerun the same command to resume: finished tasks are kept")
    m = data_sub.add_parser("mix", help="write an arm: a manifest of the documents the rules keep (no tagger reruns)")
    m.add_argument("dir", help="a directory written by `ladder data curate`")
    m.add_argument("--rules", required=True, help="rules YAML (exact_duplicates, near_duplicates, semantic_duplicates, "
                                                 "quality, diversity)")
    m.add_argument("--out", required=True, help="the arm directory (new, empty, or one this command wrote)")
    m.add_argument("--json", action="store_true", help="print one JSON object")
    m.set_defaults(handler=run_mix)
    inspect = data_sub.choices.get("inspect")
    if inspect is not None:
        inspect.add_argument("--removed", metavar="STEP", default=None,
                             help="with a curation directory (exact, near, semantic) or an arm (one of its rules): "
                                  "show documents that step removed, each with the document its cluster kept")
        inspect.add_argument("-n", type=int, default=5, help="documents shown with --removed (default 5)")
        inspect.set_defaults(handler=partial_inspect(inspect.get_default("handler")))


def partial_inspect(prepared_handler):
    def handler(args: argparse.Namespace) -> int:
        return run_removed(args) if args.removed else prepared_handler(args)

    return handler


def _sources(value: str) -> tuple[str, ...]:
    return tuple(s.strip() for s in value.split(",") if s.strip())


def run_curate(args: argparse.Namespace) -> int:
    from curation.model_taggers import ModelOptions
    from curation.pipeline import plan_curation
    from curation.quality import QualityModel
    from ladder.run.curate import run_curation
    from rungs.data.manifest import DEMO_MANIFEST

    t0 = time.perf_counter()
    for flag, value, low in (("--workers", args.workers, 1), ("--bands", args.bands, 1), ("--rows", args.rows, 1),
                             ("--topics", args.topics, 1)):
        if value is not None and value < low:
            raise LadderInputError(f"must be at least {low}, got {value}", field=flag)
    if args.jaccard is not None and not 0 < args.jaccard <= 1:
        raise LadderInputError(f"must be in (0, 1], got {args.jaccard}", field="--jaccard")
    if args.semantic_eps is not None and not 0 <= args.semantic_eps < 2:  # NaN included
        raise LadderInputError(f"must be in [0, 2) (semantic duplicates have cosine >= 1 - eps), got "
                               f"{args.semantic_eps}", field="--semantic-eps")
    if args.quality_model is not None:
        try:
            QualityModel.load(args.quality_model)
        except DataInputError as err:
            raise LadderInputError(err.detail, where=err.where, field="--quality-model") from None
    options = ModelOptions(n_topics=args.topics, semantic_eps=args.semantic_eps,
                           quality_positive=_sources(args.quality_positive),
                           quality_negative=_sources(args.quality_negative), quality_model=args.quality_model)
    manifest = DEMO_MANIFEST if args.manifest == "demo" else Path(args.manifest)
    try:
        # every flag against the settings --out was tagged with (those not passed take them), before any work
        taggers, lsh, options = plan_curation(manifest, Path(args.out), taggers=args.taggers, bands=args.bands,
                                              rows=args.rows, threshold=args.jaccard, model_options=options)
        report = run_curation(manifest, Path(args.out), taggers=taggers, workers=args.workers, address=args.address,
                              lsh=lsh, model_options=options)
    except DataInputError as err:
        raise LadderInputError(err.detail, where=err.where or args.manifest, field=err.field) from None
    report["wall_seconds"] = time.perf_counter() - t0
    if args.json:
        print_json(report)
        return 0
    steps = list(report["steps"])
    rows = []
    for name, s in report["sources"].items():
        cells = [name, s["docs"], s["bytes"]]
        for step in steps:
            r = report["steps"][step][name]
            cells += [r["docs_removed"], r["bytes_removed"]]
        rows.append(cells)
    columns = ["source", "docs", "bytes"] + [f"{s} {w}" for s in steps for w in ("docs", "bytes")]
    stdout_console.print(make_table(f"ladder data curate → {report['dir']} (what keep_one would remove)", columns, rows))
    for name, t in report["taggers"].items():
        extra = {k: v for k, v in t.items() if k not in ("done", "attributes", "cluster_sizes", "topic_sizes")}
        stdout_console.print(f"{name}: {extra}", highlight=False)
    if report.get("plot"):
        stdout_console.print(f"cluster sizes: {report['plot']}", highlight=False)
    return 0


def run_mix(args: argparse.Namespace) -> int:
    from curation.mix import mix
    from curation.rules import load_rules

    try:
        rules = load_rules(args.rules)
        payload = mix(args.dir, rules, Path(args.out), rules_path=args.rules)
    except DataInputError as err:
        raise LadderInputError(err.detail, where=err.where or args.dir, field=err.field) from None
    if args.json:
        print_json(payload)
        return 0
    rows = [[step["rule"], name, s["docs_in"], s["docs_removed"], s["bytes_in"], s["bytes_removed"]]
            for step in payload["steps"] for name, s in step["sources"].items()]
    rows += [["kept", name, k["docs"], "", k["bytes"], ""] for name, k in payload["kept"].items()]
    stdout_console.print(make_table(f"ladder data mix → {payload['manifest']}",
                                    ["step", "source", "docs in", "docs removed", "bytes in", "bytes removed"], rows))
    return 0


def run_removed(args: argparse.Namespace) -> int:
    from curation.report import removed_samples

    if args.n < 0 or args.chars < 0:
        raise LadderInputError("-n and --chars must be >= 0", field="-n")
    try:
        payload = removed_samples(args.dir, args.removed, args.n, args.chars)
    except DataInputError as err:
        raise LadderInputError(err.detail, where=err.where or args.dir, field=err.field) from None
    if args.json:
        print_json(payload)
        return 0
    stdout_console.print(f"{payload['step']}: {payload['removed']} documents removed in {payload['dir']}; "
                         f"{len(payload['samples'])} shown", highlight=False)
    for s in payload["samples"]:
        stdout_console.print(f"[bold]removed[/bold] {s['source']} {s['id']!r} ({s['bytes']} bytes):", highlight=False)
        stdout_console.print(repr(s["text"]), markup=False, highlight=False)
        kept = s.get("kept")
        if kept:
            stdout_console.print(f"[bold]kept[/bold] {kept['source']} {kept['id']!r} ({kept['bytes']} bytes):",
                                 highlight=False)
            stdout_console.print(repr(kept["text"]), markup=False, highlight=False)
    return 0
