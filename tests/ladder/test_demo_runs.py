"""Which runs the demo's fits read after its sweep (`ladder.analysis.demo`), on the committed fixture of its runs with
the trial keys of sweeps/demo.yaml's current plan: the current plan only, the ladder's rung wherever its block is
listed, and a ladder that diverged or a domain that was never scored said, not a traceback or a silent gap."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from ladder.analysis import demo
from ladder.errors import LadderInputError
from sweeps.plan import plan_sweep
from sweeps.spec import SWEEPS_DIR, load_spec

FIXTURE = Path(__file__).parents[2] / "notebooks" / "fixtures" / "demo_runs.csv"


@pytest.fixture(scope="module")
def keyed():
    """The fixture's runs with their trial keys: each matched to the planned trial of its rung, LR and WD."""
    spec = load_spec("demo")
    runs = pd.read_csv(FIXTURE)
    plan = plan_sweep(spec)

    def key(r):
        (match,) = [p.key for p in plan if p.trial.L == r.rung and np.isclose(p.config["lr"], r.lr, rtol=1e-6)
                    and np.isclose(p.config["weight_decay"], r.wd, rtol=1e-6)]
        return match
    return spec, runs.assign(trial_key=[key(r) for r in runs.itertuples()])


def test_runs_of_an_earlier_version_of_the_sweep_are_left_out_of_the_surfaces(keyed):
    """The surfaces took every run at the rung's compute: an earlier sweep's L2 grid (LR x2) moved the optimum
    from 0.01177 to 0.01071 and the card counted 23 runs for 14."""
    spec, runs = keyed
    stale = runs.assign(run_id="old" + runs["run_id"].astype(str), trial_key="stale" + runs["trial_key"],
                        lr=runs["lr"] * 2.0, bpb=runs["bpb"] + 0.03)
    current = demo.current_runs(pd.concat([runs, stale], ignore_index=True), spec)
    assert len(current) == len(runs)
    (surface,), _ = demo.fit_lr_wd_surfaces(current)
    (alone,), _ = demo.fit_lr_wd_surfaces(runs)
    assert surface.optimum_natural() == pytest.approx(alone.optimum_natural(), rel=1e-12)


def test_the_ladders_rung_is_found_whichever_block_is_listed_first(keyed, tmp_path):
    """The LR/WD grid's centre is the ladder's L2 trial (one key); listed first, its block took the key and the
    compute laws were fitted on L3-L7 without a word."""
    spec, runs = keyed
    data = yaml.safe_load((SWEEPS_DIR / "demo.yaml").read_text())
    data["blocks"] = data["blocks"][::-1]
    data["recipe"] = str((SWEEPS_DIR / data["recipe"]).resolve()) if data["recipe"].endswith(".yaml") else data["recipe"]
    (tmp_path / "demo_swapped.yaml").write_text(yaml.safe_dump(data))
    swapped = load_spec(tmp_path / "demo_swapped.yaml")
    rungs = [sorted(demo.ladder_runs(demo.current_runs(runs, s))["rung"]) for s in (spec, swapped)]
    assert rungs[0] == rungs[1] == [2, 3, 4, 5, 6, 7]


def test_a_ladder_whose_runs_all_diverged_is_refused_in_one_line(keyed):
    spec, runs = keyed
    ladder = runs["block"] == "ladder"
    runs = runs.copy()
    runs.loc[ladder, [c for c in runs.columns if c.startswith("bpb")]] = np.nan
    with pytest.raises(LadderInputError, match="all 6 ladder runs of the sweep diverged"):
        demo.ladder_runs(demo.current_runs(runs, spec))


def test_a_rung_whose_runs_miss_a_domain_says_why_it_has_no_surface(keyed):
    _, runs = keyed
    surfaces, errors = demo.fit_lr_wd_surfaces(runs.assign(bpb=np.nan))
    assert surfaces == [] and "no run of this rung has a BPB on every held-out domain" in errors[0]["error"]


def test_a_bad_bootstrap_is_refused_before_the_sweep(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(LadderInputError, match="bootstrap must be 0") as err:
        demo.check_demo_inputs("demo", None, bootstrap=5)
    assert err.value.field == "--bootstrap" and list(tmp_path.iterdir()) == []


def test_the_notebooks_find_the_demos_store_from_any_working_directory():
    """The default store is relative (sqlite:///runs/mlflow.db): a kernel started in notebooks/ found none and read
    the fixture, though the README says the notebooks read the demo's experiment."""
    from ladder.analysis.notebook_data import DEMO_STORE

    assert DEMO_STORE == f"sqlite:///{FIXTURE.parents[2] / 'runs' / 'mlflow.db'}"
