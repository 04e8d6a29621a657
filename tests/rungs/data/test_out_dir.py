"""`ladder data prepare` never deletes a file it did not write: an `--out` holding the inputs or anyone's
files is refused (exit 2, one line, nothing touched), a prepared directory of another manifest needs
`--overwrite` (which replaces only prepare's own files), and cleanup removes only prepare's temporaries."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from ladder.cli import main
from rungs.data.errors import DataInputError
from rungs.data.prepare import prepare

from .conftest import make_docs, tree_bytes, write_jsonl

BYTE = ["--tokenizer", "byte", "--vocab-size", "257"]


def _layout(root):
    """A user's corpus as the defect found it: raw files in lay/train/ and lay/eval/, the manifest in lay/."""
    write_jsonl(root / "train" / "a.jsonl", make_docs("a", 30, seed=1))
    write_jsonl(root / "eval" / "x.jsonl", make_docs("x", 6, seed=3, span=(12_000, 20_000)))
    (root / "train" / "mine.txt").write_text("a user's own text document\n")
    manifest = root / "manifest.yaml"
    manifest.write_text("name: lay\nsources:\n  - {name: a, domain: web, share: 0.7, files: [train/a.jsonl]}\n"
                        "  - {name: t, domain: web, share: 0.3, files: [train/mine.txt]}\n"
                        "eval:\n  - {domain: x, files: [eval/x.jsonl]}\n")
    return manifest


def _refused(argv, capsys) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    return err


@pytest.mark.parametrize("out", [".", "train", "train/sub", "eval"])
def test_an_out_holding_or_among_the_inputs_is_refused_and_nothing_is_touched(out, tmp_path, capsys):
    manifest = _layout(tmp_path / "lay")
    before = tree_bytes(tmp_path)
    err = _refused(["data", "prepare", str(manifest), "--out", str(tmp_path / "lay" / out), *BYTE], capsys)
    assert "out: holds or sits among the manifest's input files" in err
    assert tree_bytes(tmp_path) == before
    assert not (tmp_path / "lay" / "train" / "sub").exists()


def test_an_out_beside_the_inputs_in_the_manifests_folder_is_prepared(tmp_path, capsys):
    manifest = _layout(tmp_path / "lay")
    before = tree_bytes(tmp_path / "lay")
    assert main(["data", "prepare", str(manifest), "--out", str(tmp_path / "lay" / "prepared"), *BYTE, "--json"]) == 0
    assert {k: v for k, v in tree_bytes(tmp_path / "lay").items() if not k.startswith("prepared/")} == before


def test_a_non_empty_directory_that_prepare_did_not_write_is_refused(tiny_manifest, tmp_path, capsys):
    out = tmp_path / "cp_corpus"
    (out / "train").mkdir(parents=True)
    (out / "train" / "mine.txt").write_text("keep me")
    err = _refused(["data", "prepare", str(tiny_manifest), "--out", str(out), *BYTE], capsys)
    assert f"{out}: out: is not empty and not a prepared directory" in err
    assert tree_bytes(out) == {"train/mine.txt": b"keep me"}
    (out / "train" / "mine.txt").unlink()  # empty folders are empty: prepared into
    assert main(["data", "prepare", str(tiny_manifest), "--out", str(out), *BYTE, "--json"]) == 0


def test_another_manifest_needs_overwrite_which_replaces_only_prepares_own_files(tiny_manifest, tmp_path, capsys):
    out = tmp_path / "out"
    prepare(tiny_manifest, out, vocab_size=257, tokenizer="byte")
    (out / "train" / "a" / "notes.md").write_text("mine")  # a user's files inside a prepared directory
    (out / "README").write_text("mine too")
    other = tmp_path / "other"
    write_jsonl(other / "c.jsonl", make_docs("c", 20, seed=5))
    write_jsonl(other / "y.jsonl", make_docs("y", 5, seed=6, span=(12_000, 20_000)))
    (other / "m.yaml").write_text("name: other\nsources:\n  - {name: c, domain: web, share: 1.0, files: [c.jsonl]}\n"
                                  "eval:\n  - {domain: y, files: [y.jsonl]}\n")
    before = tree_bytes(out)
    err = _refused(["data", "prepare", str(other / "m.yaml"), "--out", str(out), *BYTE], capsys)
    assert f"holds a corpus prepared from {tiny_manifest}" in err and "--overwrite" in err
    assert tree_bytes(out) == before
    _refused(["data", "prepare", str(tiny_manifest), "--out", str(out), "--vocab-size", "300"], capsys)  # other vocab
    assert tree_bytes(out) == before

    assert main(["data", "prepare", str(other / "m.yaml"), "--out", str(out), *BYTE, "--overwrite", "--json"]) == 0
    fresh = prepare(other / "m.yaml", tmp_path / "fresh", vocab_size=257, tokenizer="byte")
    got = tree_bytes(out)
    assert got.pop("train/a/notes.md") == b"mine" and got.pop("README") == b"mine too"
    assert {k: v for k, v in got.items() if k != "progress.json"} == \
           {k: v for k, v in tree_bytes(fresh).items() if k != "progress.json"}


