"""The tokenizer stage of `prepare`: which tokenizer a corpus is prepared with, trained or given.

`tokenizer` is "bpe" (a byte-level BPE trained on the training sources), "byte", or the path of a
Hugging Face `tokenizer.json` with an `<|endoftext|>` token (a fixed vocabulary, e.g. a recipe's
131,072-entry one); `vocab_size` is then the model's vocabulary, which must hold every id. The BPE is
trained on a bounded, deterministic sample: each source's first `BPE_SAMPLE_BYTES / sources` bytes of
clean documents, in file order, its words cut at `rungs.data.tokenizer.BPE_WORD_BYTES` bytes while it
trains (a long run without whitespace would otherwise cost time with the square of its length).
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterator
from pathlib import Path

from rungs.data.atomic import atomic_write_bytes
from rungs.data.errors import DataInputError
from rungs.data.manifest import Manifest
from rungs.data.outputs import Progress
from rungs.data.tokenizer import EOS_TEXT, BpeTokenizer, ByteTokenizer, load_tokenizer, train_bpe

log = logging.getLogger("rungs.data.prepare")
BPE_SAMPLE_BYTES = 32 << 20  # the BPE's training text, split equally over the sources (the demo: all of it)
Removed = dict[tuple[str, int], frozenset]  # (source, file index) -> training ids removed


def tokenizer_key(tokenizer: str) -> str:
    if tokenizer in ("bpe", "byte"):
        return tokenizer
    return "file:" + hashlib.sha256(Path(tokenizer).read_bytes()).hexdigest()


def tokenizer_file_vocab_size(path: Path) -> int:
    """Entries of a HF `tokenizer.json` (with its added tokens): the default model vocabulary for it."""
    return tokenizer_file(path, None).vocab_size


def tokenizer_file(path: Path, vocab_size: int | None) -> BpeTokenizer:
    """A fixed tokenizer from a HF `tokenizer.json`, checked to fit a model vocabulary of `vocab_size`."""
    if not path.is_file():
        raise DataInputError("is neither 'bpe', 'byte' nor a tokenizer.json file", where=str(path), field="tokenizer")
    from tokenizers import Tokenizer

    try:
        hf = Tokenizer.from_file(str(path))
    except Exception as err:  # the Rust loader raises a bare Exception for any malformed file
        raise DataInputError(f"is not a Hugging Face tokenizer.json ({' '.join(str(err).split())})",
                             where=str(path), field="tokenizer") from None
    if hf.token_to_id(EOS_TEXT) is None:
        raise DataInputError(f"has no {EOS_TEXT!r} token to end documents with", where=str(path), field="tokenizer")
    tok = BpeTokenizer(hf)
    if vocab_size is not None and tok.vocab_size > vocab_size:
        raise DataInputError(f"the tokenizer has {tok.vocab_size:,} entries, more than vocab_size {vocab_size:,}: "
                             f"its ids up to {tok.vocab_size - 1:,} would not fit the model's embedding",
                             where=str(path), field="vocab_size")
    return tok


def bpe_sample(manifest: Manifest, removed: Removed, sample_bytes: int = BPE_SAMPLE_BYTES) -> Iterator[str]:
    """The BPE's training text: each source's first `sample_bytes / sources` bytes of clean documents, in
    manifest and file order. Bounded and deterministic; the whole demo corpus fits (its largest source is
    4.5 MB), so its tokenizer is the one trained on every document in older versions."""
    budget = sample_bytes // len(manifest.sources)
    for ds in manifest.sources:
        taken = 0
        for i, path in enumerate(ds.files):
            gone = removed.get((ds.name, i), frozenset())
            for doc in ds.file_documents(path):
                if taken >= budget:
                    break
                if doc.doc_id in gone:
                    continue
                taken += len(doc.text.encode("utf-8"))
                yield doc.text
            if taken >= budget:
                break


def tokenizer_step(out: Path, progress: Progress, kind: str, vocab_size: int, manifest: Manifest, removed: Removed,
                   fixed: BpeTokenizer | None):
    """The corpus's tokenizer: the byte tokenizer, the one a finished step saved, a given file (copied so
    the directory is self-contained), or a BPE trained on `bpe_sample`."""
    if kind == "byte":
        return ByteTokenizer()
    if progress.done("tokenizer"):
        return load_tokenizer(out, {"kind": "bpe"})
    if fixed is not None:
        tok, blob = fixed, Path(kind).read_bytes()
    else:
        log.info("prepare: training a byte-level BPE with %d entries", vocab_size)
        tok = train_bpe(bpe_sample(manifest, removed), vocab_size)
        if tok.vocab_size < vocab_size:  # the sample has fewer pairs seen twice than the merges asked for
            log.warning("prepare: the BPE has %d entries, not the %d asked for: its training text (up to %d MiB, "
                        "each source's first documents) has no more pairs that occur twice; token ids stay below "
                        "%d, and a model's %d embedding rows above them are never trained", tok.vocab_size,
                        vocab_size, BPE_SAMPLE_BYTES >> 20, tok.vocab_size, vocab_size - tok.vocab_size)
        blob = tok.hf.to_str(pretty=False).encode()
    atomic_write_bytes(out / "tokenizer.json", blob)
    progress.mark("tokenizer", {"sha256": hashlib.sha256(blob).hexdigest(), "vocab_size": tok.vocab_size})
    return tok


class TokenizerLoader:
    """Picklable: the prepared directory's tokenizer where a shard needs it (a Ray worker), loaded once per
    process: a HF tokenizer loaded per input file is not all given back (+7 MB per file measured)."""

    _loaded: tuple = (None, None)  # ((directory, kind, size, mtime), tokenizer) of the last load

    def __init__(self, out: Path, kind: str) -> None:
        self.out, self.kind = out, kind

    def __call__(self):
        path = self.out / "tokenizer.json"
        st = path.stat() if path.exists() else None
        ident = (str(self.out), self.kind, st and st.st_size, st and st.st_mtime_ns)
        if TokenizerLoader._loaded[0] != ident:
            TokenizerLoader._loaded = (ident, load_tokenizer(self.out, {"kind": self.kind}))
        return TokenizerLoader._loaded[1]
