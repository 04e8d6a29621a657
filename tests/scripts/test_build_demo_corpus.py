"""build_demo_corpus: set.mm's proofs are replaced by '?', and the shipped math corpus has none left."""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import pytest

from tests.scripts.helpers import load_script

ROOT = Path(__file__).resolve().parents[2]
CORPUS = ROOT / "rungs" / "data" / "demo" / "corpus"


def test_without_proofs_keeps_statements_and_comments():
    build = load_script("build_demo_corpus")
    database = (
        '  $( A proof is the text between "$=" and "$.": this prose stays. $)\n'
        "  sq2 $p |- ( A + B ) = C $=\n"
        "    ( cA cB caddc co ) ABCDEF UAUBZ $.\n"
        "  ax-x $a |- x = x $.\n"
        "  uncomp $p |- ph $= wph ax-1 mp $.\n"
        "  $( Commented out: old @p |- ps @= ( wps ) AB @. and an example\n"
        "     ex $p |- ch $= ( wch ) ABC $. $)\n")
    out = build.without_proofs(database)
    assert out == (
        '  $( A proof is the text between "$=" and "$.": this prose stays. $)\n'
        "  sq2 $p |- ( A + B ) = C $= ? $.\n"
        "  ax-x $a |- x = x $.\n"
        "  uncomp $p |- ph $= ? $.\n"
        "  $( Commented out: old @p |- ps @= ? @. and an example\n"
        "     ex $p |- ch $= ? $. $)\n")
    assert build.without_proofs(out) == out  # idempotent
    assert build.without_proofs("no metamath here") == "no metamath here"


@pytest.mark.parametrize("name", ["math.jsonl.gz", "eval_math.jsonl.gz"])
def test_shipped_math_keeps_metamath_statements_but_no_proofs(name):
    with gzip.open(CORPUS / name, "rt", encoding="utf-8") as f:
        docs = [json.loads(line) for line in f]
    metamath = [d["text"] for d in docs if d["id"].startswith("metamath/")]
    assert sum(text.count("$p") for text in metamath) > 50  # theorem statements are still there
    assert sum(text.count("$= ? $.") for text in metamath) > 50
    # A compressed proof's step string is a run of 20+ capitals; the corpus with proofs had thousands.
    assert not any(re.search(r"\b[A-Z]{20,}\b", text) for text in metamath)