def test_a_stale_temporary_of_prepare_is_removed_and_a_lookalike_of_the_user_is_kept(tiny_manifest, tmp_path):
    out = tmp_path / "out"
    prepare(tiny_manifest, out, vocab_size=257, tokenizer="byte")
    (out / "meta.json").unlink()  # as if killed before the end
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    pid = int(dead.stdout)  # a process that has exited: its temporaries are stale
    assert pid != os.getpid()
    ours = out / "train" / "a" / f".00000-0000.tokens.npy.tmp{pid}"
    ours.write_bytes(b"half a shard")
    theirs = [out / "train" / "a" / f".notes.txt.tmp{pid}", out / "train" / "a" / "deep" / f".x.json.tmp{pid}"]
    for path in theirs:
        path.parent.mkdir(exist_ok=True)
        path.write_text("the user's")
    prepare(tiny_manifest, out, vocab_size=257, tokenizer="byte")
    assert not ours.exists() and all(p.read_text() == "the user's" for p in theirs)


def test_the_library_refuses_before_creating_anything(tmp_path):
    manifest = _layout(tmp_path / "lay")
    with pytest.raises(DataInputError, match="holds or sits among"):
        prepare(manifest, tmp_path / "lay" / "train" / "new", vocab_size=257, tokenizer="byte")
    assert not (tmp_path / "lay" / "train" / "new").exists()


def test_an_unreadable_meta_json_of_a_prepared_directory_is_prepared_again(tiny_manifest, tmp_path, capsys):
    out = tmp_path / "out"
    prepare(tiny_manifest, out, vocab_size=257, tokenizer="byte")
    (out / "README").write_text("mine")
    before = tree_bytes(out)
    (out / "meta.json").write_text("{")
    assert main(["data", "prepare", str(tiny_manifest), "--out", str(out), *BYTE, "--json"]) == 0
    assert tree_bytes(out) == before
    # An unreadable progress.json beside a meta.json of other inputs: nothing says it is the same corpus
    # (--overwrite needed), and progress starts over.
    (out / "progress.json").write_text("[")
    (out / "meta.json").write_text(json.dumps({**json.loads(before["meta.json"]), "key": "another input key"}))
    _refused(["data", "prepare", str(tiny_manifest), "--out", str(out), *BYTE], capsys)
    assert main(["data", "prepare", str(tiny_manifest), "--out", str(out), *BYTE, "--overwrite", "--json"]) == 0
    got = tree_bytes(out)
    assert got.pop("progress.json") and {k: v for k, v in before.items() if k != "progress.json"} == got


def test_a_directory_whose_records_are_both_unreadable_is_refused_naming_them(tiny_manifest, tmp_path, capsys):
    out = tmp_path / "out"
    prepare(tiny_manifest, out, vocab_size=257, tokenizer="byte")
    (out / "meta.json").write_text("{")
    (out / "progress.json").write_text("{")
    before = tree_bytes(out)
    err = _refused(["data", "prepare", str(tiny_manifest), "--out", str(out), *BYTE], capsys)
    assert f"{out}: out: is not empty and not a prepared directory (its meta.json and progress.json cannot be " \
           "read as prepare's records)" in err
    assert tree_bytes(out) == before


@pytest.mark.parametrize("old_records", [False, True])
def test_a_tokenizer_json_prepare_did_not_write_is_never_replaced(old_records, tiny_manifest, tmp_path, capsys):
    """A byte corpus writes no tokenizer.json: one there is the user's, kept by a byte prepare and in the way
    of one that writes a tokenizer (refused, even with --overwrite). `old_records`: a byte prepare's list of
    the files it writes that (as before this was fixed) names tokenizer.json proves nothing."""
    out = tmp_path / "out"
    prepare(tiny_manifest, out, vocab_size=257, tokenizer="byte")
    if old_records:
        progress = json.loads((out / "progress.json").read_text())
        progress["steps"]["owned"]["files"].append("tokenizer.json")
        (out / "progress.json").write_text(json.dumps(progress))
    (out / "tokenizer.json").write_text('{"mine": true}')
    before = tree_bytes(out)
    for extra in ([], ["--overwrite"]):
        err = _refused(["data", "prepare", str(tiny_manifest), "--out", str(out), "--vocab-size", "300", *extra],
                       capsys)
        assert tree_bytes(out) == before
    assert f"{out}: out: holds a tokenizer.json that prepare did not write" in err and "move your file" in err
    with pytest.raises(DataInputError, match="holds a tokenizer.json that prepare did not write"):
        prepare(tiny_manifest, out, vocab_size=300, tokenizer="bpe", overwrite=True)
    prepare(tiny_manifest, out, vocab_size=257, tokenizer="byte", shard_bytes=2_000)  # a byte prepare: kept
    assert (out / "tokenizer.json").read_text() == '{"mine": true}'
    (out / "tokenizer.json").unlink()  # moved away: the BPE prepare goes ahead
    assert main(["data", "prepare", str(tiny_manifest), "--out", str(out), "--vocab-size", "300", "--overwrite",
                 "--json"]) == 0
    assert json.loads((out / "tokenizer.json").read_text())["model"]["type"] == "BPE"


def test_a_byte_prepare_over_a_bpe_corpus_removes_the_tokenizer_it_wrote(tiny_manifest, tiny_byte, tmp_path):
    out = tmp_path / "out"
    prepare(tiny_manifest, out, vocab_size=300, tokenizer="bpe")
    assert (out / "tokenizer.json").exists()
    prepare(tiny_manifest, out, vocab_size=257, tokenizer="byte", overwrite=True)
    got, want = tree_bytes(out), tree_bytes(tiny_byte)
    assert got.pop("progress.json") and want.pop("progress.json")
    assert got == want  # no tokenizer.json left from the BPE corpus
