"""`ladder data prepare` on hostile input: exit 2, one line naming the file and field, nothing written."""

from __future__ import annotations

import gzip

import pytest

from ladder.cli import main
from rungs.data.errors import DataInputError
from rungs.data.manifest import load_manifest

from .conftest import write_manifest


def _empty(root):
    (root / "b.jsonl").write_bytes(b"")
    return root / "b.jsonl", "b: holds no non-empty document"


def _blank_text_file(root):
    (root / "b.txt").write_text("  \n\n")
    _retarget(root, "b.jsonl", "b.txt")
    return root / "b.txt", "b: holds no non-empty document"


def _binary(root):
    (root / "b.txt").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(range(256)))
    _retarget(root, "b.jsonl", "b.txt")
    return root / "b.txt", "b: is not UTF-8 text (byte 0x89 at offset 0)"


def _binary_but_utf8(root):
    (root / "b.txt").write_bytes(b"ELF\x00\x01\x02 looks like text but is not")
    _retarget(root, "b.jsonl", "b.txt")
    return root / "b.txt", "b: looks binary (a NUL byte at character 3)"


def _latin1_jsonl(root):
    (root / "b.jsonl").write_bytes('{"id": "1", "text": "plain"}\n{"id": "2", "text": "café"}\n'.encode("latin-1"))
    return root / "b.jsonl", "b: is not UTF-8 text (byte 0xe9 at offset 53)"


def _lone_surrogate_text(root):
    with open(root / "b.jsonl", "a", encoding="utf-8") as f:
        f.write('{"id": "s1", "text": "lone \\ud800 surrogate"}\n')
    return root / "b.jsonl", "b: line 41: field 'text' holds a lone surrogate escape (\\ud800 at character 5)"


def _lone_surrogate_id(root):
    with open(root / "b.jsonl", "a", encoding="utf-8") as f:
        f.write('{"id": "x\\udc80", "text": "fine text"}\n')
    return root / "b.jsonl", "b: line 41: field 'id' holds a lone surrogate escape (\\udc80 at character 1)"


def _lone_surrogate_gzip(root):
    text = "".join(f'{{"id": "g{k}", "text": "caf\\u00e9 {k}"}}\n' for k in range(20)) + \
        '{"id": "g20", "text": "\\ud83d\\ude00 is a pair, \\ude00 is not"}\n'
    (root / "b.jsonl.gz").write_bytes(gzip.compress(text.encode()))
    _retarget(root, "b.jsonl", "b.jsonl.gz")
    return root / "b.jsonl.gz", "b: line 21: field 'text' holds a lone surrogate escape (\\ude00 at character 13)"


def _id_twice(root):
    with open(root / "b.jsonl", "a", encoding="utf-8") as f:
        f.write('{"id": "b-3", "text": "another text under an id the file has"}\n')
    return root / "b.jsonl", "b: document id 'b-3' appears twice; ids must be unique within a set"


def _not_gzip(root):
    (root / "b.jsonl.gz").write_bytes(b'{"id": "1", "text": "not compressed"}\n')
    _retarget(root, "b.jsonl", "b.jsonl.gz")
    return root / "b.jsonl.gz", "b: is not a readable gzip file"


