"""`ladder data curate` refuses the input `ladder data prepare` refuses, up front and with prepare's message: a
lone surrogate escape, an id twice in a file or across a source's files, an empty file. Exit 2, one line naming
the file; a rerun refuses again until the file is fixed, and after the fix the same --out curates."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest

from curation.mix import mix
from curation.pipeline import curate
from curation.rules import Rules
from curation.store import Store, check_source_ids, read_npz, units_of, write_unit_index
from ladder.cli import main
from rungs.data.errors import DataInputError
from rungs.data.manifest import load_manifest
from tests.curation.corpus import write_corpus

ERROR = "ladder data: error: "


def _error_line(err: str) -> str:
    """The one error line of a failed command (the curation's INFO log lines aside), without its prefix."""
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.startswith(ERROR)]
    assert len(lines) == 1, err
    return lines[0][len(ERROR):]


def _append(path: Path, *records: dict | str) -> None:
    with open(path, "a", encoding="utf-8") as f:
        for r in records:
            f.write((r if isinstance(r, str) else json.dumps(r)) + "\n")


def _surrogate_text(root: Path) -> tuple[Path, str]:
    _append(root / "a1.jsonl", '{"id": "s1", "text": "lone \\ud800 surrogate"}')
    return root / "a1.jsonl", "a: line 31: field 'text' holds a lone surrogate escape (\\ud800 at character 5)"


def _surrogate_id(root: Path) -> tuple[Path, str]:
    _append(root / "a0.jsonl", '{"id": "x\\udc80", "text": "fine text"}')
    return root / "a0.jsonl", "a: line 31: field 'id' holds a lone surrogate escape (\\udc80 at character 1)"


def _surrogate_without_ids(root: Path) -> tuple[Path, str]:
    _append(root / "b0.jsonl", '{"text": "caf\\u00e9 and a lone \\udfff"}')
    return root / "b0.jsonl", "b: line 31: field 'text' holds a lone surrogate escape (\\udfff at character 16)"


def _id_twice_in_a_file(root: Path) -> tuple[Path, str]:
    _append(root / "a0.jsonl", {"id": "twice", "text": "the same text twice"}, {"id": "twice", "text": "the same text twice"})
    return root / "a0.jsonl", "a: document id 'twice' appears twice; ids must be unique within a set"


def _id_in_two_files(root: Path) -> tuple[Path, str]:
    _append(root / "a1.jsonl", {"id": "a/f0-d4", "text": "another text under an id file a0 has"})
    return root / "a1.jsonl", "a: document id 'a/f0-d4' appears twice; ids must be unique within a set"


def _two_ids_repeated(root: Path) -> tuple[Path, str]:
    # x y y x: y is the first id seen twice in file order, x the one of smaller hash (the order prepare once used)
    from rungs.data.filework import id_hash

    x, y = sorted(["first-dup", "second-dup"], key=id_hash)
    _append(root / "a0.jsonl", *({"id": i, "text": f"text {k} of {i}"} for k, i in enumerate([x, y, y, x])))
    return root / "a0.jsonl", f"a: document id {y!r} appears twice; ids must be unique within a set"


def _empty_file(root: Path) -> tuple[Path, str]:
    (root / "b1.jsonl").write_bytes(b"")
    return root / "b1.jsonl", "b: holds no non-empty document (an empty file?)"


def _id_ending_in_nul_in_two_files(root: Path) -> tuple[Path, str]:
    # NumPy's str arrays drop trailing NULs: the id is named as it is, not as 'x'
    _append(root / "a0.jsonl", {"id": "x\u0000", "text": "a text whose id ends in NUL"})
    _append(root / "a1.jsonl", {"id": "x\u0000", "text": "another text under the same id"})
    return root / "a1.jsonl", "a: document id 'x\\x00' appears twice; ids must be unique within a set"


def _source_without_files(root: Path) -> tuple[Path, str]:
    (root / "only-a-folder").mkdir()  # the glob matches a folder and no file: the source has none
    manifest = root / "manifest.yaml"
    manifest.write_text(manifest.read_text().replace(
        "  - {name: b, domain: b, share: 0.5, files: ['b*.jsonl']}\n",
        "  - {name: b, domain: b, share: 0.3, files: ['b*.jsonl']}\n"
        "  - {name: z, domain: z, share: 0.2, files: ['only-a-*']}\n"))
    return manifest, "sources: z: has no non-empty documents"


