"""The same science in both engines: the PyTorch and JAX jobs, each from its own seeds, at cpu-demo L3.

Every seed trains the rung twice, `backend=torch` and `backend=jax` (what `ladder train cpu-demo
--rung 3 --set backend=... --set seed=S` runs, one thread, the whole final evaluation), and the final
held-out BPB of every domain (and their mean) is compared across the seeds: the gap between the two
engines' means over its standard error, sqrt(sd_torch²/n + sd_jax²/n) from the seeds' sample
standard deviations. Check: |gap| ≤ 2 standard errors in every domain. The paired gap (a seed fixes the
token stream of both engines, so the pair differs only in the initial draw) is reported beside it.
The first `--same-init-seeds` seeds also train the JAX job from the PyTorch job's initial weights:
the engines' agreement from one draw (check: mean held-out BPB within 0.004; each domain's difference
is reported, a few hundred float32 steps amplify summation order in single domains to ~0.01).

The initial draws are summarised too (results.init): per role, pooled over seeds and layers, the
sample std over the policy's (`rungs.architecture.init_std`), excess kurtosis and the largest |x|/std,
for each engine (the tensor-by-tensor test is tests/rungs/jaxjob/test_init_distribution.py).

--quick: cpu-demo L2, 40 steps, one seed, 4 documents per domain, the same-init check only (a gap
over one seed has no standard error). Full (the measurement): L3, the rung's 382 steps, 5 seeds,
~15 minutes of CPU. Other settings: `--rung`, `--steps`, `--seeds`, `--eval-docs`, `--same-init-seeds`.
CPU seconds per run are process CPU time (all threads), which other jobs on the machine do not inflate.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from benchmarks.common import Report, print_report

RECIPE = "cpu-demo"
GAP_TARGET_SE = 2.0
SAME_INIT_TARGET_MEAN_BPB = 0.004
# Parameter roles by name suffix, for the init summary (the model's own names).
ROLES = {"embed": ("embed.weight",), "lm_head": ("lm_head.weight",),
         "attn_qkv": ("attn.wq.weight", "attn.wk.weight", "attn.wv.weight"), "attn_out": ("attn.wo.weight",),
         "router": ("moe.router.weight",), "experts_gate_up": ("experts.w_gate", "experts.w_up"),
         "experts_down": ("experts.w_down",), "shared_gate_up": ("shared.w_gate.weight", "shared.w_up.weight"),
         "shared_down": ("shared.w_down.weight",), "latent": ("latent_down.weight", "latent_up.weight")}


@dataclass(frozen=True)
class Settings:
    rung: int
    steps: int | None  # None: the rung's planned steps
    seeds: tuple[int, ...]
    eval_docs: int | None  # documents per domain in the final evaluation (None: all)
    same_init_seeds: int
    check_gaps: bool


QUICK = Settings(rung=2, steps=40, seeds=(0,), eval_docs=4, same_init_seeds=1, check_gaps=False)
FULL = Settings(rung=3, steps=None, seeds=(0, 1, 2, 3, 4), eval_docs=None, same_init_seeds=1, check_gaps=True)


def _config(s: Settings, seed: int, backend: str):
    from ladder.plan.resolve import resolve_train_config
    from rungs.config import parse_config

    overrides = {"seed": seed, "backend": backend, "tracking_uri": None, "threads": 1}
    if s.steps is not None:
        overrides["max_steps"] = s.steps
    if s.eval_docs is not None:
        overrides["final_eval_max_docs_per_domain"] = s.eval_docs
    return parse_config(resolve_train_config(RECIPE, s.rung, overrides))


def _train(cfg, engine, run_dir: Path) -> tuple[dict[str, float], float]:
    """Final BPB per domain of one job, and its process CPU seconds."""
    from rungs.loop import run_job
    from rungs.torch_engine import lr_schedule

    run_dir.mkdir(parents=True)
    t0 = time.process_time()
    result = run_job(cfg, engine, run_dir=run_dir, lr_multiplier=lr_schedule(cfg), resume=False, progress=False)
    if result.diverged or not result.bpb:
        raise RuntimeError(f"{run_dir.name}: the run diverged or has no final BPB")
    return dict(result.bpb), time.process_time() - t0


def _torch_init(cfg) -> tuple[dict, dict]:
    """The torch job's initial weights for cfg's seed, as JAX (params, buffers)."""
    from rungs.jaxjob.params import from_torch_state_dict
    from rungs.torch_engine import TorchEngine

    engine = TorchEngine(cfg)
    engine.build()
    return from_torch_state_dict(engine.model.state_dict(), cfg.architecture())


def train_all(s: Settings, root: Path) -> dict:
    from rungs.jaxjob.engine import JaxEngine
    from rungs.jaxjob.train import enable_compilation_cache
    from rungs.torch_engine import TorchEngine

    enable_compilation_cache(root / "jax_cache")  # one compiled step for every seed
    runs: dict[str, dict[int, dict[str, float]]] = {"torch": {}, "jax": {}, "jax_from_torch_init": {}}
    cpu: dict[str, list[float]] = {k: [] for k in runs}
    for i, seed in enumerate(s.seeds):
        cfg = _config(s, seed, "torch")
        runs["torch"][seed], sec = _train(cfg, TorchEngine(cfg), root / f"torch-s{seed}")
        cpu["torch"].append(sec)
        cfg = _config(s, seed, "jax")
        runs["jax"][seed], sec = _train(cfg, JaxEngine(cfg), root / f"jax-s{seed}")
        cpu["jax"].append(sec)
        if i < s.same_init_seeds:
            init = _torch_init(_config(s, seed, "torch"))
            runs["jax_from_torch_init"][seed], sec = _train(cfg, JaxEngine(cfg, initial_params=init),
                                                            root / f"same-s{seed}")
            cpu["jax_from_torch_init"].append(sec)
        sys.stderr.write(f"engine_seeds: seed {seed}: torch {_mean(runs['torch'][seed]):.4f}, "
                         f"jax {_mean(runs['jax'][seed]):.4f}\n")
    return {"runs": runs, "cpu_seconds": {k: [round(v, 1) for v in vs] for k, vs in cpu.items()}}


def _mean(bpb: dict[str, float]) -> float:
    return statistics.fmean(bpb.values())


def compare(torch_runs: dict[int, dict[str, float]], jax_runs: dict[int, dict[str, float]]) -> dict[str, dict]:
    """Per domain (and "mean", over domains): both engines' mean and sd over seeds, the gap
    (jax - torch), its standard error and gap/se, unpaired and paired by seed."""
    seeds = sorted(torch_runs)
    domains = sorted(torch_runs[seeds[0]])
    table = {d: ([torch_runs[s][d] for s in seeds], [jax_runs[s][d] for s in seeds]) for d in domains}
    table["mean"] = ([_mean(torch_runs[s]) for s in seeds], [_mean(jax_runs[s]) for s in seeds])
    out = {}
    for d, (t, j) in table.items():
        n = len(seeds)
        row = {"torch_mean": statistics.fmean(t), "jax_mean": statistics.fmean(j)}
        row["gap"] = row["jax_mean"] - row["torch_mean"]
        if n > 1:
            row |= {"torch_sd": statistics.stdev(t), "jax_sd": statistics.stdev(j)}
            row["se"] = math.sqrt((row["torch_sd"] ** 2 + row["jax_sd"] ** 2) / n)
            row["gap_over_se"] = row["gap"] / row["se"]
            paired_se = statistics.stdev([b - a for a, b in zip(t, j)]) / math.sqrt(n)
            row |= {"paired_se": paired_se, "paired_gap_over_se": row["gap"] / paired_se}
        out[d] = row
    return out


def init_summary(s: Settings) -> dict[str, dict[str, dict[str, float]]]:
    """Per engine and role: the draws pooled over seeds and layers, std over the policy's, excess
    kurtosis, largest |x| in policy stds, and how many values."""
    import jax
    import torch

    from rungs.architecture import init_std
    from rungs.jaxjob.params import init_params
    from rungs.model import Transformer

    arch = _config(s, 0, "torch").architecture()
    pooled: dict[str, dict[str, list[np.ndarray]]] = {"torch": {}, "jax": {}}
    for seed in s.seeds:
        torch.manual_seed(seed)
        drawn = {"torch": {n: p.detach().double().numpy() for n, p in Transformer(arch).named_parameters()},
                 "jax": {n: np.asarray(a, np.float64) for n, a in init_params(arch, jax.random.PRNGKey(seed)).items()}}
        for engine, tensors in drawn.items():
            for name, x in tensors.items():
                role = next((r for r, suffixes in ROLES.items() if name.endswith(suffixes)), None)
                if role is not None:
                    pooled[engine].setdefault(role, []).append(x.ravel() / init_std(name, arch))
    out: dict[str, dict[str, dict[str, float]]] = {}
    for engine, roles in pooled.items():
        out[engine] = {}
        for role, parts in roles.items():
            z = np.concatenate(parts)
            out[engine][role] = {"std_over_policy": float(z.std()), "excess_kurtosis": float((z**4).mean() / z.var()**2 - 3),
                                 "max_abs_over_policy": float(np.abs(z).max()), "values": int(z.size)}
    return out


def run(quick: bool, settings: Settings | None = None) -> Report:
    s = settings or (QUICK if quick else FULL)
    report = Report("engine_seeds")
    with tempfile.TemporaryDirectory() as tmp:
        measured = train_all(s, Path(tmp))
    runs = measured["runs"]
    report.results = {"recipe": RECIPE, "rung": s.rung, "steps": s.steps, "seeds": list(s.seeds),
                      "final_eval_docs_per_domain": s.eval_docs, **measured,
                      "compare": compare(runs["torch"], runs["jax"]), "init": init_summary(s)}
    if s.check_gaps:
        for d, row in report.results["compare"].items():
            report.check(f"{d}_gap_over_se", abs(row["gap_over_se"]), "<=", GAP_TARGET_SE)
    same_init = runs["jax_from_torch_init"]
    if same_init:
        report.results["same_init_max_abs_domain_bpb_diff"] = max(
            abs(same_init[seed][d] - runs["torch"][seed][d]) for seed in same_init for d in runs["torch"][seed])
        worst_mean = max(abs(_mean(same_init[seed]) - _mean(runs["torch"][seed])) for seed in same_init)
        report.check("same_init_mean_abs_bpb_diff", worst_mean, "<=", SAME_INIT_TARGET_MEAN_BPB)
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.engine_seeds", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="L2, 40 steps, one seed: the contract, not the numbers")
    parser.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    parser.add_argument("--rung", type=int, help="cpu-demo rung (default 3; quick 2)")
    parser.add_argument("--steps", type=int, help="steps per run (default: the rung's plan)")
    parser.add_argument("--seeds", type=int, help="seeds 0..N-1 per engine (default 5; quick 1)")
    parser.add_argument("--eval-docs", type=int, help="documents per domain in the final evaluation (default all)")
    parser.add_argument("--same-init-seeds", type=int, help="seeds also run as JAX from the torch init (default 1)")
    args = parser.parse_args(argv)
    base = QUICK if args.quick else FULL
    seeds = tuple(range(args.seeds)) if args.seeds else base.seeds
    if (args.seeds is not None and args.seeds < 1) or (args.rung is not None and args.rung < 1):
        parser.error("--seeds and --rung must be at least 1")
    s = Settings(rung=args.rung or base.rung, steps=args.steps if args.steps else base.steps, seeds=seeds,
                 eval_docs=args.eval_docs or base.eval_docs,
                 same_init_seeds=base.same_init_seeds if args.same_init_seeds is None else args.same_init_seeds,
                 check_gaps=len(seeds) > 1)
    print_report(run(args.quick, s), quick=args.quick, as_json=args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
