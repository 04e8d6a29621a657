"""`ladder data curate`: a table by default, one JSON object with --json, exit 2 with one line on bad input
(before any work), a rerun that runs nothing, a cluster-size plot in the directory, and every tagger's settings
fixed for a directory once begun: a flag passed with another value is refused, one left out takes the stored one."""

from __future__ import annotations

import json
import shlex

import pytest

from curation import model_taggers
from ladder.cli import main
from tests.curation.corpus import write_corpus


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli")
    write_corpus(root)
    return root / "manifest.yaml"


def test_curate_prints_one_json_object_and_a_rerun_runs_nothing(corpus, tmp_path, capsys):
    out = tmp_path / "cur"
    argv = ["data", "curate", str(corpus), "--out", str(out), "--taggers", "near,exact", "--json"]
    assert main(argv) == 0
    report = json.loads(capsys.readouterr().out)
    assert set(report["steps"]) == {"exact", "near"}
    assert report["steps"]["exact"]["a"]["docs_removed"] == 1
    assert report["sources"]["a"]["docs"] == report["sources"]["b"]["docs"] == 60
    assert (out / "cluster_sizes.png").stat().st_size > 1000 and (out / "report.json").is_file()
    markers = sorted(p.stat().st_mtime_ns for p in (out / "done").rglob("*.json"))
    assert main(argv) == 0
    assert json.loads(capsys.readouterr().out)["steps"] == report["steps"]
    assert sorted(p.stat().st_mtime_ns for p in (out / "done").rglob("*.json")) == markers
    assert main(["data", "curate", str(corpus), "--out", str(out), "--taggers", "exact"]) == 0
    table = capsys.readouterr().out
    assert "ladder data curate" in table and "near docs" in table


