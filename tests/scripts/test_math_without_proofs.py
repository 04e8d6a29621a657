"""math_without_proofs: the three held-out variants it rescores."""

from __future__ import annotations

from tests.scripts.helpers import load_script


def test_rescoring_variants_split_metamath_documents_only():
    split = load_script("math_without_proofs").split_variants
    docs = [{"id": "sympy/modules/core.html#0", "text": "Symbols are created with symbols('x y')."},
            {"id": "metamath/set.mm#1536#0", "text": "$( The reduct. $)\n  thm $p |- ph $= ( wph ) ABZC $.\n"}]
    variants = split(docs)
    assert variants["with_proofs"] == [d["text"] for d in docs]
    assert variants["without_proofs"] == [docs[0]["text"], "$( The reduct. $)\n  thm $p |- ph $= ? $.\n"]
    assert variants["proofs"] == ["$= ( wph ) ABZC $."]
