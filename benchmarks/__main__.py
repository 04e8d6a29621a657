"""`python -m benchmarks [--quick] --json`: every benchmark in one JSON object with all checks."""

from __future__ import annotations

import argparse
import importlib
import json
import pkgutil
import sys
from pathlib import Path

import benchmarks
from benchmarks.common import machine_info

NOT_BENCHMARKS = {"common", "__main__", "step_phases", "data_inputs", "gpu_suite", "hlo_buffers"}  # helpers; the GPU runner of the others


def benchmark_names() -> list[str]:
    """The benchmarks `python -m benchmarks` runs, sorted (the package's modules less its helpers)."""
    return sorted(m.name for m in pkgutil.iter_modules([str(Path(benchmarks.__file__).parent)]) if m.name not in NOT_BENCHMARKS)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--only", help="comma-separated benchmark names")
    args = parser.parse_args(argv)
    names = benchmark_names()
    if args.only is not None:
        # refused before anything is timed (the machine's reference matmul takes minutes on some CPUs)
        wanted = [n.strip() for n in args.only.split(",") if n.strip()]
        unknown = [n for n in wanted if n not in names]
        if unknown or not wanted:
            what = f"unknown {','.join(unknown)}" if unknown else f"{args.only!r} names no benchmark"
            parser.exit(2, f"{parser.prog}: error: --only: {what}; the benchmarks are {','.join(names)}\n")
        names = [n for n in names if n in wanted]
    out = {"benchmark": "all", "machine": machine_info(quick=args.quick), "results": {}, "checks": []}
    for name in names:
        module = importlib.import_module(f"benchmarks.{name}")
        sys.stderr.write(f"benchmarks: running {name}{' (quick)' if args.quick else ''}\n")
        report = module.run(args.quick).to_dict(quick=args.quick)
        out["results"][name] = report["results"]
        out["checks"] += [dict(c, name=f"{name}.{c['name']}") for c in report["checks"]]
    if args.json:
        sys.stdout.write(json.dumps(out, indent=2) + "\n")
    else:
        for c in out["checks"]:
            sys.stdout.write(f"[{'ok ' if c['ok'] else 'FAIL'}] {c['name']}: {c['value']:.4g} {c['op']} {c['target']:g}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
