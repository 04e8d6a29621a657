"""Split a text into documents at paragraph boundaries: how the shipped corpora's build scripts cut long
files (a source file, a manual page) into training documents of a bounded size."""

from __future__ import annotations

MIN_DOC_CHARS = 200  # a shorter piece (a lone heading, a trailing line) is dropped


def paragraph_chunks(text: str, max_chars: int) -> list[str]:
    """Documents of at most `max_chars`, each a run of whole paragraphs (a longer paragraph is cut), dropping
    pieces under MIN_DOC_CHARS."""
    if max_chars <= 0:
        raise ValueError(f"max_chars must be positive, got {max_chars}")
    out, current = [], ""
    for para in text.split("\n\n"):
        while len(para) > max_chars:
            out.append(para[:max_chars])
            para = para[max_chars:]
        if current and len(current) + len(para) + 2 > max_chars:
            out.append(current)
            current = ""
        current = f"{current}\n\n{para}" if current else para
    if current.strip():
        out.append(current)
    return [c for c in out if len(c.strip()) >= MIN_DOC_CHARS]
