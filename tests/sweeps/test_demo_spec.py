"""The demo ladder of issue #23 (`sweeps/demo_tpp1.yaml`, to become `sweeps/demo.yaml` once its
backtest has been run whole: docs/backtest_diagnosis/) holds to the properties its backtest needs,
not to its current numbers: enough rungs for the held-out top rung to
get a 95% interval, a compute span of at least 30×, one TPP, no pre-asymptotic rung, LR/WD grids
that can fit a surface on rungs of the ladder itself, and the largest rung started first."""

from __future__ import annotations

from fits.bootstrap import MIN_DISTINCT_FOR_INTERVAL
from sweeps.plan import plan_sweep
from sweeps.spec import load_spec

DEMO_LADDER_SPEC = "demo_tpp1"
LADDER_BLOCK = "ladder"  # the block the demo fits its compute law on (one run per rung, the law's LR/WD)


def train_flops(config: dict) -> float:
    return config["flops_per_token"] * config["steps"] * config["batch_sequences"] * config["seq_len"]


def ladder_trials(planned):
    return [p for p in planned if p.trial.block == LADDER_BLOCK]


def test_demo_ladder_leaves_enough_rungs_below_its_top_for_an_interval_over_30x_at_one_tpp():
    planned = plan_sweep(load_spec(DEMO_LADDER_SPEC))
    ladder = ladder_trials(planned)
    flops = {p.config["L"]: train_flops(p.config) for p in ladder}
    # The backtest fits the rungs below the held-out top; below MIN_DISTINCT_FOR_INTERVAL of them the
    # top rung's 95% interval is reported as not available (fits.bootstrap).
    assert len(flops) - 1 >= MIN_DISTINCT_FOR_INTERVAL
    assert max(flops.values()) / min(flops.values()) >= 30
    assert len({p.config["tpp"] for p in planned}) == 1
    # Rungs narrower than d_model 64 are pre-asymptotic (docs/backtest_diagnosis/).
    assert min(p.config["d_model"] for p in ladder) >= 64
    # One run per rung, each at the law's LR/WD: the compute law is fitted on exactly these.
    assert len(ladder) == len(flops)
    assert all(p.trial.log_lr_offset == 0 and p.trial.log_lr_wd_offset == 0 for p in ladder)


def test_demo_lr_wd_grids_sit_on_ladder_rungs_with_three_points_per_axis():
    spec = load_spec(DEMO_LADDER_SPEC)
    ladder_rungs = {L for b in spec.blocks if b.name == LADDER_BLOCK for L in b.rungs}
    grids = [b for b in spec.blocks if len(b.lr_wd.offsets()) > 1]
    assert grids, "the demo fits LR/WD surfaces: it needs at least one grid"
    for block in grids:
        assert set(block.rungs) <= ladder_rungs
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


def test_demo_starts_its_largest_rung_first():
    # On two cores the top rung is about half the ladder's compute: started last, it alone sets the wall time.
    planned = plan_sweep(load_spec(DEMO_LADDER_SPEC))
    assert train_flops(planned[0].config) == max(train_flops(p.config) for p in planned)


def test_demo_has_its_own_mlflow_experiment():
    # Earlier demo ladders stay in MLflow under their own experiment names (sweep-demo: cpu-demo L2-L6).
    spec = load_spec(DEMO_LADDER_SPEC)
    assert spec.experiment_name != "sweep-demo"
