"""Mixing: rules validated at the edge (one line naming the field), an arm that `ladder data prepare` takes,
the kept documents with their original ids and weights, held-out sets untouched."""

from __future__ import annotations

import gzip
import json
import shutil
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from curation.mix import mix
from curation.model_taggers import ModelOptions
from curation.pipeline import curate
from curation.rules import Rules, check_sources, load_rules
from curation.semantic import diversity_weights
from curation.store import Store, read_npz, units_of, write_npz
from ladder.cli import main
from rungs.data.errors import DataInputError
from rungs.data.manifest import load_manifest
from tests.curation.corpus import write_corpus


@pytest.fixture(scope="module")
def curated(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("mix")
    write_corpus(root / "corpus")
    curate(root / "corpus" / "manifest.yaml", root / "cur", taggers=["exact", "near"], partitions=4)
    return root


@pytest.mark.parametrize("text, field", [
    ("near_duplicates: keep_two", "near_duplicates"),
    ("quality: {source: a, keep_top: 1.5}", "quality.keep_top"),
    ("quality: [{source: a, keep_top: 0.5, extra: 1}]", "quality.0.extra"),
    ("nearduplicates: keep_one", "nearduplicates"),
    ("diversity: keep", "diversity"),
])
def test_a_bad_rule_is_one_line_naming_the_field_and_exit_2(curated, tmp_path, capsys, text, field):
    rules = tmp_path / "rules.yaml"
    rules.write_text(text + "\n")
    assert main(["data", "mix", str(curated / "cur"), "--rules", str(rules), "--out", str(tmp_path / "arm")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{rules}: {field}: " in err and "Traceback" not in err
    assert not (tmp_path / "arm").exists()


@pytest.mark.parametrize("quality, field", [
    ([{"source": "a", "keep_top": 0.5}, {"source": "a", "keep_top": 0.5}], "quality.1.source"),
    ([{"source": ["a", "b"], "keep_top": 0.5}, {"keep_top": 0.9}], "quality.1.source"),
])
def test_a_source_with_two_quality_rules_is_refused(quality, field):
    # Two keep_top 0.5 on one source would keep a quarter of it, not the half either rule says.
    with pytest.raises(DataInputError, match="is named twice") as err:
        check_sources(Rules(quality=quality), ["a", "b"], "rules.yaml")
    assert err.value.field == field
    check_sources(Rules(quality=[{"source": "a", "keep_top": 0.5}, {"source": "b", "keep_top": 0.2}]), ["a", "b"],
                  "rules.yaml")  # one rule per source: accepted


def test_a_source_twice_in_one_rule_and_an_empty_source_list_are_refused():
    with pytest.raises(DataInputError, match="'a' is named twice \\(earlier in this rule's list\\)") as err:
        check_sources(Rules(quality={"source": ["a", "a"], "keep_top": 0.5}), ["a", "b"], "rules.yaml")
    assert err.value.field == "quality.source"
    with pytest.raises(DataInputError, match="names no source") as err:  # it filtered nothing, unsaid
        check_sources(Rules(quality={"source": [], "keep_top": 0.5}), ["a", "b"], "rules.yaml")
    assert err.value.field == "quality.source"


def test_a_rule_without_its_attributes_names_the_tagger_to_run(curated, tmp_path):
    rules = tmp_path / "rules.yaml"
    rules.write_text("semantic_duplicates: keep_one\n")
    with pytest.raises(DataInputError, match="--taggers semantic"):
        mix(curated / "cur", load_rules(rules), tmp_path / "arm", rules_path=str(rules))
    rules.write_text("quality: {keep_top: 0.5}\n")
    with pytest.raises(DataInputError, match="--taggers quality"):
        mix(curated / "cur", load_rules(rules), tmp_path / "arm", rules_path=str(rules))


def test_an_arm_keeps_one_of_each_cluster_and_prepares_like_any_manifest(curated, tmp_path, capsys):
    rules = tmp_path / "rules.yaml"
    rules.write_text("name: dedup\nexact_duplicates: keep_one\nnear_duplicates: keep_one\n")
    arm = tmp_path / "arm"
    assert main(["data", "mix", str(curated / "cur"), "--rules", str(rules), "--out", str(arm), "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert [s["rule"] for s in payload["steps"]] == ["exact_duplicates", "near_duplicates"]
    assert payload["steps"][0]["sources"]["a"]["docs_removed"] == 1
    assert payload["steps"][1]["sources"]["a"]["docs_removed"] + payload["steps"][1]["sources"]["b"]["docs_removed"] == 2
    assert payload["kept"]["a"]["docs"] + payload["kept"]["b"]["docs"] == 120 - 3
    manifest = load_manifest(arm / "manifest.yaml")
    original = load_manifest(curated / "corpus" / "manifest.yaml")
    assert [tuple(f.resolve() for f in e.files) for e in manifest.eval_sets] == [e.files for e in original.eval_sets]
    assert [s.share for s in manifest.sources] == [0.5, 0.5]
    kept_ids = {d.doc_id for s in manifest.sources for d in s.documents()}
    all_ids = {d.doc_id for s in original.sources for d in s.documents()}
    assert kept_ids < all_ids and len(kept_ids) == 117 and "b1.jsonl:30" in kept_ids
    out = tmp_path / "prepared"
    assert main(["data", "prepare", str(arm / "manifest.yaml"), "--out", str(out), "--tokenizer", "byte",
                 "--json"]) == 0
    prepared = json.loads(capsys.readouterr().out)
    assert prepared["sources"]["a"]["docs"] + prepared["sources"]["b"]["docs"] == 117
    # a second mix into the same arm is its own directory: allowed; a foreign one is refused
    assert main(["data", "mix", str(curated / "cur"), "--rules", str(rules), "--out", str(arm), "--json"]) == 0
    capsys.readouterr()
    assert main(["data", "mix", str(curated / "cur"), "--rules", str(rules), "--out", str(out)]) == 2


def test_rules_that_choose_different_copies_still_keep_one_of_every_cluster(curated, tmp_path, capsys):
    # Two dedup taggers may keep different copies of one duplicate pair (near keeps the smallest uid,
    # semantic the document farthest from its centroid); each rule applied its tagger's choice over all
    # documents, and the pair lost both. Here exact's choice is flipped to each cluster's largest uid.
    cur = tmp_path / "cur"
    shutil.copytree(curated / "cur", cur)
    store = Store(cur)
    units = units_of(load_manifest(curated / "corpus" / "manifest.yaml"))
    exact = {u.name: read_npz(store.attributes("exact", u.name)) for u in units}
    uid = {u.name: read_npz(store.unit_index(u.name))["uid"] for u in units}
    largest: dict[int, int] = {}
    for u in units:
        for c, d in zip(exact[u.name]["cluster"].tolist(), uid[u.name].tolist()):
            largest[c] = max(largest.get(c, d), d)
    assert len(largest) < sum(len(v) for v in uid.values())  # the corpus has an exact duplicate
    for u in units:
        flipped = np.array([largest[c] == d for c, d in zip(exact[u.name]["cluster"].tolist(), uid[u.name].tolist())])
        write_npz(store.attributes("exact", u.name), cluster=exact[u.name]["cluster"], keep=flipped)
    rules = tmp_path / "rules.yaml"
    rules.write_text("exact_duplicates: keep_one\nnear_duplicates: keep_one\n")
    assert main(["data", "mix", str(cur), "--rules", str(rules), "--out", str(tmp_path / "arm"), "--json"]) == 0
    capsys.readouterr()
    kept = {d.doc_id for s in load_manifest(tmp_path / "arm" / "manifest.yaml").sources for d in s.documents()}
    # every near cluster (exact duplicates are near duplicates too) keeps exactly one document
    near_of = {}
    for u in units:
        index = read_npz(store.unit_index(u.name))
        near_of.update(zip(index["id"].tolist(), read_npz(store.attributes("near", u.name))["cluster"].tolist()))
    kept_per_cluster = Counter(near_of[i] for i in kept)
    assert set(kept_per_cluster) == set(near_of.values()) and set(kept_per_cluster.values()) == {1}
    assert len(kept) == 117  # as with the taggers' own choices (the test above)


def test_inspect_of_an_arm_shows_the_copy_the_arm_kept_not_the_taggers_choice(curated, tmp_path, capsys):
    """A near cluster {R, A, B} whose tagger's choice R an earlier rule (exact) removed: the arm keeps A (the
    smallest surviving uid) and removes B, and `inspect ARM --removed near_duplicates` shows B next to A, a
    document of the arm (it showed R, which the arm does not hold)."""
    cur = tmp_path / "cur"
    shutil.copytree(curated / "cur", cur)
    store = Store(cur)
    units = units_of(load_manifest(curated / "corpus" / "manifest.yaml"))
    exact = {u.name: read_npz(store.attributes("exact", u.name)) for u in units}
    index = {u.name: read_npz(store.unit_index(u.name)) for u in units}
    r_unit, r_row = next((u.name, int(r)) for u in units for r in np.flatnonzero(~exact[u.name]["keep"]))
    survivors = sorted(((int(index[u.name]["uid"][r]), u.name, int(r)) for u in units
                        for r in np.flatnonzero(exact[u.name]["keep"])))[:2]
    (_, a_unit, a_row), (_, b_unit, b_row) = survivors
    for u in units:
        n = len(index[u.name]["uid"])
        cluster, keep = index[u.name]["uid"].copy(), np.ones(n, bool)
        for name, row in ((r_unit, r_row), (a_unit, a_row), (b_unit, b_row)):
            if name == u.name:
                cluster[row], keep[row] = 12345, (name, row) == (r_unit, r_row)
        write_npz(store.attributes("near", u.name), cluster=cluster, keep=keep)
    rules = tmp_path / "rules.yaml"
    rules.write_text("exact_duplicates: keep_one\nnear_duplicates: keep_one\n")
    arm = tmp_path / "arm"
    assert main(["data", "mix", str(cur), "--rules", str(rules), "--out", str(arm), "--json"]) == 0
    capsys.readouterr()
    kept = {d.doc_id for s in load_manifest(arm / "manifest.yaml").sources for d in s.documents()}
    doc_id = {(u.name, int(r)): str(i) for u in units for r, i in enumerate(index[u.name]["id"].tolist())}
    assert doc_id[a_unit, a_row] in kept and doc_id[b_unit, b_row] not in kept and doc_id[r_unit, r_row] not in kept
    assert main(["data", "inspect", str(arm), "--removed", "near_duplicates", "-n", "50", "--json"]) == 0
    samples = {s["id"]: s for s in json.loads(capsys.readouterr().out)["samples"]}
    assert samples[doc_id[b_unit, b_row]]["kept"]["id"] == doc_id[a_unit, a_row]
    assert all(s["kept"] is None or s["kept"]["id"] in kept for s in samples.values())


def test_inspect_shows_removed_documents_with_the_one_kept(curated, capsys):
    assert main(["data", "inspect", str(curated / "cur"), "--removed", "near", "-n", "5", "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert payload["removed"] == 3 and len(payload["samples"]) == 3
    assert all(s["kept"] is not None and s["kept"]["id"] != s["id"] for s in payload["samples"])
    assert main(["data", "inspect", str(curated / "cur"), "--removed", "topics"]) == 2


def test_a_weight_rule_writes_each_kept_documents_weight(tmp_path):
    root = tmp_path
    write_corpus(root / "corpus", files_per_source=1, docs_per_file=25)
    # five topics, so that the partitions hold different ones
    options = ModelOptions(n_topics=5)
    curate(root / "corpus" / "manifest.yaml", root / "cur", taggers=["semantic"], partitions=2, model_options=options)
    rules = root / "rules.yaml"
    rules.write_text("semantic_duplicates: keep_one\ndiversity: weight\n")
    mix(root / "cur", load_rules(rules), root / "arm")
    records = [json.loads(line) for f in sorted((root / "arm" / "data").rglob("*.jsonl.gz"))
               for line in gzip.open(f, "rt")]
    assert records and all(r["weight"] > 0 for r in records)
    meta = json.loads((root / "cur" / "curation.json").read_text())
    assert set(meta["taggers"]) == {"topics", "semantic"}  # semantic brings the topics it needs
    # The weights are the whole corpus's (one scale), not each partition's: another partition count (which
    # `--workers` sets) gives the same weights, and they are `diversity_weights` over every document at once.
    curate(root / "corpus" / "manifest.yaml", root / "cur5", taggers=["semantic"], partitions=5, model_options=options)
    units = [u["unit"] for u in meta["units"]]
    weights = {p: np.concatenate([read_npz(root / p / "attributes" / "diversity" / f"{u}.npz")["weight"] for u in units])
               for p in ("cur", "cur5")}
    np.testing.assert_array_equal(weights["cur"], weights["cur5"])
    parts = [read_npz(f) for f in sorted((root / "cur" / "work" / "semantic" / "by_topic").glob("p*/*.npz"))]
    uid = np.concatenate([p["uid"] for p in parts])
    reference = diversity_weights(np.concatenate([p["x"] for p in parts]), np.concatenate([p["topic"] for p in parts]),
                                  np.load(root / "cur" / "work" / "topics" / "centroids.npy"))
    by_uid = dict(zip(uid.tolist(), reference.tolist()))
    corpus_uid = np.concatenate([read_npz(root / "cur" / "units" / f"{u}.npz")["uid"] for u in units])
    np.testing.assert_allclose(weights["cur"], [by_uid[u] for u in corpus_uid.tolist()], rtol=1e-12)


def test_subsample_keeps_the_same_random_fraction_of_every_source(curated, tmp_path, capsys):
    """The control arm of a data ablation: a fraction of each source, the documents with the smallest uids (a hash of
    source and id, so independent of the text and of the file layout), after the other filters."""
    from curation.ids import doc_uid

    rules = tmp_path / "rules.yaml"
    rules.write_text("name: half\nexact_duplicates: keep_one\nsubsample: 0.5\n")
    arm = tmp_path / "arm"
    assert main(["data", "mix", str(curated / "cur"), "--rules", str(rules), "--out", str(arm), "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert [s["rule"] for s in payload["steps"]] == ["exact_duplicates", "subsample"]
    rules.write_text("exact_duplicates: keep_one\n")
    exact_only = tmp_path / "exact"
    assert main(["data", "mix", str(curated / "cur"), "--rules", str(rules), "--out", str(exact_only)]) == 0
    alive = load_manifest(exact_only / "manifest.yaml")
    kept = load_manifest(arm / "manifest.yaml")
    for before, after in zip(alive.sources, kept.sources):
        ids = sorted((d.doc_id for d in before.documents()), key=lambda i: doc_uid(before.name, i))
        expected = set(ids[:-(-len(ids) // 2)])
        assert {d.doc_id for d in after.documents()} == expected
        assert payload["kept"][before.name]["docs"] == len(expected) < len(ids)
    rules.write_text("subsample: 0\n")
    assert main(["data", "mix", str(curated / "cur"), "--rules", str(rules), "--out", str(tmp_path / "z")]) == 2
    assert "subsample" in capsys.readouterr().err


def _files(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def mirrored(tmp_path_factory) -> Path:
    """The tiny corpus plus a source `mirror` whose one document is an exact copy of one in `a` that exact
    dedup keeps over it (a larger uid): `exact_duplicates: keep_one` leaves `mirror` empty."""
    from curation.ids import doc_uid

    root = tmp_path_factory.mktemp("mirror")
    write_corpus(root / "corpus")
    first = json.loads((root / "corpus" / "a0.jsonl").read_text().splitlines()[3])  # a planted duplicate's text
    floor = min(doc_uid("a", i) for i in ("a/f0-d3", "a/f0-d7"))
    mirror_id = next(f"m{k}" for k in range(1000) if doc_uid("mirror", f"m{k}") > floor)
    (root / "corpus" / "m.jsonl").write_text(json.dumps({"id": mirror_id, "text": first["text"]}) + "\n")
    manifest = root / "corpus" / "manifest.yaml"
    manifest.write_text(manifest.read_text().replace("eval:", "  - {name: mirror, domain: a, share: 0.1, "
                                                                "files: [m.jsonl]}\neval:")
                        .replace("share: 0.5", "share: 0.45"))
    curate(manifest, root / "cur", taggers=["exact"], partitions=2)
    (root / "all.yaml").write_text("name: all\n")
    (root / "dedup.yaml").write_text("exact_duplicates: keep_one\n")
    (root / "half.yaml").write_text("subsample: 0.5\n")
    return root


def test_a_rejected_mix_writes_nothing_and_a_remix_touches_only_what_mix_wrote(mirrored, tmp_path, capsys):
    cur, arm = mirrored / "cur", tmp_path / "arm"
    assert main(["data", "mix", str(cur), "--rules", str(mirrored / "all.yaml"), "--out", str(arm)]) == 0
    (arm / "data" / "notes.txt").write_text("mine")  # the user's files, beside and inside mix's folders
    (arm / "data" / "mirror" / "keep.jsonl.gz").write_bytes(b"mine too")
    before = _files(arm)
    capsys.readouterr()
    # the rules empty `mirror`: refused, and the arm is byte for byte what it was
    assert main(["data", "mix", str(cur), "--rules", str(mirrored / "dedup.yaml"), "--out", str(arm)]) == 2
    err = capsys.readouterr().err
    assert "keep no document of source(s) ['mirror']" in err and err.count("\n") == 1
    assert _files(arm) == before
    # into a new directory: nothing is left behind, so the directory stays usable
    fresh = tmp_path / "fresh"
    assert main(["data", "mix", str(cur), "--rules", str(mirrored / "dedup.yaml"), "--out", str(fresh)]) == 2
    assert not fresh.exists()
    assert main(["data", "mix", str(cur), "--rules", str(mirrored / "all.yaml"), "--out", str(fresh)]) == 0
    capsys.readouterr()
    # a re-mix with other rules replaces mix's own files and keeps the user's
    assert main(["data", "mix", str(cur), "--rules", str(mirrored / "half.yaml"), "--out", str(arm), "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    after = _files(arm)
    assert after["data/notes.txt"] == b"mine" and after["data/mirror/keep.jsonl.gz"] == b"mine too"
    assert sorted(payload["files"]) == sorted(f for f in after if f.startswith(("data/", "removed/"))
                                              and f not in ("data/notes.txt", "data/mirror/keep.jsonl.gz"))
    assert [f for f in after if f.startswith("removed/")] == ["removed/subsample.npz"]
    assert not (arm / ".mix-staging").exists()
    kept = {d.doc_id for s in load_manifest(arm / "manifest.yaml").sources if s.name != "mirror"
            for d in s.documents()}
    assert len(kept) == payload["kept"]["a"]["docs"] + payload["kept"]["b"]["docs"]


def test_inspect_refuses_a_rule_the_arm_does_not_have_after_a_remix(curated, tmp_path, capsys):
    cur, arm = curated / "cur", tmp_path / "arm"
    (tmp_path / "dedup.yaml").write_text("exact_duplicates: keep_one\n")
    (tmp_path / "half.yaml").write_text("subsample: 0.5\n")
    assert main(["data", "mix", str(cur), "--rules", str(tmp_path / "dedup.yaml"), "--out", str(arm)]) == 0
    assert main(["data", "mix", str(cur), "--rules", str(tmp_path / "half.yaml"), "--out", str(arm)]) == 0
    assert sorted(p.name for p in (arm / "removed").iterdir()) == ["subsample.npz"]
    assert main(["data", "inspect", str(arm), "--removed", "subsample", "-n", "1", "--json"]) == 0
    capsys.readouterr()
    assert main(["data", "inspect", str(arm), "--removed", "exact_duplicates"]) == 2
    assert "its rules: ['subsample']" in capsys.readouterr().err


def test_a_crash_while_files_move_leaves_an_arm_the_next_mix_replaces(mirrored, tmp_path, capsys, monkeypatch):
    import os

    import curation.mix as mix_module

    cur, arm = mirrored / "cur", tmp_path / "arm"
    assert main(["data", "mix", str(cur), "--rules", str(mirrored / "all.yaml"), "--out", str(arm)]) == 0
    moves, replace = [], os.replace

    def crash_on_second_move(src, dst):  # out of the staging folder into the arm; other replaces pass
        if ".mix-staging" in str(src) and ".mix-staging" not in str(dst):
            moves.append(dst)
            if len(moves) == 2:
                raise KeyboardInterrupt
        replace(src, dst)

    monkeypatch.setattr(mix_module.os, "replace", crash_on_second_move)
    with pytest.raises(KeyboardInterrupt):
        mix(cur, load_rules(mirrored / "half.yaml"), arm)
    monkeypatch.undo()
    assert json.loads((arm / "arm.json").read_text())["incomplete"] is True
    capsys.readouterr()
    assert main(["data", "inspect", str(arm), "--removed", "subsample"]) == 2
    assert "did not finish" in capsys.readouterr().err
    assert main(["data", "mix", str(cur), "--rules", str(mirrored / "half.yaml"), "--out", str(arm)]) == 0
    reference = tmp_path / "reference"
    assert main(["data", "mix", str(cur), "--rules", str(mirrored / "half.yaml"), "--out", str(reference)]) == 0
    got, want = _files(arm), _files(reference)
    assert {k: v for k, v in got.items() if k not in ("arm.json", "manifest.yaml")} == \
        {k: v for k, v in want.items() if k not in ("arm.json", "manifest.yaml")}


@pytest.fixture(scope="module")
def tagged_semantic(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("weights")
    write_corpus(root / "corpus", files_per_source=2, docs_per_file=25)
    curate(root / "corpus" / "manifest.yaml", root / "cur", taggers=["exact", "near", "semantic"], partitions=2,
           model_options=ModelOptions(n_topics=3))
    return root


def _arm_weights(arm: Path) -> dict[str, float]:
    return {r["id"]: r["weight"] for f in sorted((arm / "data").rglob("*.jsonl.gz"))
            for r in map(json.loads, gzip.open(f, "rt"))}


def _corpus_table(cur: Path) -> dict[str, np.ndarray]:
    """Every document of the curation in uid order: id, uid, embedding, topic, the tagger's weight."""
    meta = json.loads((cur / "curation.json").read_text())
    units = [u["unit"] for u in meta["units"]]
    index = [read_npz(cur / "units" / f"{u}.npz") for u in units]
    table = {"id": np.concatenate([i["id"] for i in index]), "uid": np.concatenate([i["uid"] for i in index]),
             "x": np.concatenate([np.load(cur / "work" / "embed" / f"{u}.npy") for u in units]),
             "topic": np.concatenate([read_npz(cur / "attributes" / "topics" / f"{u}.npz")["topic"] for u in units]),
             "weight": np.concatenate([read_npz(cur / "attributes" / "diversity" / f"{u}.npz")["weight"]
                                       for u in units])}
    order = np.argsort(table["uid"], kind="stable")
    return {k: v[order] for k, v in table.items()}


def test_an_arms_diversity_weights_are_measured_over_the_documents_it_keeps(tagged_semantic):
    root = tagged_semantic
    table = _corpus_table(root / "cur")
    centroids = np.load(root / "cur" / "work" / "topics" / "centroids.npy")
    # weights alone, nothing removed: the curation's own weights, exactly
    mix(root / "cur", Rules(name="w", diversity="weight"), root / "all")
    got = _arm_weights(root / "all")
    np.testing.assert_allclose([got[i] for i in table["id"]], table["weight"], rtol=1e-12)
    # after dedup: diversity_weights of the kept documents' embeddings taken at once (uid order, as the tagger)
    mix(root / "cur", Rules(name="dw", exact_duplicates="keep_one", near_duplicates="keep_one", diversity="weight"),
        root / "dedup")
    got = _arm_weights(root / "dedup")
    kept = np.isin(table["id"], list(got))
    assert 0 < (~kept).sum() < len(kept)
    reference = diversity_weights(table["x"][kept], table["topic"][kept], centroids)
    np.testing.assert_allclose([got[i] for i in table["id"][kept]], reference, rtol=1e-12)
    assert np.mean(reference) == pytest.approx(1.0)
    # the copy a cluster keeps is no longer weighed down by the copies the arm removed
    corpus_scaled = table["weight"][kept] / table["weight"][kept].mean()
    assert np.max(reference / corpus_scaled) > 1.2  # 1.26 on this corpus


def test_an_arm_whose_curation_lost_its_embeddings_is_refused_with_what_to_do(tagged_semantic, tmp_path):
    cur = tmp_path / "cur"
    shutil.copytree(tagged_semantic / "cur", cur)
    shutil.rmtree(cur / "work" / "embed")
    with pytest.raises(DataInputError, match="embeddings or topic centroids are gone"):
        mix(cur, Rules(name="w", diversity="weight"), tmp_path / "arm")
    assert not (tmp_path / "arm").exists()
