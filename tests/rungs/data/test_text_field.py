"""A document's text must be a string: `{"text": 42}` in JSONL, or a number or null in a Parquet column, is
an error naming the file, the line or row and the field, not the document "42"."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ladder.cli import main
from rungs.data.errors import DataInputError
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
