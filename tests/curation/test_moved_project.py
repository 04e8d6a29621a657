"""A project folder moved as a whole (`mv project elsewhere`) keeps everything it made: its prepared corpora,
its curation directory, its mixed arms and its trials' keys. Each record keeps the path of what it came from
relative to itself as well as absolute (`rungs.data.relocation`), and a data arm's trial key names its corpus
by content, not by where its manifest lies."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from curation.mix import mix
from curation.pipeline import curate
from curation.report import removed_samples
from curation.rules import Rules
from curation.store import Store
from ladder.plan.corpus_data import check_tokenizer, read_corpus
from rungs.data.prepare import prepare
from sweeps.plan import plan_sweep
from sweeps.spec import load_spec
from tests.curation.corpus import write_corpus
from tests.ladder.tiny_corpus import write_recipe

VOCAB = 512


def _keys(spec: Path) -> dict[tuple, str]:
    return {(p.trial.arm, p.trial.L, p.trial.seed): p.key for p in plan_sweep(load_spec(spec), where=str(spec))}


@pytest.fixture(scope="module")
def moved(tmp_path_factory) -> dict:
    """A project (corpus, curation, a dedup arm, both prepared, a sweep over them) planned, then moved."""
    old = tmp_path_factory.mktemp("old") / "project"
    write_corpus(old / "corpus")
    curate(old / "corpus" / "manifest.yaml", old / "cur", taggers=["exact", "near"], partitions=2)
    mix(old / "cur", Rules(name="dedup", exact_duplicates="keep_one", near_duplicates="keep_one"), old / "arm")
    for manifest, out in ((old / "corpus" / "manifest.yaml", old / "corpus" / "prepared"),
                          (old / "arm" / "manifest.yaml", old / "arm" / "prepared")):
        prepare(manifest, out, vocab_size=VOCAB)
    write_recipe(old / "recipe.yaml", vocab_size=VOCAB, data="corpus/prepared")
    spec = {"name": "moved", "recipe": "recipe.yaml", "seeds": [0],
            "blocks": [{"name": "b", "rungs": [2, 3],
                        "arms": {"baseline": {"data": "corpus/prepared"}, "dedup": {"data": "arm/prepared"}}}]}
    (old / "spec.yaml").write_text(yaml.safe_dump(spec))
    before = _keys(old / "spec.yaml")
    new = tmp_path_factory.mktemp("new") / "renamed"
    shutil.move(str(old), str(new))
    assert not old.exists()
    return {"old": old, "new": new, "keys": before}


def test_a_moved_prepared_corpus_reads_its_manifest_where_it_now_lies(moved):
    for prepared, manifest in (("corpus/prepared", "corpus/manifest.yaml"), ("arm/prepared", "arm/manifest.yaml")):
        corpus = read_corpus(moved["new"] / prepared)
        assert corpus.manifest == (moved["new"] / manifest).resolve()
        assert check_tokenizer(corpus, VOCAB, where="recipe.yaml") == []  # the job would prepare the same key


def test_a_moved_sweep_over_data_arms_keeps_every_trial_key(moved):
    assert _keys(moved["new"] / "spec.yaml") == moved["keys"]


def test_a_moved_arm_names_its_files_relative_to_itself(moved):
    arm = yaml.safe_load((moved["new"] / "arm" / "manifest.yaml").read_text())
    files = [f for e in arm["eval"] for f in e["files"]]
    assert files and all(not Path(f).is_absolute() for f in files)
    assert str(moved["old"]) not in (moved["new"] / "arm" / "manifest.yaml").read_text()


def test_a_moved_curation_mixes_inspects_and_resumes(moved, tmp_path):
    new = moved["new"]
    payload = mix(new / "cur", Rules(name="exact", exact_duplicates="keep_one"), new / "arm2")
    assert sum(k["docs"] for k in payload["kept"].values()) > 0
    samples = removed_samples(new / "arm", "near_duplicates", 2)
    assert samples["samples"], samples
    # curate again at the new place: the same manifest, moved; nothing reruns, and it records where it is now
    meta_before = Store(new / "cur").meta()
    curate(new / "corpus" / "manifest.yaml", new / "cur", taggers=["exact", "near"], partitions=2)
    meta = Store(new / "cur").meta()
    assert meta["manifest"] == str((new / "corpus" / "manifest.yaml").resolve())
    assert meta["taggers"] == meta_before["taggers"]


def test_a_record_from_before_the_relative_path_still_says_what_to_do(moved, tmp_path):
    """A prepared directory written before `manifest_relative` was recorded, then moved: the one-line refusal."""
    from ladder.errors import LadderInputError

    copy = tmp_path / "prepared"
    shutil.copytree(moved["new"] / "corpus" / "prepared", copy)
    progress = json.loads((copy / "progress.json").read_text())
    progress.pop("manifest_relative")
    (copy / "progress.json").write_text(json.dumps(progress))
    meta = json.loads((copy / "meta.json").read_text())
    assert meta["manifest"] == str(moved["old"] / "corpus" / "manifest.yaml")  # as prepared, before the move
    with pytest.raises(LadderInputError, match="no longer exists"):
        read_corpus(copy)


def test_a_copied_project_reads_its_own_manifest_and_a_record_moved_alone_the_original(moved, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(moved["new"], copy)
    assert read_corpus(copy / "corpus" / "prepared").manifest == (copy / "corpus" / "manifest.yaml").resolve()
    assert Store(copy / "cur").manifest_path() == (copy / "corpus" / "manifest.yaml").resolve()
    write_corpus(tmp_path / "here")
    prepare(tmp_path / "here" / "manifest.yaml", tmp_path / "here" / "prepared", vocab_size=257, tokenizer="byte")
    alone = tmp_path / "elsewhere" / "deeper" / "prepared"
    shutil.copytree(tmp_path / "here" / "prepared", alone)  # its relative path leads nowhere from there
    assert read_corpus(alone).manifest == (tmp_path / "here" / "manifest.yaml").resolve()