def _truncated_gzip(root):
    blob = gzip.compress(b'{"id": "1", "text": "a document that is cut off"}\n' * 50)
    (root / "b.jsonl.gz").write_bytes(blob[:len(blob) // 2])
    _retarget(root, "b.jsonl", "b.jsonl.gz")
    return root / "b.jsonl.gz", "b: is not a readable gzip file"


def _bad_parquet(root):
    pytest.importorskip("pyarrow")
    (root / "b.parquet").write_bytes(b"PAR1 this is not parquet at all")
    _retarget(root, "b.jsonl", "b.parquet")
    return root / "b.parquet", "b: is not a readable Parquet file"


def _manifest_not_utf8(root):
    manifest = root / "manifest.yaml"
    manifest.write_bytes(manifest.read_bytes().replace(b"name: tiny", b"name: caf\xe9"))
    return manifest, "is not UTF-8 text (byte 0xe9 at offset 9)"


def _manifest_bad_yaml(root):
    manifest = root / "manifest.yaml"
    manifest.write_text(manifest.read_text() + "  - {domain: y, files: [\n")
    return manifest, "not valid YAML"


def _manifest_unknown_key(root):
    manifest = root / "manifest.yaml"
    manifest.write_text(manifest.read_text() + "shards: 4\n")
    return manifest, "unknown keys ['shards']"


def _source_unknown_key(root):
    manifest = root / "manifest.yaml"
    manifest.write_text(manifest.read_text().replace("share: 0.4,", "share: 0.4, weight: 2,"))
    return manifest, "sources[1]: unknown keys ['weight']"


def _decontamination_unknown_key(root):
    manifest = root / "manifest.yaml"
    manifest.write_text(manifest.read_text() + "decontamination: {ngram: 8}\n")
    return manifest, "decontamination: expected a mapping with only `ngram_words`"


def _decontamination_not_a_mapping(root):
    manifest = root / "manifest.yaml"
    manifest.write_text(manifest.read_text() + "decontamination: 13\n")
    return manifest, "decontamination: expected a mapping with only `ngram_words`, got 13"


def _share_is_a_bool(root):
    manifest = root / "manifest.yaml"
    manifest.write_text(manifest.read_text().replace("share: 0.6", "share: true").replace("share: 0.4", "share: 0.0"))
    return manifest, "sources[0].share: share must be a number in (0, 1], got True"


def _missing(root):
    (root / "b.jsonl").unlink()
    return root / "manifest.yaml", "sources[1].files: 'b.jsonl' matches no file"


def _object_id(root):
    with open(root / "b.jsonl", "a", encoding="utf-8") as f:
        f.write('{"id": {"x": 1}, "text": "an id that is an object"}\n')
    return root / "b.jsonl", ("b: line 41: field 'id' is dict {'x': 1}; a document's id must be a string or a number, "
                              "or null for none (the document is then named <file>:<line>)")


def _boolean_id(root):
    with open(root / "b.jsonl", "a", encoding="utf-8") as f:
        f.write('{"id": true, "text": "an id that is a boolean"}\n')
    return root / "b.jsonl", "b: line 41: field 'id' is bool True; a document's id must be a string or a number"


def _a_folder_among_the_files(root):
    (root / "more").mkdir()
    (root / "b.jsonl").rename(root / "more" / "b.jsonl")
    (root / "c.jsonl").write_text('{"id": "c", "text": "a file beside the folder"}\n')
    _retarget(root, "files: [b.jsonl]", "files: [more, c.jsonl]")
    return root / "manifest.yaml", (f"sources[1].files: `files` entry 'more' matches only folders ({root / 'more'}), "
                                    "and a folder's files are not read unless named: use a glob such as "
                                    "'more/*.jsonl', or 'more/**/*' for every file under it")


def _only_a_folder(root):
    (root / "more").mkdir()
    (root / "b.jsonl").rename(root / "more" / "b.jsonl")
    _retarget(root, "files: [b.jsonl]", "files: ['more/']")
    return root / "manifest.yaml", ("sources: b: has no non-empty documents: `files` entry 'more/' matches only "
                                    "folders")


def _bzip2_by_suffix(root):
    import bz2

    (root / "b.jsonl.bz2").write_bytes(bz2.compress((root / "b.jsonl").read_bytes()))
    _retarget(root, "b.jsonl", "b.jsonl.bz2")
    return root / "b.jsonl.bz2", ("b: is bzip2-compressed, a format prepare does not read (it reads .jsonl, .parquet "
                                  "or text, uncompressed or compressed as .gz (gzip, BGZF) or .zst (zstd))")


def _xz_by_its_bytes(root):
    import lzma

    (root / "b.txt").write_bytes(lzma.compress((root / "b.jsonl").read_bytes()))
    _retarget(root, "b.jsonl", "b.txt")
    return root / "b.txt", "b: is xz-compressed, a format prepare does not read"


def _gzip_without_its_suffix(root):
    (root / "b.jsonl").write_bytes(gzip.compress((root / "b.jsonl").read_bytes()))
    return root / "b.jsonl", "b: is gzip-compressed, but its name does not end in .gz; rename it b.jsonl.gz"


def _retarget(root, old: str, new: str) -> None:
    manifest = root / "manifest.yaml"
    manifest.write_text(manifest.read_text().replace(old, new))


CASES = [_empty, _blank_text_file, _binary, _binary_but_utf8, _latin1_jsonl, _lone_surrogate_text, _lone_surrogate_id,
         _lone_surrogate_gzip, _id_twice, _not_gzip, _truncated_gzip, _bad_parquet,
         _manifest_not_utf8, _manifest_bad_yaml, _manifest_unknown_key, _source_unknown_key,
         _decontamination_unknown_key, _decontamination_not_a_mapping, _share_is_a_bool, _missing, _object_id,
         _boolean_id, _a_folder_among_the_files, _only_a_folder, _bzip2_by_suffix, _xz_by_its_bytes,
         _gzip_without_its_suffix]


@pytest.mark.parametrize("case", CASES, ids=[c.__name__.strip("_") for c in CASES])
def test_bad_input_exits_2_with_one_line_naming_the_file_and_writes_nothing(case, tmp_path, capsys):
    root = tmp_path / "corpus"
    manifest = write_manifest(root)
    path, message = case(root)
    out = tmp_path / "out"
    assert main(["data", "prepare", str(manifest), "--out", str(out), "--tokenizer", "byte"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith(f"ladder data: error: {path}: ") and message in err, err
    assert not out.exists()


def test_an_output_path_that_is_a_file_is_refused(tmp_path, capsys):
    manifest = write_manifest(tmp_path / "corpus")
    (tmp_path / "out").write_text("not a directory")
    assert main(["data", "prepare", str(manifest), "--out", str(tmp_path / "out"), "--tokenizer", "byte"]) == 2
    err = capsys.readouterr().err
    assert err == f"ladder data: error: {tmp_path / 'out'}: out: exists and is not a directory; name a new or " \
                  "prepared output directory\n"


def test_an_unusable_tokenizer_file_is_named(tmp_path, capsys):
    manifest = write_manifest(tmp_path / "corpus")
    for tokenizer, message in ((tmp_path / "nope.json", "tokenizer: is neither 'bpe', 'byte' nor a tokenizer.json"),
                               (manifest, "tokenizer: is not a Hugging Face tokenizer.json")):
        assert main(["data", "prepare", str(manifest), "--out", str(tmp_path / "out"),
                     "--tokenizer", str(tokenizer)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"{tokenizer}: {message}" in err, err
        assert not (tmp_path / "out").exists()


def test_a_set_s_file_is_read_with_prepare_s_checks(tmp_path, monkeypatch):
    """`DocumentSet.file_documents` (what curate and the BPE sample read) refuses an empty file and an id twice with
    prepare's messages; ids that only share a hash are not a repeat."""
    root = tmp_path / "corpus"
    manifest = write_manifest(root)
    (root / "b.jsonl").write_text('{"id": "p", "text": "one"}\n{"id": "q", "text": "two"}\n')
    ds = load_manifest(manifest).sources[1]
    monkeypatch.setattr("rungs.data.filework.id_hash", lambda doc_id: 7)  # every id one hash
    assert [d.doc_id for d in ds.file_documents(ds.files[0])] == ["p", "q"]
    with open(root / "b.jsonl", "a") as f:
        f.write('{"id": "r", "text": "three"}\n{"id": "q", "text": "two again"}\n')
    with pytest.raises(DataInputError) as err:
        list(ds.file_documents(ds.files[0]))
    assert str(err.value) == f"{root / 'b.jsonl'}: b: document id 'q' appears twice; ids must be unique within a set"
    (root / "b.jsonl").write_text("\n")
    with pytest.raises(DataInputError, match="b: holds no non-empty document"):
        list(ds.file_documents(ds.files[0]))
