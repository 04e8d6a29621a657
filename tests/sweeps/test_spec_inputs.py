"""A sweep's inputs are checked before Ray starts (`sweep plan` and `sweep run` alike), paths in a spec are
relative to its folder, and `sweep status` shows why a trial failed."""

from __future__ import annotations

import json

import pytest
import yaml

from ladder.cli import main
from sweeps.plan import plan_sweep
from sweeps.spec import load_spec
from tests.ladder.tiny_corpus import prepare_corpus, write_corpus, write_recipe

SHARES = {"prose": 0.6, "code": 0.4}


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out = capsys.readouterr()
    return rc, out.out, out.err


def write_spec(path, **fields):
    spec = {"name": "mine", "recipe": "cpu-demo", "max_steps": 2, "blocks": [{"name": "ladder", "rungs": [2, 3]}],
            **fields}
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


@pytest.mark.parametrize("where,field", [
    ({"overrides": {"data_manifest": "missing/manifest.yaml"}}, "overrides.data_manifest"),
    ({"blocks": [{"name": "ladder", "rungs": [2], "arms": {"base": {}, "mine": {"data_manifest": "nope.yaml"}}}]},
     "blocks.ladder.arms.mine.data_manifest"),
    ({"data": "missing_dir"}, "data"),
], ids=["spec-overrides", "arm", "spec-data"])
@pytest.mark.parametrize("command", ["plan", "run"])
def test_a_missing_manifest_stops_plan_and_run_before_anything_starts(tmp_path, capsys, monkeypatch, where, field,
                                                                      command):
    monkeypatch.chdir(tmp_path)
    spec = write_spec(tmp_path / "spec.yaml", **where)
    store = tmp_path / "store" / "mlflow.db"
    extra = ["--tracking-uri", f"sqlite:///{store}", "--new-store"] if command == "run" else []
    rc, out, err = run_cli(capsys, "sweep", command, str(spec), *extra)
    assert rc == 2 and out == ""
    assert err.startswith(f"ladder sweep: error: {spec}: {field}: ") and "not found" in err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert not store.exists() and not (tmp_path / "runs").exists()  # no store, no run directory, no Ray results


def test_mixture_names_against_a_trials_corpus(tmp_path, capsys):
    manifest = write_corpus(tmp_path / "corpus", SHARES)  # cpu-demo's sources (code, web, ...) are not all here
    spec = write_spec(tmp_path / "spec.yaml", blocks=[{"name": "ladder", "rungs": [2],
                                                       "overrides": {"data_manifest": str(manifest)}}])
    rc, _, err = run_cli(capsys, "sweep", "plan", str(spec))
    assert rc == 2 and f"{spec}: blocks.ladder.overrides.data_manifest: " in err and "'web'" in err


def test_recipe_and_data_paths_are_relative_to_the_spec(tmp_path, monkeypatch):
    manifest = write_corpus(tmp_path / "sweep" / "corpus", SHARES)
    prepare_corpus(manifest, tmp_path / "sweep" / "corpus" / "prepared")
    (tmp_path / "sweep" / "recipes").mkdir()
    write_recipe(tmp_path / "sweep" / "recipes" / "mine.yaml", data="../corpus/prepared")
    spec_path = write_spec(tmp_path / "sweep" / "spec.yaml", recipe="recipes/mine.yaml")
    monkeypatch.chdir(tmp_path)  # not the spec's folder
    spec = load_spec(str(spec_path.relative_to(tmp_path)))
    assert spec.recipe == str(tmp_path / "sweep" / "recipes" / "mine.yaml")
    planned = plan_sweep(spec, where=str(spec_path))
    assert {p.config["data_manifest"] for p in planned} == {str(manifest.resolve())}
    assert set(planned[0].config["sources"]) == set(SHARES)
    # The spec's own data: replaces the recipe's, relative to the spec too.
    other = write_corpus(tmp_path / "sweep" / "other", {"prose": 1.0})
    prepare_corpus(other, tmp_path / "sweep" / "other" / "prepared")
    spec = load_spec(write_spec(tmp_path / "sweep" / "spec2.yaml", recipe="recipes/mine.yaml",
                                data="other/prepared"))
    planned = plan_sweep(spec, where="spec2.yaml")
    assert {p.config["data_manifest"] for p in planned} == {str(other.resolve())}
    assert list(planned[0].config["sources"]) == ["prose"]