CASES = [_surrogate_text, _surrogate_id, _surrogate_without_ids, _id_twice_in_a_file, _id_in_two_files, _two_ids_repeated,
         _empty_file, _id_ending_in_nul_in_two_files, _source_without_files]


@pytest.mark.parametrize("case", CASES, ids=[c.__name__.strip("_") for c in CASES])
def test_curate_refuses_what_prepare_refuses_with_the_same_line(case, tmp_path, capsys):
    write_corpus(tmp_path / "corpus")
    manifest = tmp_path / "corpus" / "manifest.yaml"
    path, message = case(tmp_path / "corpus")
    assert main(["data", "prepare", str(manifest), "--out", str(tmp_path / "p"), "--tokenizer", "byte"]) == 2
    prepared = _error_line(capsys.readouterr().err)
    assert prepared.startswith(f"{path}: {message}"), prepared
    assert main(["data", "curate", str(manifest), "--out", str(tmp_path / "cu"), "--taggers", "exact"]) == 2
    assert _error_line(capsys.readouterr().err) == prepared
    # resumable state hides nothing: the same --out refuses again while the file is unchanged
    assert main(["data", "curate", str(manifest), "--out", str(tmp_path / "cu"), "--taggers", "exact,near"]) == 2
    assert _error_line(capsys.readouterr().err) == prepared


def _fix(path: Path) -> None:
    """Drop the lines the cases appended (the corpus's files hold 30 lines), or refill an emptied file."""
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    path.write_text("".join(lines[:30]) if lines else '{"text": "a document again"}\n', encoding="utf-8")


@pytest.mark.parametrize("case", [_surrogate_text, _id_in_two_files, _empty_file],
                         ids=["surrogate_text", "id_in_two_files", "empty_file"])
def test_after_the_fix_the_same_out_curates_as_a_new_one(case, tmp_path, capsys):
    write_corpus(tmp_path / "corpus")
    manifest = tmp_path / "corpus" / "manifest.yaml"
    path, _ = case(tmp_path / "corpus")
    assert main(["data", "curate", str(manifest), "--out", str(tmp_path / "cu"), "--taggers", "exact"]) == 2
    _fix(path)
    (tmp_path / "cu" / "notes.txt").write_text("mine")  # the start-over removes curate's own folders, nothing else
    capsys.readouterr()
    assert main(["data", "curate", str(manifest), "--out", str(tmp_path / "cu"), "--taggers", "exact", "--json"]) == 0
    assert (tmp_path / "cu" / "notes.txt").read_text() == "mine"
    assert main(["data", "curate", str(manifest), "--out", str(tmp_path / "new"), "--taggers", "exact", "--json"]) == 0
    units = sorted(p.name for p in (tmp_path / "new" / "units").iterdir())
    assert sorted(p.name for p in (tmp_path / "cu" / "units").iterdir()) == units
    for unit in units:
        for sub in ("units", "attributes/exact"):
            fixed, fresh = read_npz(tmp_path / "cu" / sub / unit), read_npz(tmp_path / "new" / sub / unit)
            assert fixed.keys() == fresh.keys() and all(np.array_equal(fixed[k], fresh[k]) for k in fresh), unit


def test_a_curation_with_a_finished_tagger_is_still_refused_after_an_edit(tmp_path, capsys):
    write_corpus(tmp_path / "corpus")
    manifest = tmp_path / "corpus" / "manifest.yaml"
    assert main(["data", "curate", str(manifest), "--out", str(tmp_path / "cu"), "--taggers", "exact", "--json"]) == 0
    _append(tmp_path / "corpus" / "a0.jsonl", {"id": "new", "text": "a document added later"})
    capsys.readouterr()
    assert main(["data", "curate", str(manifest), "--out", str(tmp_path / "cu"), "--taggers", "near"]) == 2
    assert "choose a new --out" in _error_line(capsys.readouterr().err)
    assert (tmp_path / "cu" / "attributes" / "exact").is_dir()  # nothing of it removed


