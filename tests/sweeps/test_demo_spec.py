"""The demo ladder (`sweeps/demo.yaml`) holds to the properties its backtest needs, not to its
current numbers: enough rungs below the held-out top for that rung's 95% interval, fitted rungs
spanning at least 30x in compute, one TPP, no pre-asymptotic rung, LR/WD grids on fitted rungs that can
fit a surface, the largest rung started first within a compute budget, and an MLflow experiment of its own."""

from __future__ import annotations

from fits.bootstrap import MIN_DISTINCT_FOR_INTERVAL
from sweeps.plan import plan_sweep
from sweeps.spec import load_spec

DEMO_SPEC = "demo"
LADDER_BLOCK = "ladder"  # the block the demo fits its compute law on (one run per rung, the law's LR/WD)
# Earlier demo ladders keep their experiments: cpu-demo L2-L6 (sweeps/demo_cpu_demo.yaml), the TPP-1
# candidate and cpu-demo-d2 at TPP 10 (L4-L13).
EARLIER_DEMO_EXPERIMENTS = {"sweep-demo", "sweep-demo-tpp1", "sweep-demo-d2"}
# Rungs that trained on fewer tokens were pre-asymptotic (their BPB fell faster with compute at the top of
# the ladder than at the bottom): cpu-demo-d2 L4 and L5 at TPP 4 (325k, 488k tokens); from 666k on (L2 at
# TPP 30, L2 at 40, L3 at 20, L4 at 10) they were not (docs/backtest_diagnosis/).
MIN_RUNG_TOKENS = 600_000
# On two cores the sweep is throughput-bound: 1,277 trial-seconds for 2.9e13 FLOPs of training measured
# (2026-12-03), 11 minutes of `make demo`'s 15. More compute than this does not fit.
MAX_TOTAL_TRAIN_FLOPS = 3.2e13


def train_flops(config: dict) -> float:
    return config["flops_per_token"] * config["steps"] * config["batch_sequences"] * config["seq_len"]


def ladder_trials(planned):
    return [p for p in planned if p.trial.block == LADDER_BLOCK]


def test_the_demo_fits_enough_rungs_below_its_top_for_an_interval_over_30x_at_one_tpp():
    planned = plan_sweep(load_spec(DEMO_SPEC))
    ladder = ladder_trials(planned)
    flops = sorted(train_flops(p.config) for p in ladder)
    fitted = flops[:-1]  # the top rung is held out and predicted from the rungs below it
    # Below MIN_DISTINCT_FOR_INTERVAL fitted rungs the top rung's 95% interval is reported as not
    # available (fits.bootstrap); the backtest needs at least 4 fitted rungs over >= 30x.
    assert len(set(fitted)) >= max(MIN_DISTINCT_FOR_INTERVAL, 4)
    assert fitted[-1] / fitted[0] >= 30
    assert len({p.config["tpp"] for p in planned}) == 1
    assert min(p.config["steps"] * p.config["batch_sequences"] * p.config["seq_len"] for p in ladder) >= MIN_RUNG_TOKENS
    # One run per rung, each at the law's LR/WD: the compute law is fitted on exactly these.
    assert len(ladder) == len(flops)
    assert all(p.trial.log_lr_offset == 0 and p.trial.log_lr_wd_offset == 0 for p in ladder)


def test_the_demo_lr_wd_grids_sit_on_fitted_rungs_with_three_points_per_axis():
    spec = load_spec(DEMO_SPEC)
    ladder_rungs = sorted({L for b in spec.blocks if b.name == LADDER_BLOCK for L in b.rungs})
    grids = [b for b in spec.blocks if len(b.lr_wd.offsets()) > 1]
    assert grids, "the demo fits LR/WD surfaces: it needs at least one grid"
    for block in grids:
        # A grid on the held-out top rung would not tell whether the fitted rungs' LR/WD were right.
        assert set(block.rungs) <= set(ladder_rungs[:-1])
        offsets = block.lr_wd.offsets()
        # A quadratic surface in (log LR, log LR·WD) needs three values on each axis, centred on the law.
        assert len({d_lr for d_lr, _ in offsets}) >= 3 and len({d_v for _, d_v in offsets}) >= 3
        assert (0.0, 0.0) in offsets
    # The grid centres are the ladder's own trials, so they are planned once, under the ladder block
    # (which comes first, so ladder_runs finds every rung).
    planned = plan_sweep(spec)
    assert spec.blocks[0].name == LADDER_BLOCK
    expected = len(ladder_trials(planned)) + sum(len(b.rungs) * (len(b.lr_wd.offsets()) - 1) for b in grids)
    assert len(planned) == expected


def test_the_demo_starts_its_largest_rung_first_within_its_compute_budget():
    # The top rung is a third of the sweep's compute: started last, it alone would set the wall time.
    flops = [train_flops(p.config) for p in plan_sweep(load_spec(DEMO_SPEC))]
    assert flops[0] == max(flops)
    assert sum(flops) <= MAX_TOTAL_TRAIN_FLOPS


def test_the_demo_has_an_mlflow_experiment_of_its_own():
    assert load_spec(DEMO_SPEC).experiment_name not in EARLIER_DEMO_EXPERIMENTS
