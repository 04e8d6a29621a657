"""`ladder data curate`: a table by default, one JSON object with --json, exit 2 with one line on bad input,
a rerun that runs nothing, and a cluster-size plot in the directory."""

from __future__ import annotations

import json

import pytest

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
])
def test_bad_flags_are_one_line_naming_the_flag(corpus, tmp_path, capsys, extra, field):
    assert main(["data", "curate", str(corpus), "--out", str(tmp_path / "cur"), *extra]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and field in err and "Traceback" not in err


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
    assert "bands=14, rows=8" in capsys.readouterr().err
