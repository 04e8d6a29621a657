"""Train several rungs of a recipe side by side as plain processes and write one JSON line each.

A diagnostic for questions like "does the BPB-vs-FLOPs curve straighten at a higher TPP?": no Ray,
no MLflow (tracking off), one process per (rung, TPP) pair, on this machine's CPU cores or its GPU.
It needs only torch, pydantic, PyYAML, numpy and tokenizers, so it also runs on a bare GPU machine.

    python scripts/ladder_probe.py cpu-demo --rungs 2,3,4,5,6 --tpp 5,20 --device cuda \
        --out probe.jsonl --deadline-s 480

Each line: rung, tpp, steps, tokens, train_flops, wall_seconds, cpu_seconds (process CPU time), held-out
BPB per domain and their mean; a job still running at the deadline is killed and written with its
last logged step (`pandas.read_json(path, lines=True)` reads the file). docs/backtest_diagnosis/ holds what it measured.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def with_unique_fraction(config: dict, source: str, fraction: float) -> dict:
    """The config with `source`'s unique cap at `fraction` of its full-scale unique tokens, its tokens
    unchanged (so its epochs change): separates what a rung gains from seeing more distinct documents
    of a source from what it gains from compute."""
    if source not in config["sources"]:
        raise SystemExit(f"--unique-fraction: no source {source!r} (have {sorted(config['sources'])})")
    if not 0 < fraction <= 1:
        raise SystemExit(f"--unique-fraction: {source}={fraction:g} is not in (0, 1]")
    entry = dict(config["sources"][source])
    full_unique = entry["unique_tokens"] / entry["unique_fraction"]
    entry["unique_tokens"] = full_unique * fraction
    entry["epochs"] = entry["tokens"] / entry["unique_tokens"]
    entry["unique_fraction"] = fraction
    return {**config, "sources": {**config["sources"], source: entry}}


def _worker(recipe: str, L: int, tpp: float, device: str, work: Path, extra: list[str],
            unique_fractions: list[str]) -> None:
    import logging

    import torch
    import torch.nn.functional as F

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")

    if not hasattr(F, "grouped_mm") and hasattr(torch, "_grouped_mm"):  # torch < 2.10
        F.grouped_mm = torch._grouped_mm
    from ladder.plan.resolve import resolve_train_config
    from rungs.train import train

    overrides = [f"tpp={tpp}", f"device={device}", f"data_cache_root={work / 'data'}", *extra]
    config = resolve_train_config(recipe, L, overrides)
    config["tracking_uri"] = None
    for item in unique_fractions:
        source, _, fraction = item.partition("=")
        config = with_unique_fraction(config, source, float(fraction))
    # Process CPU seconds of the training call (every thread of this process): the machine is shared,
    # so wall time says little about an idle run, and CPU time is what a core would spend on it.
    cpu_start_seconds = time.process_time()
    res = train(config, run_dir=work / f"L{L}-tpp{tpp:g}", resume=False, progress=False)
    cpu_seconds = time.process_time() - cpu_start_seconds
    out = {"rung": L, "tpp": tpp, "steps": res.steps, "tokens": res.tokens, "train_flops": res.train_flops,
           "wall_seconds": res.wall_seconds, "cpu_seconds": cpu_seconds, "tokens_per_second": res.tokens_per_second,
           "diverged": res.diverged, "bpb": res.bpb, "lr": config["lr"], "weight_decay": config["weight_decay"],
           "batch_sequences": config["batch_sequences"], "params_active": config["params_active"],
           "bpb_mean": sum(res.bpb.values()) / len(res.bpb) if res.bpb else None}
    print("RESULT " + json.dumps(out), flush=True)


def first_job_config(recipe: str, rungs: list[int], tpps: list[float], work: Path) -> dict:
    """The resolved config of the first job, to prepare the corpus with. At the job's own TPP: the
    recipe's default TPP can put a big rung over the full-scale token budget."""
    from ladder.plan.resolve import resolve_train_config

    return resolve_train_config(recipe, rungs[0], [f"tpp={tpps[0]}", f"data_cache_root={work / 'data'}"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("recipe")
    ap.add_argument("--rungs", default="2,3,4,5,6")
    ap.add_argument("--tpp", default="5")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--set", dest="extra", action="append", default=[], help="config override for every job")
    ap.add_argument("--unique-fraction", action="append", default=[], metavar="SOURCE=F",
                    help="cap SOURCE's unique data at F of its full-scale unique tokens (tokens unchanged)")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--work", type=Path, default=Path("/tmp/ladder_probe"))
    ap.add_argument("--deadline-s", type=float, default=3600.0)
    ap.add_argument("--jobs", type=int, default=0, help="processes at once (default: all)")
    ap.add_argument("--worker", nargs=2, metavar=("L", "TPP"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    if args.worker:
        _worker(args.recipe, int(args.worker[0]), float(args.worker[1]), args.device, args.work, args.extra,
                args.unique_fraction)
        return

    # Prepare the corpus once before the jobs start, so they do not queue on its lock.
    from rungs.data.prepare import ensure_prepared

    rungs = [int(x) for x in args.rungs.split(",")]
    tpps = [float(x) for x in args.tpp.split(",")]
    first = first_job_config(args.recipe, rungs, tpps, args.work)
    ensure_prepared(first["data_manifest"], vocab_size=first["vocab_size"], cache_root=Path(first["data_cache_root"]))

    # Largest jobs first: they set the wall clock.
    pending = sorted(((L, t) for t in tpps for L in rungs), key=lambda p: -(p[0] ** 3 * p[1]))
    limit = args.jobs or len(pending)
    running: dict[tuple[int, float], tuple[subprocess.Popen, Path]] = {}
    start = time.monotonic()
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    with args.out.open("w") as out:
        last_report = 0.0
        while pending or running:
            while pending and len(running) < limit:
                L, t = pending.pop(0)
                log = args.work / f"L{L}-tpp{t:g}.log"
                cmd = [sys.executable, __file__, args.recipe, "--device", args.device, "--work", str(args.work),
                       "--out", "/dev/null", "--worker", str(L), str(t)] + [f"--set={e}" for e in args.extra]
                cmd += [f"--unique-fraction={u}" for u in args.unique_fraction]
                running[(L, t)] = (subprocess.Popen(cmd, stdout=log.open("w"), stderr=subprocess.STDOUT, env=env), log)
            for key, (proc, log) in list(running.items()):
                if proc.poll() is None and time.monotonic() - start < args.deadline_s:
                    continue
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
                lines = log.read_text().splitlines()
                found = [ln[7:] for ln in lines if ln.startswith("RESULT ")]
                if found:
                    out.write(found[-1] + "\n")
                else:
                    steps = [ln for ln in lines if "step " in ln]
                    out.write(json.dumps({"rung": key[0], "tpp": key[1], "failed": True, "rc": proc.returncode,
                                          "last_step_line": steps[-1] if steps else None,
                                          "tail": lines[-15:]}) + "\n")
                out.flush()
                print(f"[{time.monotonic() - start:6.0f}s] L{key[0]} tpp {key[1]:g}: "
                      + (found[-1] if found else f"no result (rc {proc.returncode}): {lines[-1:] }"), flush=True)
                del running[key]
            if time.monotonic() - last_report > 30:
                last_report = time.monotonic()
                for (L, t), (_, log) in sorted(running.items()):
                    steps = [ln for ln in log.read_text().splitlines() if "step " in ln]
                    print(f"[{last_report - start:6.0f}s] L{L} tpp {t:g}: {steps[-1][-110:] if steps else 'starting'}",
                          flush=True)
            time.sleep(1)


if __name__ == "__main__":
    main()
