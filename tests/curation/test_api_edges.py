"""The curation functions called directly (from a notebook): edge values of their parameters are refused with a
typed error, and their results follow the documented rules whatever the input order or the float rounding."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from curation.minhash import LSHParams
from curation.model_taggers import ModelOptions
from curation.mix import kept_count, mix
from curation.pipeline import curate
from curation.quality import min_documents, train_quality_classifier
from curation.report import removed_samples
from curation.rules import Rules
from curation.semantic import diversity_weights, semantic_duplicates
from curation.store import read_npz
from curation.topics import fit_topics
from rungs.data.errors import DataInputError
from rungs.data.manifest import load_manifest
from tests.curation.corpus import random_text, write_corpus


def _one_source(root: Path, texts: list[str]) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "a.jsonl").write_text("".join(json.dumps({"id": f"d{k:02d}", "text": t}) + "\n"
                                          for k, t in enumerate(texts)))
    (root / "manifest.yaml").write_text("name: t\nsources:\n  - {name: a, domain: a, share: 1.0, files: [a.jsonl]}\n")
    return root / "manifest.yaml"


@pytest.mark.parametrize("fraction, n, kept", [(0.07, 100, 7), (0.14, 50, 7), (0.28, 25, 7), (0.5, 3, 2), (1.0, 9, 9)])
def test_kept_count_is_the_ceiling_of_the_decimal_fraction(fraction, n, kept):
    assert kept_count(fraction, n) == kept  # 0.07 * 100 is 7.000000000000001 in binary floating point


def test_subsample_keeps_exactly_the_fraction_written(tmp_path):
    write_corpus(tmp_path / "corpus", files_per_source=1, docs_per_file=25)
    curate(tmp_path / "corpus" / "manifest.yaml", tmp_path / "cur", taggers=["exact"], partitions=2)
    payload = mix(tmp_path / "cur", Rules(subsample=0.28), tmp_path / "arm")
    assert {s: k["docs"] for s, k in payload["kept"].items()} == {"a": 7, "b": 7}
    assert [len(list(ds.documents())) for ds in load_manifest(tmp_path / "arm" / "manifest.yaml").sources] == [7, 7]


@pytest.mark.parametrize("params", [dict(bands=0), dict(rows=0), dict(bands=-2), dict(bands=2.5), dict(seed=-1),
                                    dict(threshold=float("nan")), dict(threshold=1.5), dict(threshold=0.0),
                                    dict(threshold=-1.0)])
def test_lsh_params_out_of_range_are_refused(params):
    name = next(iter(params))
    with pytest.raises(DataInputError, match=f"LSHParams.{name}"):
        LSHParams(**params)


def test_lsh_params_at_the_edges_of_their_ranges_are_taken():
    assert LSHParams(bands=1, rows=1, threshold=1.0, seed=0).num_perm == 1


@pytest.mark.parametrize("partitions", [0, -1])
def test_curate_refuses_partitions_below_one_before_writing(tmp_path, partitions):
    manifest = _one_source(tmp_path / "corpus", ["the same words in one document", "the same words in one document"])
    with pytest.raises(DataInputError, match="partitions"):
        curate(manifest, tmp_path / "cur", taggers=["exact"], partitions=partitions)
    assert not (tmp_path / "cur").exists()


def _copies_and_others(rng: np.random.Generator, copies: int, others: int, d: int = 256) -> np.ndarray:
    return np.vstack([rng.normal(size=(others, d)), np.repeat(rng.normal(size=(1, d)), copies, axis=0)]).astype(
        np.float32)


def test_equal_embeddings_keep_the_smallest_id_in_any_input_order():
    """Equal embeddings tie on their cosine to the centroid wherever they stand, so the smallest id is kept."""
    rng = np.random.default_rng(0)
    for copies, others in [(26, 25), (5, 13), (38, 7), (17, 29), (9, 3), (31, 20)]:
        x = _copies_and_others(rng, copies, others)
        ids = [f"d{k:03d}" for k in range(len(x))]
        centroid = rng.normal(size=(1, x.shape[1])).astype(np.float32)
        labels = np.zeros(len(x), dtype=np.int64)
        for trial in range(4):
            perm = rng.permutation(len(x)) if trial else np.arange(len(x))
            _, keep = semantic_duplicates([ids[i] for i in perm], x[perm], labels, centroid)
            kept = {ids[perm[i]] for i in np.flatnonzero(keep)}
            assert sorted(kept) == ids[:others] + [ids[others]]  # the others, and the first of the copies


def test_equal_embeddings_are_duplicates_at_eps_zero():
    rng = np.random.default_rng(1)
    for _ in range(20):
        x = _copies_and_others(rng, 3, 4)
        cluster, keep = semantic_duplicates([f"d{k}" for k in range(7)], x, np.zeros(7, dtype=np.int64),
                                            rng.normal(size=(1, 256)).astype(np.float32), eps=0.0)
        assert len(set(cluster[4:].tolist())) == 1 and keep[4:].sum() == 1 and keep[:4].all()


def test_diversity_refuses_an_infinite_clip_ratio():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(6, 8)).astype(np.float32)
    labels = np.array([0, 0, 0, 0, 0, 1])  # a document alone in its topic gets clip_ratio
    with pytest.raises(ValueError, match="clip_ratio must be finite"):
        diversity_weights(x, labels, rng.normal(size=(2, 8)).astype(np.float32), clip_ratio=float("inf"))


def test_fit_topics_names_a_negative_seed():
    x = np.random.default_rng(0).normal(size=(10, 4)).astype(np.float32)
    with pytest.raises(ValueError, match="seed must be a non-negative int"):
        fit_topics(x, 2, -1)


@pytest.mark.parametrize("heldout_fraction", [0.05, 0.2, 0.5, 0.6, 0.9])
def test_min_documents_is_enough_to_train_and_one_fewer_is_refused(heldout_fraction):
    n = min_documents(heldout_fraction)

    def texts(word: str, k: int) -> list[str]:
        return [f"{word} {word}{i}" for i in range(k)]

    model = train_quality_classifier(texts("good", n), texts("bad", n), 0, heldout_fraction=heldout_fraction)
    counts = model.counts
    assert min(counts.values()) >= 1 and sum(counts.values()) == 2 * n
    if n > 1:
        with pytest.raises(DataInputError, match="too few"):
            train_quality_classifier(texts("good", n - 1), texts("bad", n - 1), 0, heldout_fraction=heldout_fraction)


def test_semantic_removed_samples_show_the_document_their_cluster_kept(tmp_path):
    rng = np.random.default_rng(0)
    texts = [random_text(rng, 80) for _ in range(12)]
    texts[5] = texts[9] = texts[2]
    manifest = _one_source(tmp_path / "corpus", texts)
    curate(manifest, tmp_path / "cur", taggers=["semantic"], partitions=2)
    attrs = read_npz(tmp_path / "cur" / "attributes" / "semantic" / "a-00000.npz")
    ids = [str(i) for i in read_npz(tmp_path / "cur" / "units" / "a-00000.npz")["id"]]
    report = removed_samples(tmp_path / "cur", "semantic", 20)
    assert report["removed"] == int((~attrs["keep"]).sum()) >= 2  # two of the three copies at least
    for sample in report["samples"]:
        kept = sample["kept"]
        assert kept is not None, sample["id"]
        row, kept_row = ids.index(sample["id"]), ids.index(kept["id"])
        assert attrs["keep"][kept_row] and attrs["cluster"][kept_row] == attrs["cluster"][row]


def test_a_rerun_removes_the_temporaries_a_killed_curation_left_in_its_own_folders(tmp_path):
    """A SIGKILL between a temporary's write and its rename leaves it (a done marker's, a work file's): the
    next curate of the same directory removes those of dead processes, in every folder curate writes."""
    import subprocess
    import sys

    write_corpus(tmp_path / "corpus", files_per_source=1, docs_per_file=25, seed=1)
    manifest = tmp_path / "corpus" / "manifest.yaml"
    out = tmp_path / "cur"
    curate(manifest, out, taggers=["exact"])
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True).stdout.strip()  # a pid that has exited
    left = [out / "done" / "near.scan" / f".a-00003.json.tmp{dead}", out / "work" / "exact" / "keys" / "p00001" /
            f".web-00000.npz.tmp{dead}", out / "attributes" / "exact" / f".web-00000.npz.tmp{dead}"]
    mine = out / "done" / "notes.txt.tmp1"  # not a temporary's name: a user's, left alone
    for path in [*left, mine]:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("half")
    curate(manifest, out, taggers=["exact"])
    assert not [p for p in left if p.exists()] and mine.exists()


CHANGED = "the manifest or its files changed since they were curated: curate again into a new directory"


def test_inspect_refuses_a_curation_whose_files_changed_as_mix_does(tmp_path, monkeypatch):
    write_corpus(tmp_path / "corpus")
    manifest = tmp_path / "corpus" / "manifest.yaml"
    curate(manifest, tmp_path / "cur", taggers=["exact"], partitions=2)
    mix(tmp_path / "cur", Rules(exact_duplicates="keep_one"), tmp_path / "arm")
    assert removed_samples(tmp_path / "cur", "exact", 1)["removed"] == 1
    key = json.loads((tmp_path / "cur" / "curation.json").read_text())["manifest_key"]
    # a file that sorts first in source a's glob: every later file's unit number moves
    (tmp_path / "corpus" / "a+.jsonl").write_text(json.dumps({"id": "new-1", "text": "a file added later"}) + "\n")
    with pytest.raises(DataInputError) as mixed:
        mix(tmp_path / "cur", Rules(exact_duplicates="keep_one"), tmp_path / "arm2")
    assert mixed.value.detail == CHANGED
    for directory, step in ((tmp_path / "cur", "exact"), (tmp_path / "arm", "exact_duplicates")):
        with pytest.raises(DataInputError) as err:
            removed_samples(directory, step, 1)
        assert (err.value.detail, err.value.where) == (CHANGED, mixed.value.where)
    # an edit the content key misses (it fingerprints files by size, mtime and their ends) moves the rows: the
    # document read is checked against the id curated there, as mix checks it
    (tmp_path / "corpus" / "a+.jsonl").unlink()
    monkeypatch.setattr("rungs.data.manifest.Manifest.content_hash", lambda self: key)
    a0 = tmp_path / "corpus" / "a0.jsonl"
    a0.write_text("".join(a0.read_text().splitlines(keepends=True)[::-1]))
    with pytest.raises(DataInputError, match="the file changed since it was curated") as err:
        removed_samples(tmp_path / "cur", "exact", 1)
    assert err.value.where == str(a0)


def _saved_model(path: Path) -> Path:
    return train_quality_classifier([f"good text {k}" for k in range(5)], [f"bad words {k}" for k in range(5)],
                                    0).save(path)


@pytest.mark.parametrize("flags, line", [
    (["--quality-positive", "a"], "--quality-positive: needs --quality-negative SOURCES too"),
    (["--quality-negative", "b"], "--quality-negative: needs --quality-positive SOURCES too"),
    (["--taggers", "exact", "--quality-positive", "a"], "--quality-positive: needs --quality-negative SOURCES too"),
    (["--quality-positive", "a", "--quality-negative", "b,a"], "--quality-negative: source(s) ['a'] also given to "
                                                               "--quality-positive"),
    (["--quality-model", "MODEL", "--quality-positive", "a", "--quality-negative", "b"],
     "--quality-model: a saved classifier scores as it is, so --quality-positive and --quality-negative would be "
     "ignored"),
])
def test_quality_flags_that_would_be_ignored_or_train_nothing_are_refused(tmp_path, capsys, flags, line):
    from ladder.cli import main

    write_corpus(tmp_path / "corpus", files_per_source=1, docs_per_file=12)
    model = _saved_model(tmp_path / "model")
    argv = ["data", "curate", str(tmp_path / "corpus" / "manifest.yaml"), "--out", str(tmp_path / "cur"),
            *[str(model) if f == "MODEL" else f for f in flags]]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and line in err and "Traceback" not in err, err
    assert not (tmp_path / "cur").exists()  # before any tagger runs


def test_one_classifier_flag_alone_completes_the_sources_a_directory_was_tagged_with(tmp_path):
    write_corpus(tmp_path / "corpus", files_per_source=1, docs_per_file=12)
    manifest, out = tmp_path / "corpus" / "manifest.yaml", tmp_path / "cur"
    with pytest.raises(DataInputError, match="needs --quality-negative") as err:
        curate(manifest, out, model_options=ModelOptions(quality_positive=("a",)))
    assert err.value.field == "--quality-positive"
    curate(manifest, out, taggers=["quality"], model_options=ModelOptions(quality_positive=("a",),
                                                                          quality_negative=("b",)))
    meta = curate(manifest, out, taggers=["quality"], model_options=ModelOptions(quality_positive=("a",)))
    assert meta["settings"]["quality"] == {"model": None, "positive": ["a"], "negative": ["b"]}
