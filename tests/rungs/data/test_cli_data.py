"""`ladder data prepare`: the contract of docs/architecture.md (table, one JSON object, exit 2 on bad input)."""

from __future__ import annotations

import json

from ladder.cli import main

from .conftest import make_docs, write_manifest


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


def test_inspect_prints_the_shard_manifest_and_decodes_sample_documents(tiny_bpe, capsys):
    assert main(["data", "inspect", str(tiny_bpe), "--json", "--docs", "3"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert [(s["split"], s["name"]) for s in payload["sets"]] == [("train", "a"), ("train", "b"), ("eval", "x")]
    a = payload["sets"][0]
    assert a["shards"][0]["stem"] == "train/a/00000-0000" and sum(s["docs"] for s in a["shards"]) == a["docs"] == 60
    assert [d["doc"] for d in a["sample"]] == [0, 30, 59]
    docs = {d["id"]: d["text"] for d in make_docs("a", 60, seed=1)}
    assert all(docs[d["id"]][:200] == d["text"] for d in a["sample"])  # the round trip: decode(encode(text))
    assert main(["data", "inspect", str(tiny_bpe)]) == 0
    text = capsys.readouterr().out
    assert "train/a doc 59 'a-59' (459 tokens, 668 bytes):" in text and "00000-0000" in text


def test_inspect_of_a_directory_that_is_not_prepared_exits_2(tmp_path, capsys):
    assert main(["data", "inspect", str(tmp_path)]) == 2
    assert f"{tmp_path}: not a prepared corpus" in capsys.readouterr().err


def test_workers_below_one_exit_2(tiny_manifest, tmp_path, capsys):
    assert main(["data", "prepare", str(tiny_manifest), "--out", str(tmp_path / "o"), "--workers", "0"]) == 2
    assert "--workers must be at least 1, got 0" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_inspect_shows_as_many_documents_as_asked_up_to_all_spread_over_each_set(tiny_bpe, capsys):
    for asked in (1, 11, 12, 13, 20, 40, 41, 100):
        assert main(["data", "inspect", str(tiny_bpe), "--json", "--docs", str(asked)]) == 0
        for s in json.loads(capsys.readouterr().out)["sets"]:
            picks = [d["doc"] for d in s["sample"]]
            assert len(picks) == min(asked, s["docs"]) and picks == sorted(set(picks)), (asked, s["name"], picks)
            assert picks[0] == 0 and (asked == 1 or picks[-1] == s["docs"] - 1)
            if asked >= s["docs"]:
                assert picks == list(range(s["docs"]))


def test_inspect_of_a_two_document_set_shows_both(tmp_path, capsys):
    manifest = write_manifest(tmp_path / "corpus", eval_docs=2)
    assert main(["data", "prepare", str(manifest), "--out", str(tmp_path / "p"), "--tokenizer", "byte",
                 "--json"]) == 0
    capsys.readouterr()
    assert main(["data", "inspect", str(tmp_path / "p"), "--json", "--docs", "3"]) == 0
    sets = {(s["split"], s["name"]): s for s in json.loads(capsys.readouterr().out)["sets"]}
    assert [d["id"] for d in sets[("eval", "x")]["sample"]] == ["x-0", "x-1"]


def test_inspect_of_an_unreadable_meta_json_names_the_file(tmp_path, capsys):
    meta = tmp_path / "meta.json"
    for text, problem in (("{", "is not valid JSON"), ("[1]", "is not a JSON object")):
        meta.write_text(text)
        assert main(["data", "inspect", str(tmp_path)]) == 2
        err = capsys.readouterr().err
        assert f"{meta}: {problem}" in err and "ladder data prepare" in err
        assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    meta.write_bytes(b"\xff\xfe{")
    assert main(["data", "inspect", str(tmp_path)]) == 2
    assert f"{meta}: is not valid JSON" in capsys.readouterr().err


def test_a_missing_or_broken_bpe_tokenizer_is_named_with_what_to_do(tiny_bpe, tmp_path, capsys):
    import shutil

    corpus = tmp_path / "corpus"
    shutil.copytree(tiny_bpe, corpus)
    tokenizer = corpus / "tokenizer.json"
    for broken in ("{", None):  # not a tokenizer file, then no file
        if broken is None:
            tokenizer.unlink()
        else:
            tokenizer.write_text(broken)
        assert main(["data", "inspect", str(corpus)]) == 2
        err = capsys.readouterr().err
        assert f"{tokenizer}: " in err and f"remove {corpus} and prepare the corpus again" in err
        assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