def _reversed_mapper(fn, calls):
    """Runs a stage's tasks last first (as parallel workers may finish them), yielding results in order."""
    results = [fn(*args, **kwargs) for args, kwargs in reversed(calls)]
    yield from reversed(results)


@pytest.mark.parametrize("mapper", [None, _reversed_mapper], ids=["in_order", "last_first"])
def test_an_id_shared_across_files_is_found_whichever_file_is_read_last(mapper, tmp_path):
    write_corpus(tmp_path / "corpus", files_per_source=3)
    _append(tmp_path / "corpus" / "a2.jsonl", {"id": "a/f1-d7", "text": "a text under an id file a1 has"})
    kwargs = {"mapper": mapper} if mapper else {}
    for _ in range(2):  # a rerun refuses again
        with pytest.raises(DataInputError) as err:
            curate(tmp_path / "corpus" / "manifest.yaml", tmp_path / "cu", taggers=["exact"], partitions=2, **kwargs)
        assert err.value.where == str(tmp_path / "corpus" / "a2.jsonl") and err.value.field == "a"
        assert err.value.detail == "document id 'a/f1-d7' appears twice; ids must be unique within a set"
    assert not Store(tmp_path / "cu").done("ids", "a")


def test_ids_that_share_a_uid_are_a_collision_not_a_repeat(tmp_path, monkeypatch):
    write_corpus(tmp_path / "corpus")
    manifest = load_manifest(tmp_path / "corpus" / "manifest.yaml")
    store = Store(tmp_path / "cu")
    store.write_meta(store.open_for_writing(manifest, manifest.content_hash()))
    monkeypatch.setattr("curation.ids.doc_uid", lambda source, doc_id: 7)  # every document one uid
    units = [u for u in units_of(manifest) if u.source == "a"]
    for unit in units:
        write_unit_index(store, unit, list(unit.documents()))
    assert store.done("ids", "a") == {"files": 2, "docs": 60}
    assert np.all(np.load(store.unit_index(units[0].name))["uid"] == 7)
    # a real repeat among the colliding ids is still found
    (store.root / "done" / "ids" / "a.json").unlink()
    index = dict(np.load(store.unit_index(units[1].name)))
    index["id"] = np.array(["a/f0-d0"] + index["id"].tolist()[1:])
    np.savez(store.unit_index(units[1].name), **index)
    with pytest.raises(DataInputError, match="document id 'a/f0-d0' appears twice"):
        check_source_ids(store, units[0])


def test_ids_ending_in_nul_are_kept_exactly_and_mix_reads_the_unchanged_files(tmp_path):
    write_corpus(tmp_path / "corpus")
    ids = ["d1\u0000", "d1", "\u0000\u0000", "mid\u0000dle\u0000"]
    _append(tmp_path / "corpus" / "a0.jsonl", *({"id": i, "text": f"text number {k} of the ids ending in NUL"}
                                                 for k, i in enumerate(ids)))
    _append(tmp_path / "corpus" / "a1.jsonl", {"id": "d1\u0000\u0000", "text": "not a repeat of d1 and NUL"})
    manifest = tmp_path / "corpus" / "manifest.yaml"
    curate(manifest, tmp_path / "cu", taggers=["exact"], partitions=2)
    assert read_npz(tmp_path / "cu" / "units" / "a-00000.npz")["id"].tolist()[-4:] == ids
    assert read_npz(tmp_path / "cu" / "units" / "a-00001.npz")["id"].tolist()[-1] == "d1\u0000\u0000"
    assert read_npz(tmp_path / "cu" / "units" / "b-00000.npz")["id"].dtype.kind == "U"  # no NUL: as before

    payload = mix(tmp_path / "cu", Rules(exact_duplicates="keep_one"), tmp_path / "arm")
    assert payload["kept"]["a"]["docs"] == 60 + len(ids) + 1 - 1  # the planted exact pair loses one
    with gzip.open(tmp_path / "arm" / "data" / "a" / "a-00000.jsonl.gz", "rt", encoding="utf-8") as f:
        assert [json.loads(line)["id"] for line in f][-4:] == ids