def test_status_shows_a_failed_trials_error(tmp_path, capsys):
    """The trial wrapper's record of a failure (a FAILED run tagged with the error, as a job that died
    before creating its run leaves it) reaches `sweep status`, table and JSON."""
    from ladder.run.orchestrate import _payload, ensure_experiment
    from ladder.run.trial import _record_failure

    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    spec_path = write_spec(tmp_path / "spec.yaml", blocks=[{"name": "ladder", "rungs": [2]}])
    spec = load_spec(spec_path)
    planned = plan_sweep(spec, where=str(spec_path))
    ensure_experiment(store, spec.experiment_name)
    payload = _payload(planned[0], spec, tracking_uri=store, runs_root=tmp_path / "runs")
    try:
        raise FileNotFoundError("manifest file not found: /data/gone.yaml\n  (second line of detail)")
    except FileNotFoundError as err:
        _record_failure(payload, tmp_path, {"trial_key": planned[0].key, "sweep": spec.name}, err)
    rc, out, _ = run_cli(capsys, "sweep", "status", str(spec_path), "--tracking-uri", store, "--json")
    trials = json.loads(out)["trials"]
    assert rc == 0 and trials[0]["state"] == "failed"
    assert trials[0]["error"] == "FileNotFoundError: manifest file not found: /data/gone.yaml"
    rc, out, _ = run_cli(capsys, "sweep", "status", str(spec_path), "--tracking-uri", store)
    assert rc == 0 and "FileNotFoundError: manifest file not found: /data/gone.yaml" in out


def test_the_sweep_driver_marks_its_experiment_as_model_training_so_trials_never_tag_it(tmp_path):
    """Trials tag an experiment that lacks the kind tag; two doing so at once through a tracking server both
    insert it, and one fails on the store's unique key. The driver creates the experiment tagged, and tags an
    older untagged one, before any trial starts; the failure record creates it tagged too."""
    from mlflow import MlflowClient

    from ladder.run.orchestrate import ensure_experiment
    from ladder.run.trial import _record_failure
    from rungs.tracking import EXPERIMENT_KIND_TAG

    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(store)
    fresh = ensure_experiment(store, "fresh")
    old = client.create_experiment("older")  # as a version before the tag, or another tool, left it
    assert EXPERIMENT_KIND_TAG not in client.get_experiment(old).tags
    assert ensure_experiment(store, "older") == old
    assert ensure_experiment(store, "fresh") == fresh
    for exp_id in (fresh, old):
        assert client.get_experiment(exp_id).tags[EXPERIMENT_KIND_TAG] == "custom_model_development"
    payload = {"key": "k" * 16, "config": {"tracking_uri": store, "experiment_name": "failed-first"}}
    _record_failure(payload, tmp_path / "run", {"trial_key": "k" * 16}, RuntimeError("died before its run"))
    assert client.get_experiment_by_name("failed-first").tags[EXPERIMENT_KIND_TAG] == "custom_model_development"


@pytest.mark.parametrize("where", ["spec", "block", "arm"])
def test_a_relative_data_manifest_override_is_relative_to_the_spec_and_keyed_absolute(tmp_path, monkeypatch, where):
    """As `data:` is: run from another directory, the spec trains on the corpus beside it, and the key names
    that corpus's absolute path (it named the literal string, so two directories' corpora shared one key)."""
    manifest = write_corpus(tmp_path / "sweep" / "corpus", SHARES)
    prepare_corpus(manifest, tmp_path / "sweep" / "corpus" / "prepared")
    (tmp_path / "sweep" / "recipes").mkdir()
    write_recipe(tmp_path / "sweep" / "recipes" / "mine.yaml", data="../corpus/prepared")

    def planned(name: str, path: str):
        override = {"data_manifest": path}
        block = {"name": "ladder", "rungs": [2], **({"overrides": override} if where == "block" else {}),
                 **({"arms": {"base": override}} if where == "arm" else {})}
        top = {"overrides": override} if where == "spec" else {}
        spec = write_spec(tmp_path / "sweep" / name, recipe="recipes/mine.yaml", blocks=[block], **top)
        return plan_sweep(load_spec(spec), where=name)

    monkeypatch.chdir(tmp_path)  # not the spec's folder: the relative path resolved here would not exist
    (relative,) = planned("relative.yaml", "corpus/manifest.yaml")
    (absolute,) = planned("absolute.yaml", str(manifest.resolve()))
    assert relative.config["data_manifest"] == str(manifest.resolve())
    assert relative.key == absolute.key
