"""The tagger pipeline in this process: planted duplicates found, the same attributes for any partitioning,
resumable after kill -9 (a real process), never writing into a directory it did not create, and a --topics the
corpus is too small for refused before the directory records it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from curation.ids import doc_uid
from curation.model_taggers import ModelOptions
from curation.pipeline import curate
from curation.store import read_npz
from ladder.cli import main
from rungs.data.errors import DataInputError
from tests.curation.corpus import write_corpus


def attributes(root: Path, tagger: str) -> dict[tuple[str, str], tuple[int, bool]]:
    """(source, id) -> (cluster, keep) over every file of a curation directory."""
    meta = json.loads((root / "curation.json").read_text())
    out = {}
    for u in meta["units"]:
        index = read_npz(root / "units" / f"{u['unit']}.npz")
        attrs = read_npz(root / "attributes" / tagger / f"{u['unit']}.npz")
        for doc_id, cluster, keep in zip(index["id"].tolist(), attrs["cluster"].tolist(), attrs["keep"].tolist()):
            out[(u["source"], doc_id)] = (cluster, keep)
    return out


def file_bytes(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny")
    planted = write_corpus(root / "corpus")
    before = file_bytes(root / "corpus")
    curate(root / "corpus" / "manifest.yaml", root / "p4", taggers=["exact", "near"], partitions=4)
    assert file_bytes(root / "corpus") == before  # tagging never touches the corpus
    return root, planted


def test_planted_exact_and_near_duplicates_are_found_and_one_of_each_cluster_kept(tiny):
    root, planted = tiny
    exact, near = attributes(root / "p4", "exact"), attributes(root / "p4", "near")
    for source, ids in planted["exact"]:
        uids = [doc_uid(source, i) for i in ids]
        assert {exact[(source, i)][0] for i in ids} == {min(uids)}
        assert [exact[(source, i)][1] for i in ids] == [u == min(uids) for u in uids]
    cluster = {near[a][0] for pair in planted["near"] for a in pair}
    members = {a for pair in planted["near"] for a in pair}
    assert cluster == {min(doc_uid(*m) for m in members)}  # the two pairs share a document: one component
    assert sum(near[m][1] for m in members) == 1
    assert sum(not keep for _, keep in exact.values()) == 1
    # nothing else is a duplicate: the planted exact pair also counts as near, and the rest are random texts
    assert sum(not keep for _, keep in near.values()) == len(members) - 1 + 1


def test_the_attributes_do_not_depend_on_the_number_of_partitions(tiny, tmp_path):
    root, _ = tiny
    curate(root / "corpus" / "manifest.yaml", tmp_path / "p7", taggers=["exact", "near"], partitions=7)
    for tagger in ("exact", "near"):
        assert attributes(tmp_path / "p7", tagger) == attributes(root / "p4", tagger)


def test_ids_are_the_inputs_or_file_and_line(tiny):
    root, _ = tiny
    ids = {k for k in attributes(root / "p4", "exact")}
    assert ("a", "a/f0-d0") in ids and ("b", "b1.jsonl:30") in ids and len(ids) == 120


def test_a_directory_curate_did_not_write_is_refused(tiny, tmp_path):
    root, _ = tiny
    (tmp_path / "mine.txt").write_text("keep me")
    with pytest.raises(DataInputError, match="refusing"):
        curate(root / "corpus" / "manifest.yaml", tmp_path, taggers=["exact"])
    assert (tmp_path / "mine.txt").read_text() == "keep me" and len(list(tmp_path.iterdir())) == 1


def test_a_curation_killed_with_sigkill_resumes_to_the_same_attributes(tiny, tmp_path):
    root, _ = tiny
    corpus = tmp_path / "big"
    write_corpus(corpus, files_per_source=12, docs_per_file=40, seed=3)
    out = tmp_path / "killed"
    cmd = [sys.executable, "-c", "import sys; from ladder.cli import main; sys.exit(main())", "data", "curate", str(corpus / "manifest.yaml"), "--out", str(out),
           "--taggers", "exact,near", "--json"]
    env = dict(os.environ, PYTHONPATH=str(Path.cwd()))
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        done = out / "done" / "near.scan"
        if done.is_dir() and len(list(done.glob("*.json"))) >= 3:
            break
        time.sleep(0.02)
    assert proc.poll() is None, "the curation finished before it could be killed"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    finished_before = len(list((out / "done" / "near.scan").glob("*.json")))
    assert 3 <= finished_before < 24
    assert subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env).returncode == 0
    curate(corpus / "manifest.yaml", tmp_path / "clean", taggers=["exact", "near"], partitions=4)
    for tagger in ("exact", "near"):
        resumed, clean = attributes(out, tagger), attributes(tmp_path / "clean", tagger)
        assert resumed == clean and len(clean) == 960
    assert not [p for p in out.rglob(".*tmp*")]


def test_uids_are_stable_hashes_of_source_and_id():
    assert doc_uid("a", "x") == doc_uid("a", "x") != doc_uid("b", "x")
    assert 0 <= doc_uid("a", "x") < 2**63 and np.int64(doc_uid("a", "x")) == doc_uid("a", "x")


def test_too_many_topics_are_refused_before_any_tagger_runs_and_nothing_is_kept(tiny, tmp_path, capsys):
    root, _ = tiny
    manifest, out = root / "corpus" / "manifest.yaml", tmp_path / "cur"
    curate_topics = ["data", "curate", str(manifest), "--out", str(out), "--taggers", "topics"]
    for topics, line in (("500", "--topics: 500 topics need at least as many documents, the training files hold 120"),
                         ("100001", "--topics: must be at most 100000")):
        assert main([*curate_topics, "--topics", topics]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"{manifest}: {line}" in err, err
        assert not out.exists()  # refused before curation.json records the setting
    with pytest.raises(DataInputError, match="500 topics need"):
        curate(manifest, out, taggers=["topics"], model_options=ModelOptions(n_topics=500))
    assert not (out / "curation.json").exists()
    assert main([*curate_topics, "--topics", "5", "--json"]) == 0  # the corrected value, in the same --out
    assert json.loads(capsys.readouterr().out)["taggers"]["topics"]["n_topics"] == 5


def test_a_topic_count_its_sample_cannot_hold_is_not_kept_and_a_corrected_rerun_runs(tiny, tmp_path):
    """Over `topic_sample_size` documents the sample is those of the smallest uids, about that many: 57 of these
    120 for 60. The tagger refuses 60 topics after embedding, and the directory keeps no --topics setting."""
    root, _ = tiny
    manifest, out = root / "corpus" / "manifest.yaml", tmp_path / "cur"
    with pytest.raises(DataInputError, match="60 topics need at least as many documents, the sample has 57"):
        curate(manifest, out, taggers=["topics"], model_options=ModelOptions(n_topics=60, topic_sample_size=60))
    assert "topics" not in json.loads((out / "curation.json").read_text()).get("settings", {})
    meta = curate(manifest, out, taggers=["topics"], model_options=ModelOptions(n_topics=20, topic_sample_size=60))
    assert meta["taggers"]["topics"]["n_topics"] == meta["settings"]["topics"]["n_topics"] == 20
