"""Read a prepared corpus: tokenizer, memory-mapped token shards and document indexes."""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np

from rungs.data.errors import DataInputError
from rungs.data.tokenizer import load_tokenizer, token_dtype


@dataclass(frozen=True)
class DocumentShard:
    """One set's documents: `tokens[start:start+n]` is a document followed by EOS."""

    name: str
    domain: str
    tokens: np.ndarray  # memory-mapped, uint16/uint32
    index: np.ndarray  # int64 [docs, 3]: start, tokens (with EOS), UTF-8 bytes
    doc_ids: tuple[str, ...]

    @property
    def n_docs(self) -> int:
        return int(self.index.shape[0])

    @property
    def n_tokens(self) -> int:
        return int(self.tokens.shape[0])

    def document_tokens(self, i: int) -> np.ndarray:
        """The tokens of document i without its trailing EOS."""
        start, n, _ = self.index[i]
        return self.tokens[start:start + n - 1]


class PreparedCorpus:
    """A directory written by `rungs.data.prepare.prepare`."""

    def __init__(self, path: Path, meta: dict) -> None:
        self.path = path
        self.meta = meta
        self._shards: dict[tuple[str, str], DocumentShard] = {}

    @classmethod
    def open(cls, path: str | Path) -> PreparedCorpus:
        path = Path(path)
        meta_path = path / "meta.json"
        if not meta_path.exists():
            raise DataInputError("not a prepared corpus (no meta.json; run `ladder data prepare` first)", where=str(path))
        return cls(path, json.loads(meta_path.read_text()))

    @cached_property
    def tokenizer(self):
        return load_tokenizer(self.path, self.meta["tokenizer"])

    @property
    def eos_id(self) -> int:
        return int(self.meta["tokenizer"]["eos_id"])

    @property
    def train_sources(self) -> list[str]:
        return [s["name"] for s in self.meta["sources"]]

    @property
    def eval_domains(self) -> list[str]:
        return [e["name"] for e in self.meta["eval"]]

    def source_info(self, source: str) -> dict:
        for s in self.meta["sources"]:
            if s["name"] == source:
                return s
        raise DataInputError(f"unknown source {source!r}; this corpus has {self.train_sources}", where=str(self.path))

    def unique_tokens(self, source: str) -> int:
        """Tokens of a training source, each document counted with its EOS separator."""
        return int(self.source_info(source)["tokens"])

    def train_shard(self, source: str) -> DocumentShard:
        self.source_info(source)
        return self._shard("train", source)

    def eval_shard(self, domain: str) -> DocumentShard:
        if domain not in self.eval_domains:
            raise DataInputError(f"unknown eval domain {domain!r}; this corpus has {self.eval_domains}",
                                 where=str(self.path))
        return self._shard("eval", domain)

    def _shard(self, split: str, name: str) -> DocumentShard:
        if (split, name) not in self._shards:
            base = self.path / split
            entries = self.meta["sources"] if split == "train" else self.meta["eval"]
            domain = next(e["domain"] for e in entries if e["name"] == name)
            tokens = np.load(base / f"{name}.tokens.npy", mmap_mode="r")
            vocab_size = int(self.meta["tokenizer"]["vocab_size"])
            if tokens.dtype != token_dtype(vocab_size):
                raise DataInputError(f"{split}/{name}.tokens.npy holds {tokens.dtype} ids but the vocabulary has "
                                     f"{vocab_size:,} entries (needs {token_dtype(vocab_size)}); ids may have "
                                     "wrapped: prepare this corpus again", where=str(self.path))
            index = np.load(base / f"{name}.index.npy")
            ids = tuple(json.loads((base / f"{name}.ids.json").read_text())["ids"])
            self._shards[(split, name)] = DocumentShard(name, domain, tokens, index, ids)
        return self._shards[(split, name)]

    def summary(self) -> dict:
        return {"path": str(self.path), "tokenizer": self.meta["tokenizer"],
                "sources": {s["name"]: {k: s[k] for k in ("domain", "share", "docs", "tokens", "bytes")}
                            for s in self.meta["sources"]},
                "eval": {e["name"]: {k: e[k] for k in ("domain", "docs", "tokens", "bytes")} for e in self.meta["eval"]}}
