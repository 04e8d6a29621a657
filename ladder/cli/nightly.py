"""`ladder nightly SPEC [--baseline FILE] [--update-baseline] [--json]`: exit 1 on a regression.

Throughput from a golden of another machine class is "not comparable", never a regression (ladder.run.nightly)."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from ladder.errors import LadderInputError
from ladder.run.nightly import GOLDENS_DIR, build_golden, compare, load_golden, run_repeats
from ladder.run.nightly_report import write_report
from ladder.cli.output import check_writable, make_table, print_json, progress_line, stdout_console
from sweeps.spec import load_spec, resolve_spec_path

DEFAULT_REPEATS = 2  # runs a new baseline measures: the fewest with a spread


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("nightly", help="run the nightly rung regression; exit 1 on a regression")
    p.add_argument("spec", help="sweep spec: a name or a path (the shipped one: nightly)")
    p.add_argument("--baseline", help="golden file (default: sweeps/goldens/<spec name>.json)")
    p.add_argument("--update-baseline", action="store_true",
                   help="measure --repeats runs and write the golden file with tolerances from their spread")
    p.add_argument("--repeats", type=int, default=None,
                   help=f"runs measured by --update-baseline, at least 2 (default {DEFAULT_REPEATS}); only with "
                        f"--update-baseline")
    p.add_argument("--address", help="Ray cluster address (default: a private local Ray)")
    p.add_argument("--out", help="where runs and the report go (default: runs/nightly)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    # Before anything is read or run: --repeats is the number of runs a new baseline measures.
    if args.repeats is not None and args.repeats < 2:
        raise LadderInputError(f"tolerances come from the spread of repeats; use at least 2, got {args.repeats}",
                               field="--repeats")
    if args.repeats is not None and not args.update_baseline:
        raise LadderInputError("sets how many runs --update-baseline measures; a nightly check runs the spec once: "
                               "leave it out, or add --update-baseline", field="--repeats")
    repeats = args.repeats if args.repeats is not None else DEFAULT_REPEATS
    path = resolve_spec_path(args.spec)
    spec = load_spec(path)
    baseline = Path(args.baseline) if args.baseline else GOLDENS_DIR / f"{spec.name}.json"
    root = Path(args.out or "runs/nightly").resolve()
    # Before Ray starts: the runs, the report and a new golden must be writable where they are to go.
    check_writable(root, flag="--out" if args.out else "--out (default runs/nightly)", kind="directory")
    if args.update_baseline:
        check_writable(baseline, flag="--baseline" if args.baseline else f"--baseline (default {baseline})",
                        kind="file")
        runs, machine = run_repeats(spec, where=str(path), root=root, repeats=repeats, address=args.address,
                                    progress=progress_line)
        from provenance import code_version

        golden = build_golden(spec, runs, machine)
        golden["code_version"] = code_version()  # the golden is only as current as the code it measured
        baseline.parent.mkdir(parents=True, exist_ok=True)
        baseline.write_text(json.dumps(golden, indent=2, sort_keys=True) + "\n")
        progress_line(f"nightly: wrote {baseline} (tolerances {golden['tolerances']})")
        if args.json:
            print_json({"baseline": str(baseline), **golden})
        return 0
    golden = load_golden(baseline)  # a missing golden file is bad input: fail before running anything
    runs, machine = run_repeats(spec, where=str(path), root=root, repeats=1, address=args.address,
                                progress=progress_line)
    report = compare(golden, runs[0], spec.name, machine)
    report_path = write_report(report, golden, root / f"report-{time.strftime('%Y%m%d-%H%M%S')}")
    progress_line(f"nightly: report at {report_path}")
    if args.json:
        print_json({**report.to_json(), "report": str(report_path), "baseline": str(baseline)})
    else:
        rows = [[c.trial, c.metric, c.golden, c.current, c.tolerance, c.verdict] for c in report.comparisons]
        for note in report.notes:
            stdout_console.print(note)
        stdout_console.print(make_table(f"nightly {spec.name}: {'PASS' if not report.regressions else 'FAIL'}",
                                        ["name", "metric", "golden", "tonight", "tolerance", "verdict"], rows))
    return 1 if report.regressions else 0
