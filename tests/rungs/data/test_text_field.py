"""A document's text must be a string: `{"text": 42}` in JSONL, or a number or null in a Parquet column, is
an error naming the file, the line or row and the field, not the document "42". An id is a string or a number,
or null for none: an object is an error, not the id "{'x': 1}"."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ladder.cli import main
from rungs.data.errors import DataInputError
from rungs.data.manifest import load_manifest
from rungs.data.prepare import prepare

from .conftest import write_manifest


@pytest.mark.parametrize("value, shown", [(42, "int 42"), (1.5, "float 1.5"), (["a", "b"], "list ['a', 'b']"),
                                          (None, "NoneType None"), ({"t": "x"}, "dict {'t': 'x'}")])
def test_a_jsonl_text_that_is_not_a_string_names_the_file_line_and_field(value, shown, tmp_path):
    manifest = write_manifest(tmp_path)
    lines = (tmp_path / "b.jsonl").read_text().splitlines()
    lines[2] = json.dumps({"id": "b-2", "text": value})
    (tmp_path / "b.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.raises(DataInputError) as err:
        prepare(manifest, tmp_path / "out", vocab_size=257, tokenizer="byte")
    assert err.value.where == str(tmp_path / "b.jsonl") and err.value.field == "b"
    assert err.value.detail.startswith(f"line 3: field 'text' is {shown}, not a string")
    assert not (tmp_path / "out").exists()


def test_the_cli_says_it_in_one_line_and_exits_2(tmp_path, capsys):
    manifest = write_manifest(tmp_path)
    (tmp_path / "b.jsonl").write_text('{"id": "1", "text": "fine"}\n{"id": "2", "text": 42}\n')
    assert main(["data", "prepare", str(manifest), "--out", str(tmp_path / "out"), "--tokenizer", "byte"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"ladder data: error: {tmp_path / 'b.jsonl'}: b: line 2: field 'text' is int 42, not a string; " \
                  "a document's text must be a string (convert it in the file, or drop the record)"


@pytest.mark.parametrize("column, row, shown", [
    (pa.array(["one", "two", None, "four"]), 2, "NoneType None"),
    (pa.array([1, 2, 3, 4], type=pa.int64()), 0, "int 1"),
])
def test_a_parquet_text_that_is_not_a_string_names_the_file_row_and_field(column, row, shown, tmp_path):
    manifest = write_manifest(tmp_path)
    pq.write_table(pa.table({"id": ["p0", "p1", "p2", "p3"], "text": column}), tmp_path / "b.parquet")
    manifest.write_text(manifest.read_text().replace("b.jsonl", "b.parquet"))
    with pytest.raises(DataInputError) as err:
        prepare(manifest, tmp_path / "out", vocab_size=257, tokenizer="byte")
    assert err.value.where == str(tmp_path / "b.parquet") and err.value.field == "b"
    assert err.value.detail.startswith(f"row {row} (counting from 0): field 'text' is {shown}, not a string")


def test_a_null_id_is_no_id_and_an_id_that_is_not_a_string_or_number_is_refused(tmp_path):
    """A null id is no id (`<file>:<line>`, `<file>:<row>`), not the id "None" (two of them were a repeated id);
    a number is its text; an object, list or boolean is refused with its line or row, not made into "{'x': 1}"."""
    manifest = write_manifest(tmp_path)
    lines = [{"id": "b-0", "text": "one"}, {"id": None, "text": "two"}, {"id": 7, "text": "three"},
             {"id": None, "text": "four"}]
    (tmp_path / "b.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    pq.write_table(pa.table({"id": ["p0", None, None], "text": ["x", "y", "z"]}), tmp_path / "c.parquet")
    manifest.write_text(manifest.read_text().replace("files: [b.jsonl]", "files: [b.jsonl, c.parquet]"))
    ds = load_manifest(manifest).sources[1]
    assert [d.doc_id for d in ds.documents()] == ["b-0", "b.jsonl:2", "7", "b.jsonl:4", "p0", "c.parquet:1",
                                                  "c.parquet:2"]
    pq.write_table(pa.table({"id": pa.array([{"x": 1}, None], pa.struct([("x", pa.int64())])), "text": ["x", "y"]}),
                   tmp_path / "c.parquet")
    with pytest.raises(DataInputError) as err:
        prepare(manifest, tmp_path / "out", vocab_size=257, tokenizer="byte")
    assert err.value.where == str(tmp_path / "c.parquet") and err.value.field == "b"
    assert err.value.detail.startswith("row 0 (counting from 0): field 'id' is dict {'x': 1}; a document's id must be "
                                       "a string or a number, or null for none (the document is then named "
                                       "<file>:<row>)")
    lines[2] = {"id": ["a"], "text": "three"}
    (tmp_path / "b.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    with pytest.raises(DataInputError, match=r"line 3: field 'id' is list \['a'\]; a document's id must be a string"):
        prepare(manifest, tmp_path / "out", vocab_size=257, tokenizer="byte")
    assert not (tmp_path / "out").exists()


def test_a_file_saved_utf8_with_a_byte_order_mark_reads_as_the_same_documents(tmp_path):
    # Editors on Windows save "UTF-8 with BOM": the mark (EF BB BF) starts the file and is no part of its text.
    # A JSONL file's first line read as '\ufeff{...' and was refused ("not a JSON object"); a text file's
    # document began with U+FEFF.
    import codecs

    from rungs.data.corpus import PreparedCorpus

    plain, marked = tmp_path / "plain", tmp_path / "marked"
    for root in (plain, marked):
        root.mkdir()
        write_manifest(root)
        (root / "docs").mkdir()
        (root / "docs" / "one.txt").write_text("a whole file is a document\n")
    for name in ("b.jsonl", "docs/one.txt"):
        (marked / name).write_bytes(codecs.BOM_UTF8 + (marked / name).read_bytes())
    sources = ("sources:\n  - {name: b, share: 0.5, files: [b.jsonl]}\n"
               "  - {name: t, share: 0.5, files: ['docs/*.txt']}\n")
    texts = {}
    for root in (plain, marked):
        (root / "m.yaml").write_text(sources)
        manifest = load_manifest(root / "m.yaml")
        texts[root.name] = [[(d.doc_id, d.text) for d in s.documents()] for s in manifest.sources]
        out = prepare(root / "m.yaml", root / "out", vocab_size=257, tokenizer="byte")
        texts[root.name + "_sha"] = [PreparedCorpus.open(out).source_info(s)["sha256"] for s in ("b", "t")]
    assert texts["marked"] == texts["plain"] and texts["marked"][1] == [("docs/one.txt",
                                                                           "a whole file is a document\n")]
    assert texts["marked_sha"] == texts["plain_sha"]


def test_a_bpe_with_fewer_entries_than_asked_says_so(tmp_path, caplog):
    # The tiny corpus has too few distinct pairs for 4,096 entries: the tokenizer is smaller, and prepare says
    # by how much instead of leaving a model's embedding rows above its ids untrained without a word.
    import logging

    from rungs.data.corpus import PreparedCorpus

    manifest = write_manifest(tmp_path)
    with caplog.at_level(logging.WARNING, logger="rungs.data.vocabulary"):
        out = prepare(manifest, tmp_path / "out", vocab_size=4096, tokenizer="bpe")
    size = PreparedCorpus.open(out).meta["tokenizer"]["vocab_size"]
    assert 258 <= size < 4096
    (said,) = [r.getMessage() for r in caplog.records if "not the 4096 asked for" in r.getMessage()]
    assert said.startswith(f"prepare: the BPE has {size} entries") and f"{4096 - size} embedding rows" in said