@pytest.mark.parametrize("extra, field", [
    (["--taggers", "exact,fuzzy"], "--taggers"),
    (["--workers", "0"], "--workers"),
    (["--jaccard", "1.5"], "--jaccard"),
    (["--taggers", "quality"], "--taggers"),
    (["--taggers", "quality", "--quality-positive", "a", "--quality-negative", "zzz"], "--quality-negative"),
    (["--semantic-eps", "-1"], "--semantic-eps"),
    (["--semantic-eps", "2"], "--semantic-eps"),
    (["--semantic-eps", "nan"], "--semantic-eps"),
    (["--taggers", "quality", "--quality-model", "/nonexistent"], "--quality-model"),
])
def test_bad_flags_are_one_line_naming_the_flag(corpus, tmp_path, capsys, extra, field):
    assert main(["data", "curate", str(corpus), "--out", str(tmp_path / "cur"), *extra]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and field in err and "Traceback" not in err
    assert not (tmp_path / "cur").exists()  # checked before any work


def test_a_damaged_quality_model_is_one_line(corpus, tmp_path, capsys):
    model = tmp_path / "model"
    model.mkdir()
    (model / "model.json").write_text("{")
    (model / "weights.npz").write_bytes(b"")
    argv = ["data", "curate", str(corpus), "--out", str(tmp_path / "cur"), "--taggers", "quality"]
    assert main([*argv, "--quality-model", str(model)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--quality-model" in err and "not valid JSON" in err
    (model / "model.json").write_text(json.dumps({"format": "curation.quality", "version": 1, "settings": {},
                                                  "heldout_auc": 1.0}))
    assert main([*argv, "--quality-model", str(model)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--quality-model" in err and "damaged" in err
    assert not (tmp_path / "cur").exists()


def test_too_few_quality_documents_are_refused_before_any_tagger_runs(tmp_path, capsys):
    write_corpus(tmp_path / "c", files_per_source=1, docs_per_file=12)
    (tmp_path / "c" / "tiny.jsonl").write_text(json.dumps({"id": "t0", "text": "one lonely document"}) + "\n")
    manifest = tmp_path / "c" / "m2.yaml"
    manifest.write_text("sources:\n  - {name: a, share: 0.6, files: [a0.jsonl]}\n"
                        "  - {name: tiny, share: 0.4, files: [tiny.jsonl]}\n")
    out = tmp_path / "cur"
    for taggers in (["--taggers", "quality"], []):  # all taggers: refused before exact and near run
        assert main(["data", "curate", str(manifest), "--out", str(out), *taggers,
                     "--quality-positive", "tiny", "--quality-negative", "a"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "Traceback" not in err
        assert "--quality-positive" in err and "tiny has 1 document" in err and "at least 3" in err
        assert not out.exists()


def test_an_out_curate_did_not_write_is_refused(corpus, tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("mine")
    assert main(["data", "curate", str(corpus), "--out", str(tmp_path), "--taggers", "exact"]) == 2
    assert "refusing" in capsys.readouterr().err
    assert [p.name for p in tmp_path.iterdir()] == ["notes.txt"]


def test_other_near_duplicate_settings_need_a_new_directory(corpus, tmp_path, capsys):
    out = tmp_path / "cur"
    assert main(["data", "curate", str(corpus), "--out", str(out), "--taggers", "near"]) == 0
    assert not (out / "work" / "near" / "buckets").exists() and (out / "work" / "near" / "pairs").is_dir()
    capsys.readouterr()
    assert main(["data", "curate", str(corpus), "--out", str(out), "--taggers", "near", "--rows", "4"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--rows: was tagged with --bands 14 --rows 8 --jaccard 0.7" in err
    assert "--rows 4 needs a new --out" in err


def _fails(argv: list[str], capsys, *needles: str) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert all(n in err for n in needles), err


def test_near_flags_need_not_be_repeated_and_the_command_mix_suggests_runs(corpus, tmp_path, capsys):
    out, rules = tmp_path / "cur", tmp_path / "sem.yaml"
    curate = ["data", "curate", str(corpus), "--out", str(out)]
    assert main([*curate, "--taggers", "exact,near", "--jaccard", "0.8"]) == 0
    rules.write_text("semantic_duplicates: keep_one\n")
    capsys.readouterr()
    assert main(["data", "mix", str(out), "--rules", str(rules), "--out", str(tmp_path / "arm")]) == 2
    suggested = capsys.readouterr().err.split("ladder data curate ", 1)[1].strip()
    assert suggested.endswith("--taggers semantic")
    assert main(["data", "curate", *shlex.split(suggested), "--json"]) == 0  # near's settings as stored
    report = json.loads(capsys.readouterr().out)
    assert report["taggers"]["semantic"]["eps"] == 0.01 and report["taggers"]["near"]["done"]
    markers = sorted(p.stat().st_mtime_ns for p in (out / "done").rglob("*.json"))
    assert main([*curate, "--taggers", "near"]) == 0  # resuming without the flag
    assert main([*curate, "--taggers", "near", "--jaccard", "0.8", "--bands", "14"]) == 0  # the same values
    assert main([*curate, "--semantic-eps", "0.01", "--topics", str(report["taggers"]["topics"]["n_topics"])]) == 0
    assert sorted(p.stat().st_mtime_ns for p in (out / "done").rglob("*.json")) == markers
    capsys.readouterr()
    for flag, value, stored in (("--jaccard", "0.7", "--jaccard 0.8"), ("--rows", "4", "--rows 8"),
                                ("--semantic-eps", "0.5", "--semantic-eps 0.01"),
                                ("--topics", "7", f"--topics {report['taggers']['topics']['n_topics']}")):
        # a changed setting is refused whichever taggers the run names
        _fails([*curate, "--taggers", "exact", flag, value], capsys, f"{flag}: was tagged with ", stored,
               f"{flag} {value} needs a new --out")


def test_quality_sources_are_fixed_once_the_classifier_is_trained(corpus, tmp_path, capsys):
    out = tmp_path / "cur"
    curate = ["data", "curate", str(corpus), "--out", str(out), "--taggers", "quality"]
    assert main([*curate, "--quality-positive", "a", "--quality-negative", "b"]) == 0
    capsys.readouterr()
    _fails([*curate, "--quality-positive", "b", "--quality-negative", "a"], capsys,
           "--quality-positive: was tagged with --quality-positive a --quality-negative b", "new --out")
    _fails([*curate, "--quality-model", str(out / "work" / "quality" / "model")], capsys,
           "--quality-model: was tagged with --quality-positive a", "new --out")
    assert main([*curate, "--json"]) == 0  # no classifier flags: the one the directory was tagged with
    quality = json.loads(capsys.readouterr().out)["taggers"]["quality"]
    assert quality["positive"] == ["a"] and quality["negative"] == ["b"]


def test_an_interrupted_tagger_resumes_with_the_settings_it_began_with(corpus, tmp_path, capsys, monkeypatch):
    out = tmp_path / "cur"
    curate = ["data", "curate", str(corpus), "--out", str(out), "--taggers", "semantic"]

    def interrupted(*args):
        raise KeyboardInterrupt

    with monkeypatch.context() as m:
        m.setattr(model_taggers, "semantic_partition", interrupted)
        assert main([*curate, "--semantic-eps", "0.2"]) == 130
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "ladder data: interrupted; rerun the same command to resume: finished tasks are kept")
    _fails([*curate, "--semantic-eps", "0.5"], capsys, "--semantic-eps: was tagged with --semantic-eps 0.2")
    assert main([*curate, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["taggers"]["semantic"]["eps"] == 0.2
