"""`ladder data prepare`: the DESIGN.md contract (table, one JSON object, exit 2 on bad input)."""

from __future__ import annotations

import json

from ladder.cli import main

from .conftest import write_manifest


def test_json_output_is_one_object_describing_the_shards(tiny_manifest, tmp_path, capsys):
    out = tmp_path / "shards"
    assert main(["data", "prepare", str(tiny_manifest), "--out", str(out), "--tokenizer", "byte", "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert payload["out"] == str(out) and payload["tokenizer"]["kind"] == "byte"
    assert set(payload["sources"]) == {"a", "b"} and set(payload["eval"]) == {"x"}
    assert payload["sources"]["a"]["share"] == 0.6
    assert payload["sources"]["a"]["bytes"] + payload["sources"]["a"]["docs"] == payload["sources"]["a"]["tokens"]
    assert payload["decontamination"]["train_docs_removed"] == {"a": 0, "b": 0}
    assert (out / "decontamination.json").exists()


def test_table_by_default(tiny_manifest, tmp_path, capsys):
    assert main(["data", "prepare", str(tiny_manifest), "--out", str(tmp_path / "s"), "--vocab-size", "300"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "(bpe tokenizer, vocab 300)" in text and "│ train │ a │ web │ 60% │ 60 │" in text


def test_bad_input_exits_2_with_the_file_and_field(tmp_path, capsys):
    assert main(["data", "prepare", str(tmp_path / "missing.yaml"), "--out", str(tmp_path / "o")]) == 2
    assert "missing.yaml: manifest file not found" in capsys.readouterr().err
    manifest = write_manifest(tmp_path, shares=(0.5, 0.2))
    assert main(["data", "prepare", str(manifest), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert f"{manifest}: sources.share: source shares sum to 0.7" in err and "Traceback" not in err
    assert main(["data", "prepare", str(manifest), "--out", str(tmp_path / "o"), "--vocab-size", "10"]) == 2
    assert "vocab_size must be at least 258" in capsys.readouterr().err
