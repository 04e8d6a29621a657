"""paragraph_chunks: documents of whole paragraphs under a size bound, the text kept in order."""

from __future__ import annotations

import pytest

from rungs.data.chunking import MIN_DOC_CHARS, paragraph_chunks


def test_chunks_are_whole_paragraphs_in_order_under_the_bound():
    paras = [("p%d " % k) * (20 + 7 * k) for k in range(12)]
    text = "\n\n".join(paras)
    docs = paragraph_chunks(text, 600)
    assert all(len(d) <= 600 for d in docs)
    assert "\n\n".join(docs) == text  # nothing dropped (every piece is long enough), nothing reordered
    assert all(p in {q for d in docs for q in d.split("\n\n")} for p in paras)


def test_a_long_paragraph_is_cut_and_short_pieces_dropped():
    docs = paragraph_chunks("x" * 1000 + "\n\nshort", 400)
    assert [len(d) for d in docs] == [400, 400, 207]  # the 200-char tail and "short" make the third
    assert paragraph_chunks("y" * (MIN_DOC_CHARS - 1), 400) == []
    with pytest.raises(ValueError):
        paragraph_chunks("text", 0)
