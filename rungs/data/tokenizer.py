"""Tokenizers: a byte-level BPE trained with HF `tokenizers`, and the pure byte tokenizer.

Both reserve one end-of-document token (EOS). Shards store every document followed by EOS, and
BPB evaluation puts EOS before a document so that its first token is scored with a context. A document's
text is always plain text: the literal `<|endoftext|>` (or any special token's string) inside a document is
encoded as its characters, never as EOS, as the byte tokenizer does.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import numpy as np

from rungs.data.errors import DataInputError

EOS_TEXT = "<|endoftext|>"
# The BPE trainer's words (pre-tokens: a run of letters, of digits, of other symbols or of whitespace) are
# cut into pieces of at most this many bytes while it trains: its time grows with the square of a word's
# length (a 1 MiB run without whitespace, base64 or DNA, took ~20 CPU-min). The demo's longest word is 140
# bytes (its longest run without whitespace 252 characters), so its tokenizer is the one trained on whole
# words, byte for byte; encoding is not affected.
BPE_WORD_BYTES = 1024
UINT16_VOCAB = 1 << 16  # ids 0..65,535 fit uint16; a larger vocabulary needs uint32


def token_dtype(vocab_size: int) -> np.dtype:
    """The dtype shards store token ids in: uint16 up to 65,536 entries, else uint32."""
    return np.dtype(np.uint16 if vocab_size <= UINT16_VOCAB else np.uint32)


def ids_array(ids, vocab_size: int, dtype: np.dtype) -> np.ndarray:
    """`ids` as `dtype`, refusing any id outside 0..vocab_size-1 before the cast (a cast would wrap)."""
    wide = np.asarray(ids, dtype=np.int64)
    if wide.size and (int(wide.max()) >= vocab_size or int(wide.min()) < 0):
        bad = int(wide.max()) if int(wide.max()) >= vocab_size else int(wide.min())
        raise TokenIdError(f"token id {bad} is outside the vocabulary of {vocab_size:,} entries (0..{vocab_size - 1:,})")
    return wide.astype(dtype)


class TokenIdError(ValueError):
    """A tokenizer produced an id outside its vocabulary: nothing may be written with it."""


BYTE_VOCAB_SIZE = 257  # the byte tokenizer's ids: 256 bytes and EOS


class ByteTokenizer:
    """UTF-8 bytes are tokens 0..255; EOS is 256."""

    kind = "byte"

    def __init__(self) -> None:
        self.eos_id = 256
        self.vocab_size = BYTE_VOCAB_SIZE

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: list[int]) -> str:
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")

    def encode_many(self, texts: list[str]) -> list[np.ndarray]:
        return [np.frombuffer(t.encode("utf-8"), dtype=np.uint8).astype(token_dtype(self.vocab_size)) for t in texts]

    def to_json(self) -> dict:
        return {"kind": self.kind, "vocab_size": self.vocab_size, "eos_id": self.eos_id}


class BpeTokenizer:
    """Byte-level BPE (GPT-2 style pre-tokenisation), EOS as the only special token (id 0)."""

    kind = "bpe"

    def __init__(self, hf_tokenizer) -> None:
        self.hf = hf_tokenizer
        self.eos_id = int(hf_tokenizer.token_to_id(EOS_TEXT))
        self.vocab_size = int(hf_tokenizer.get_vocab_size())
        _plain_text(hf_tokenizer)

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        _plain_text(self.hf)  # a pickled HF tokenizer (a Ray task's) comes back without the setting

    def encode(self, text: str) -> list[int]:
        return self.hf.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        return self.hf.decode(list(ids), skip_special_tokens=True)

    def encode_many(self, texts: list[str]) -> list[np.ndarray]:
        """Batch-encode (parallel in Rust): one array per text, of `token_dtype(vocab_size)`, every id
        checked to be below `vocab_size` (`TokenIdError` otherwise)."""
        encodings = self.hf.encode_batch_fast(texts, add_special_tokens=False) \
            if hasattr(self.hf, "encode_batch_fast") else self.hf.encode_batch(texts, add_special_tokens=False)
        dtype = token_dtype(self.vocab_size)
        return [ids_array(e.ids, self.vocab_size, dtype) for e in encodings]

    def to_json(self) -> dict:
        return {"kind": self.kind, "vocab_size": self.vocab_size, "eos_id": self.eos_id}


def _plain_text(hf) -> None:
    """Make `hf` encode special tokens' strings in the input as plain text: HF matches added special tokens
    in the text even with `add_special_tokens=False`, so a document quoting `<|endoftext|>` would hold EOS
    (a false document boundary, text `decode` drops). Not part of `tokenizer.json` (the file is unchanged);
    needs tokenizers >= 0.15.1 (older ones lack the setting and still match them)."""
    if hasattr(hf, "encode_special_tokens"):
        hf.encode_special_tokens = True


def train_bpe(texts: Iterable[str], vocab_size: int) -> BpeTokenizer:
    """Train a byte-level BPE of `vocab_size` entries (256 byte symbols + EOS + merges).

    Deterministic for the same texts in the same order: shards built from it hash identically. Words
    longer than `BPE_WORD_BYTES` are trained on as pieces of that length (bounded time); the tokenizer
    returned pre-tokenizes as ByteLevel alone, so nothing of the cap is in `tokenizer.json`.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    if vocab_size < 258:
        raise ValueError(f"a byte-level BPE needs vocab_size >= 258 (256 bytes + EOS + 1 merge), got {vocab_size}")
    hf = Tokenizer(models.BPE())
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False)
    # ByteLevel maps every byte to one character (none a newline), so N characters are N bytes of a word:
    # a longer word is cut into N-byte pieces, a shorter one left whole. FixedLength (recent tokenizers) adds
    # ~1 CPU-s (15-20%) to training on the demo's 13.7 MB; the same cut by a regex, where it is missing, ~55%.
    cut = pre_tokenizers.FixedLength(length=BPE_WORD_BYTES) if hasattr(pre_tokenizers, "FixedLength") else \
        pre_tokenizers.Split(Regex(f".{{{BPE_WORD_BYTES}}}"), behavior="isolated")
    hf.pre_tokenizer = pre_tokenizers.Sequence([byte_level, cut])
    hf.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOS_TEXT], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), min_frequency=2)
    hf.train_from_iterator(texts, trainer=trainer)
    hf.pre_tokenizer = byte_level
    return BpeTokenizer(hf)


def load_tokenizer(directory: Path, meta: dict):
    """The tokenizer a prepared corpus was built with (`meta` is its `tokenizer` block)."""
    if meta["kind"] == "byte":
        return ByteTokenizer()
    from tokenizers import Tokenizer

    path = directory / "tokenizer.json"
    if not path.is_file():
        raise DataInputError(f"is missing: the shards were cut with the BPE tokenizer it held; remove {directory} and "
                             "prepare the corpus again", where=str(path))
    try:
        tokenizer = Tokenizer.from_file(str(path))
    except Exception as err:  # noqa: BLE001 - the tokenizers library raises a bare Exception for a bad file
        raise DataInputError(f"is not a tokenizer file ({err}): the shards were cut with the tokenizer it held; remove "
                             f"{directory} and prepare the corpus again", where=str(path)) from None
    return BpeTokenizer(tokenizer)
