"""Golden losses (#18): the first 20 training losses of the smallest cpu-demo config in deterministic
mode, for the single-process job (`rungs.train.train`) and the sharded job on 2 gloo workers
(`rungs.launch.train_sharded`), against values committed in tests/rungs/goldens/.

A change to the model, the optimizer, the data pipeline or the loop that moves a loss beyond the
tolerance fails here, on either engine, before any sweep is run. If the change is meant to move the
losses, regenerate the file (it records the command, the torch version and the config) and say why
in the commit:

    .venv/bin/python -m tests.rungs.test_golden_losses --update

Tolerances come from measured variation, stored in the file by `--update` ("measured"): a rerun
repeats bit for bit; one intra-op thread against two moves a loss by up to ~1e-4 in fp32 (another
summation order), so another machine's kernels are expected to move it by the same order. The
tolerance is ten times that. Measured against it: a learning rate 1% off moves a loss by 1.5e-2 and
a warm-up one step longer by 0.11 (caught); weight decay 10% off moves the first 20 losses by only
2.7e-4 (not caught: 20 steps see the early trajectory, not every hyperparameter's effect).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import pytest

from ladder.plan.resolve import resolve_train_config
from tests.rungs.train_helpers import DATA_CACHE

GOLDEN = Path(__file__).parent / "goldens" / "cpu_demo_L3_losses.json"
UPDATE_COMMAND = ".venv/bin/python -m tests.rungs.test_golden_losses --update"
RECIPE, RUNG = "cpu-demo", 3
# Everything that decides the losses, spelled out here (not borrowed from shared test helpers), so a
# change to another test's config cannot move the goldens. L3 is cpu-demo's smallest ladder rung; a
# 64-token sequence and a 4-sequence batch (divisible by 2 workers) keep a step well under a second.
OVERRIDES = {"max_steps": 20, "deterministic": True, "seed": 0, "seq_len": 64, "batch_sequences": 4,
             "warmup_steps": 2, "precision": "fp32", "threads": 1, "tracking_uri": None,
             "eval_interval": 1000, "checkpoint_interval": 1000, "eval_max_docs_per_domain": 1,
             "final_eval_max_docs_per_domain": 1}
WORKERS = 2
# 10x the largest thread-count variation measured (see the module docstring and the file's "measured").
TOLERANCE_ABS = 1e-3
# The two engines see the same global batch and all-reduce the loss over it: they agree to ~2e-4 (the
# gradient's all-reduce sums in another order, and Muon's orthogonalisation amplifies that a little
# each step); 10x that.
ENGINES_AGREE_ABS = 2e-3


def golden_config(threads: int = 1) -> dict:
    return resolve_train_config(RECIPE, RUNG, {**OVERRIDES, "threads": threads, "data_cache_root": str(DATA_CACHE)})


def single_process_losses(run_dir: Path, threads: int = 1) -> list[float]:
    from rungs.train import train

    return train(golden_config(threads), run_dir=run_dir, progress=False).losses


def _sharded_job(rank: int, world: int, cfg: dict, run_dir: Path, out: Path) -> None:
    from rungs.launch import train_sharded

    losses = train_sharded(cfg, run_dir=run_dir).losses
    if rank == 0:
        out.write_text(json.dumps(losses))


def two_worker_losses(work_dir: Path, threads: int = 1) -> list[float]:
    from tests.rungs.dist.spawn import run_ranks

    out = work_dir / "losses.json"
    run_ranks(_sharded_job, WORKERS, golden_config(threads), work_dir / "run", out)
    return json.loads(out.read_text())


def max_abs_diff(a: list[float], b: list[float]) -> float:
    assert len(a) == len(b), (len(a), len(b))
    return max(abs(x - y) for x, y in zip(a, b))


def _assert_matches(name: str, got: list[float], golden: dict) -> None:
    import torch

    want = golden[name]
    assert len(got) == len(want) == OVERRIDES["max_steps"]
    diffs = [g - w for g, w in zip(got, want)]
    worst = max(range(len(diffs)), key=lambda i: abs(diffs[i]))
    assert abs(diffs[worst]) <= TOLERANCE_ABS, (
        f"{name}: loss at step {worst + 1} is {got[worst]:.6f}, golden {want[worst]:.6f} "
        f"(off by {diffs[worst]:+.2e}, tolerance {TOLERANCE_ABS:g}); golden made with torch {golden['torch']}, "
        f"now {torch.__version__}. If the change is intended: {UPDATE_COMMAND}\nper-step differences: "
        + ", ".join(f"{d:+.1e}" for d in diffs))


@pytest.fixture(scope="module")
def golden() -> dict:
    return json.loads(GOLDEN.read_text())


@pytest.fixture(scope="module")
def single(tmp_path_factory) -> list[float]:
    return single_process_losses(tmp_path_factory.mktemp("single"))


@pytest.fixture(scope="module")
def sharded(tmp_path_factory) -> list[float]:
    return two_worker_losses(tmp_path_factory.mktemp("sharded"))


def test_golden_file_records_how_it_was_made(golden):
    assert golden["config"] == {"recipe": RECIPE, "rung": RUNG, "overrides": OVERRIDES, "workers": WORKERS}, (
        f"the test's config changed since the goldens were made: {UPDATE_COMMAND}")
    assert golden["command"] == UPDATE_COMMAND and golden["torch"]
    assert golden["tolerance_abs"] == TOLERANCE_ABS and golden["engines_agree_abs"] == ENGINES_AGREE_ABS
    measured = golden["measured"]
    # The tolerance stays ~10x above the variation that was measured when the goldens were made.
    assert measured["rerun_max_abs_diff"] <= TOLERANCE_ABS / 10
    assert measured["threads_1_vs_2_max_abs_diff"] <= TOLERANCE_ABS / 5
    assert measured["single_vs_two_workers_max_abs_diff"] <= ENGINES_AGREE_ABS / 5


def test_single_process_job_reproduces_the_golden_losses(single, golden):
    _assert_matches("single_process", single, golden)


def test_two_gloo_workers_reproduce_the_golden_losses(sharded, golden):
    _assert_matches("two_gloo_workers", sharded, golden)


def test_single_process_and_two_workers_agree_on_the_same_global_batch(single, sharded):
    """The sharded job splits one global batch over its workers and all-reduces the loss: it trains
    the same model on the same tokens, so its losses are the single-process ones up to summation order."""
    assert max_abs_diff(single, sharded) <= ENGINES_AGREE_ABS
    assert single[-1] < single[0] - 1.0  # and they are a run that learns, not a constant


def update() -> dict:
    """Measure both engines (and the variation the tolerances rest on) and write the golden file."""
    import torch

    from ladder.machine import machine_info
    # Through the module's import name, not __main__: gloo workers unpickle the job function by name.
    from tests.rungs import test_golden_losses as this

    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        single = this.single_process_losses(root / "single-1")
        rerun = this.single_process_losses(root / "single-1-again")
        two_threads = this.single_process_losses(root / "single-2", threads=2)
        sharded = this.two_worker_losses(_fresh(root / "sharded-1"))
        sharded_rerun = this.two_worker_losses(_fresh(root / "sharded-1-again"))
        sharded_two_threads = this.two_worker_losses(_fresh(root / "sharded-2"), threads=2)
    golden = {
        "about": "First 20 training losses of cpu-demo L3 in deterministic mode; read by "
                 "tests/rungs/test_golden_losses.py, which explains the tolerances.",
        "command": UPDATE_COMMAND,
        "created_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "torch": torch.__version__, "python": sys.version.split()[0], "machine": machine_info(),
        "config": {"recipe": RECIPE, "rung": RUNG, "overrides": OVERRIDES, "workers": WORKERS},
        "config_key": _config_key(),  # for the record: it changes when a config field is added
        "tolerance_abs": TOLERANCE_ABS, "engines_agree_abs": ENGINES_AGREE_ABS,
        "measured": {"rerun_max_abs_diff": max_abs_diff(single, rerun),
                     "threads_1_vs_2_max_abs_diff": max_abs_diff(single, two_threads),
                     "two_workers_rerun_max_abs_diff": max_abs_diff(sharded, sharded_rerun),
                     "two_workers_threads_1_vs_2_max_abs_diff": max_abs_diff(sharded, sharded_two_threads),
                     "single_vs_two_workers_max_abs_diff": max_abs_diff(single, sharded),
                     "seconds_for_all_six_runs": round(time.perf_counter() - t0, 1)},
        "single_process": single, "two_gloo_workers": sharded,
    }
    GOLDEN.parent.mkdir(parents=True, exist_ok=True)
    GOLDEN.write_text(json.dumps(golden, indent=2) + "\n")
    return golden


def _fresh(path: Path) -> Path:
    path.mkdir(parents=True)
    return path


def _config_key() -> str:
    from rungs.config import parse_config

    return parse_config(golden_config()).key()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--update", action="store_true", help="rewrite tests/rungs/goldens/cpu_demo_L3_losses.json")
    if parser.parse_args().update:
        made = update()
        print(json.dumps({k: made[k] for k in ("torch", "measured")}, indent=2))
    else:
        parser.print_help()
