"""A recipe's `data:`: the mixture learned from a prepared corpus, and the plan-time checks of a
hand-written one against it (ladder.plan.corpus_data)."""

from __future__ import annotations

import json
import logging

import pytest
import yaml

from ladder.cli import main
from ladder.errors import LadderInputError
from ladder.plan.corpus_data import job_input_key, read_corpus
from ladder.plan.generator import plan_rung
from ladder.plan.recipe import load_recipe
from ladder.plan.resolve import resolve_train_config
from rungs.data.corpus import PreparedCorpus
from rungs.data.manifest import load_manifest
from rungs.data.prepare import input_key
from tests.ladder.tiny_corpus import prepare_corpus, write_corpus, write_recipe

SHARES = {"prose": 0.4, "code": 0.35, "maths": 0.25}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """(manifest, prepared directory) of a three-source corpus whose `maths` has no held-out set."""
    folder = tmp_path_factory.mktemp("corpus")
    manifest = write_corpus(folder, SHARES, eval_domains=("prose", "code"))
    return manifest, prepare_corpus(manifest, folder / "prepared")


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_mixture_learned_from_a_prepared_directory_has_its_counts_and_shares(corpus, tmp_path):
    manifest, prepared = corpus
    recipe = load_recipe(write_recipe(tmp_path / "r.yaml", data=str(prepared)))
    opened = PreparedCorpus.open(prepared)
    assert [s.name for s in recipe.mixture] == list(SHARES)
    for s in recipe.mixture:
        assert s.share == SHARES[s.name] and s.domain == s.name
        assert s.unique_tokens == opened.unique_tokens(s.name)  # post-decontamination tokens, EOS included
    # Source scaling from those numbers: epochs = share · T_full / U at every rung.
    rung = plan_rung(recipe, 3)
    for name, alloc in rung.sources.items():
        expected = SHARES[name] * recipe.full_scale_tokens / opened.unique_tokens(name)
        assert alloc.epochs == pytest.approx(expected, rel=1e-12)
    # The held-out check: maths has none.
    assert any("maths" in w and "no BPB" in w for w in recipe.data_warnings)


def test_the_plan_key_is_the_one_prepare_writes(corpus):
    manifest, prepared = corpus
    assert job_input_key(load_manifest(manifest), 512) == input_key(load_manifest(manifest), "bpe", 512)
    assert job_input_key(load_manifest(manifest), 512) == json.loads((prepared / "meta.json").read_text())["key"]


def test_relative_data_is_relative_to_the_recipe_file(corpus, tmp_path, monkeypatch):
    manifest, prepared = corpus
    (tmp_path / "recipes").mkdir()
    (tmp_path / "recipes" / "data").symlink_to(prepared)
    path = write_recipe(tmp_path / "recipes" / "mine.yaml", data="data")
    monkeypatch.chdir(tmp_path)  # not the recipe's folder
    recipe = load_recipe("recipes/mine.yaml")
    assert recipe.data == str((tmp_path / "recipes" / "data").resolve())
    config = resolve_train_config(path, 2)
    assert config["data_manifest"] == str(manifest.resolve())


def test_a_recipe_without_data_resolves_without_a_manifest():
    assert resolve_train_config("cpu-demo", 2)["data_manifest"] is None


def test_share_differing_from_the_manifest_warns_naming_both(corpus, tmp_path, caplog):
    _, prepared = corpus
    mixture = [{"name": "prose", "share": 0.3}, {"name": "code", "share": 0.45}, {"name": "maths", "share": 0.25}]
    path = write_recipe(tmp_path / "r.yaml", data=str(prepared), mixture=mixture)
    with caplog.at_level(logging.WARNING, logger="ladder.plan.corpus_data"):
        recipe = load_recipe(path)
    text = [w for w in recipe.data_warnings if "prose" in w and "share" in w]
    assert len(text) == 1 and "0.3" in text[0] and "0.4" in text[0]
    assert any("0.3" in r.getMessage() and "0.4" in r.getMessage() for r in caplog.records)
    # The recipe's share is what trains; the unique tokens it left out come from the corpus.
    assert recipe.mixture[0].share == 0.3
    assert recipe.mixture[0].unique_tokens == PreparedCorpus.open(prepared).unique_tokens("prose")


