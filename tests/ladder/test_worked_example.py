"""The own-corpus path of docs/data.md, docs/training.md and docs/sweeps.md, end to end: a user's
JSONL sources and held-out sets → manifest → `ladder data prepare` → a recipe whose mixture is
`data: <prepared dir>` (no number copied by hand) → `ladder train` on four tiny rungs →
`ladder fit power-law` → `ladder extrapolate` (the recipe card)."""

from __future__ import annotations

import json

import pytest

from ladder.cli import main
from rungs.data.corpus import PreparedCorpus
from tests.ladder.tiny_corpus import write_corpus, write_recipe

SHARES = {"prose": 0.5, "code": 0.3, "maths": 0.2}
RUNGS = (2, 3, 4, 5)


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out = capsys.readouterr()
    return rc, out.out, out.err


@pytest.mark.slow  # four training jobs (a few steps each) and two fits: about a minute on 2 cores
def test_own_corpus_from_manifest_to_recipe_card(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # runs/ (the job's data cache and run directories) lands here
    manifest = write_corpus(tmp_path / "corpus", SHARES)
    rc, out, err = run_cli(capsys, "data", "prepare", str(manifest), "--out", "prepared", "--vocab-size", "512",
                           "--json")
    assert rc == 0, err
    # The recipe names the prepared directory, relative to its own folder; no mixture.
    recipe = write_recipe(tmp_path / "mine.yaml", name="mine", data="prepared", full_scale_tokens=3.0e6,
                          full_scale_rung=6, ladder_rungs=list(RUNGS))
    rc, out, err = run_cli(capsys, "plan", str(recipe), "--json")
    assert rc == 0, err
    plan = json.loads(out)
    counts = PreparedCorpus.open(tmp_path / "prepared")
    for name, alloc in plan["rungs"][-1]["sources"].items():  # source scaling from the prepared counts
        assert alloc["epochs"] == pytest.approx(SHARES[name] * 3.0e6 / counts.unique_tokens(name), rel=1e-12)
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    for L in RUNGS:
        rc, out, err = run_cli(capsys, "train", str(recipe), "--rung", str(L), "--max-steps", "8",
                               "--set", "experiment_name=mine", "--tracking-uri", store, "--json")
        assert rc == 0, err
        result = json.loads(out)
        assert set(result["bpb"]) == set(SHARES)  # every domain has a held-out set, so every one has a BPB
    rc, out, err = run_cli(capsys, "fit", "power-law", "--experiment", "mine", "--tracking-uri", store, "--floor", "zero",
                           "--holdout-top", "0", "--bootstrap", "0", "--no-log", "--json")
    assert rc == 0, err
    fits = {f["group"]: f for f in json.loads(out)["fits"]}
    assert set(fits) == set(SHARES)
    rc, out, err = run_cli(capsys, "extrapolate", str(recipe), "--rung", "6", "--experiment", "mine",
                           "--tracking-uri", store, "--floor", "zero", "--bootstrap", "0", "--json")
    assert rc == 0, err
    card = json.loads(out)
    assert card["target"]["L"] == 6 and card["target"]["recipe"] == "mine"