def test_unique_tokens_far_above_the_corpus_is_an_error(corpus, tmp_path, capsys):
    _, prepared = corpus
    have = PreparedCorpus.open(prepared).unique_tokens("code")
    mixture = [{"name": "prose", "share": 0.4}, {"name": "code", "share": 0.35, "unique_tokens": 100 * have},
               {"name": "maths", "share": 0.25}]
    path = write_recipe(tmp_path / "r.yaml", data=str(prepared), mixture=mixture)
    rc, out, err = run_cli(capsys, "plan", str(path), "--json")
    assert rc == 2 and out == ""
    assert str(path) in err and "mixture[1].unique_tokens" in err and f"{have:,}" in err
    assert err.count("\n") == 1
    # Within the tolerance (a count rounded down, as cpu-demo's are) it is accepted.
    mixture[1]["unique_tokens"] = have
    assert load_recipe(write_recipe(tmp_path / "ok.yaml", data=str(prepared), mixture=mixture)).mixture[1].unique_tokens \
        == have


def test_a_mixture_source_not_in_the_corpus_is_an_error(corpus, tmp_path, capsys):
    manifest, _ = corpus
    mixture = [{"name": "prose", "share": 0.5, "unique_tokens": 1000}, {"name": "web", "share": 0.5,
                                                                           "unique_tokens": 1000}]
    path = write_recipe(tmp_path / "r.yaml", data=str(manifest), mixture=mixture)
    rc, _, err = run_cli(capsys, "plan", str(path))
    assert rc == 2 and "mixture[1].name" in err and "'web'" in err and "prose, code, maths" in err


def test_a_bare_manifest_gives_no_counts_but_checks_a_written_mixture(corpus, tmp_path, capsys):
    manifest, _ = corpus
    rc, _, err = run_cli(capsys, "plan", "cpu-demo", "--data", str(manifest))
    # cpu-demo's mixture names sources this corpus lacks: its first, code, is there; web is not
    assert rc == 2 and "cpu-demo.yaml: mixture[1].name" in err and "'web'" in err
    rc, _, err = run_cli(capsys, "plan", str(write_recipe(tmp_path / "r.yaml", data=str(manifest))))
    assert rc == 2 and "bare manifest" in err and "ladder data prepare" in err
    mixture = [{"name": n, "share": s, "unique_tokens": 1000} for n, s in SHARES.items()]
    recipe = load_recipe(write_recipe(tmp_path / "w.yaml", data=str(manifest), mixture=mixture))
    assert [s.unique_tokens for s in recipe.mixture] == [1000, 1000, 1000]


def test_a_directory_prepared_with_another_vocabulary_is_refused(corpus, tmp_path, capsys):
    _, prepared = corpus
    path = write_recipe(tmp_path / "r.yaml", data=str(prepared), vocab_size=1024)
    with pytest.raises(LadderInputError, match="vocab_size=1024"):
        load_recipe(path)


def test_missing_data_names_the_recipe_and_field(tmp_path, capsys):
    path = write_recipe(tmp_path / "r.yaml", data="no/such/dir")
    rc, _, err = run_cli(capsys, "train", str(path), "--rung", "2")
    assert rc == 2 and str(path) in err and ": data: " in err and "not found" in err


def test_plan_json_reports_the_corpus_and_its_warnings(corpus, tmp_path, capsys):
    _, prepared = corpus
    rc, out, _ = run_cli(capsys, "plan", str(write_recipe(tmp_path / "r.yaml", data=str(prepared))), "--json")
    payload = json.loads(out)
    assert rc == 0 and payload["data"]["path"] == str(prepared.resolve())
    assert set(payload["rungs"][0]["sources"]) == set(SHARES)
    assert read_corpus(prepared).prepared and yaml.safe_load((tmp_path / "r.yaml").read_text())["data"]
