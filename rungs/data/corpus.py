"""Read a prepared corpus: tokenizer, memory-mapped token shards and document indexes."""

from __future__ import annotations

import json
from functools import cached_property
from pathlib import Path

import numpy as np

from rungs.data.errors import DataInputError
from rungs.data.tokenizer import load_tokenizer, token_dtype

FORMAT_VERSION = 2  # rungs.data.prepare writes this; 1 was one .npy per set (older versions)


class ShardedTokens:
    """One set's token stream over its shard files: indexable and sliceable like a 1-D array; each shard is
    memory-mapped the first time a read touches it, so a rank maps only the shards its subset uses."""

    def __init__(self, paths: list[Path], sizes: list[int], dtype: np.dtype) -> None:
        self.paths = paths
        self.sizes = np.asarray(sizes, dtype=np.int64)
        self.starts = np.concatenate([[0], np.cumsum(self.sizes)]).astype(np.int64)
        self.dtype = np.dtype(dtype)
        self._maps: dict[int, np.ndarray] = {}

    @property
    def shape(self) -> tuple[int]:
        return (int(self.starts[-1]),)

    @property
    def size(self) -> int:
        return int(self.starts[-1])

    ndim = 1

    def __len__(self) -> int:
        return self.size

    def _map(self, k: int) -> np.ndarray:
        if k not in self._maps:
            self._maps[k] = np.load(self.paths[k], mmap_mode="r")
        return self._maps[k]

    def __getitem__(self, item):
        if isinstance(item, slice):
            begin, end, step = item.indices(self.size)
            if step != 1:
                return np.asarray(self)[item]
            if end <= begin:
                return np.zeros(0, self.dtype)
            k = int(np.searchsorted(self.starts, begin, side="right")) - 1
            if end <= self.starts[k + 1]:  # within one shard: documents never cross shards
                return self._map(k)[begin - self.starts[k]:end - self.starts[k]]
            parts = []
            while begin < end:
                stop = min(end, int(self.starts[k + 1]))
                parts.append(self._map(k)[begin - self.starts[k]:stop - self.starts[k]])
                begin, k = stop, k + 1
            return np.concatenate(parts)
        i = int(item)
        if i < 0:
            i += self.size
        if not 0 <= i < self.size:
            raise IndexError(f"token {item} is outside 0..{self.size - 1}")
        k = int(np.searchsorted(self.starts, i, side="right")) - 1
        return self._map(k)[i - self.starts[k]]

    def __array__(self, dtype=None, copy=None):
        whole = np.concatenate([self._map(k) for k in range(len(self.paths))]) if self.paths else \
            np.zeros(0, self.dtype)
        return whole.astype(dtype) if dtype is not None else whole

    def max(self):
        return np.asarray(self).max()

    def min(self):
        return np.asarray(self).min()


class DocumentShard:
    """One set's documents: `tokens[start:start+n]` is a document followed by EOS.

    `tokens` is an array or a `ShardedTokens`; `index` is int64 [docs, 3] (start, tokens with EOS, UTF-8
    bytes), memory-mapped for a prepared corpus; `doc_ids` is read on first use. The sampler's subset
    arrays (`subset_arrays`) come from the prepared corpus or, for a shard built in memory, from its ids.
    """

    def __init__(self, name: str, domain: str, tokens, index: np.ndarray, doc_ids: tuple[str, ...] | None = None,
                 *, ids_loader=None, subset_loader=None, weights: np.ndarray | None = None,
                 weights_loader=None) -> None:
        self.name = name
        self.domain = domain
        self.tokens = tokens
        self.index = index
        self._doc_ids = tuple(doc_ids) if doc_ids is not None else None
        self._ids_loader = ids_loader
        self._subset_loader = subset_loader
        self._subset: dict[str, tuple] = {}
        self._weights = None if weights is None else np.asarray(weights, dtype=np.float64)
        self._weights_loader = weights_loader
        self._weighted = weights is not None or weights_loader is not None

    @property
    def weighted(self) -> bool:
        """Whether the set carries sampling weights (`ladder data mix`'s `weight`; else every weight is 1)."""
        return self._weighted

    @property
    def weights(self) -> np.ndarray:
        """float64 [docs]: each document's sampling weight (all 1 for an unweighted set)."""
        if self._weights is None:
            self._weights = np.asarray(self._weights_loader(), dtype=np.float64) if self._weights_loader else \
                np.ones(self.n_docs)
        return self._weights

    @property
    def weighted_tokens(self) -> float:
        """Σ weight · tokens (each with its EOS): the tokens of one weighted pass over the set."""
        return float(np.dot(self.weights, np.asarray(self.index[:, 1], dtype=np.float64)))

    @property
    def doc_ids(self) -> tuple[str, ...]:
        if self._doc_ids is None:
            self._doc_ids = tuple(self._ids_loader())
        return self._doc_ids

    @property
    def n_docs(self) -> int:
        return int(self.index.shape[0])

    @property
    def n_tokens(self) -> int:
        return int(self.tokens.shape[0])

    def document_tokens(self, i: int) -> np.ndarray:
        """The tokens of document i without its trailing EOS."""
        start, n, _ = (int(v) for v in self.index[i])
        return self.tokens[start:start + n - 1]

    def subset_arrays(self, source: str) -> tuple[np.ndarray, np.ndarray, list[tuple[str, int, int]]]:
        """(order by subset key, order by collection then key, [(collection, docs, tokens)] by name)."""
        if source not in self._subset:
            if self._subset_loader is not None and source == self.name:
                self._subset[source] = self._subset_loader()
            else:
                self._subset[source] = self._subset_from_ids(source)
        return self._subset[source]

    def _subset_from_ids(self, source: str):
        from rungs.data.subset import collection_of, subset_key

        keys = np.fromiter((subset_key(source, d) for d in self.doc_ids), dtype=np.uint64, count=self.n_docs)
        names = sorted({collection_of(d) for d in self.doc_ids})
        rank = {c: r for r, c in enumerate(names)}
        codes = np.fromiter((rank[collection_of(d)] for d in self.doc_ids), dtype=np.int64, count=self.n_docs)
        lengths = np.asarray(self.index[:, 1], dtype=np.int64)
        collections = [(c, int((codes == r).sum()), int(lengths[codes == r].sum())) for r, c in enumerate(names)]
        return np.argsort(keys, kind="stable"), np.lexsort((keys, codes)), collections


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
        try:
            meta = json.loads(meta_path.read_text())
        except ValueError as err:  # not JSON, or not UTF-8
            raise DataInputError(f"is not valid JSON ({err}); rerun `ladder data prepare` into {path} to prepare it "
                                 "again", where=str(meta_path)) from None
        if not isinstance(meta, dict):
            raise DataInputError(f"is not a JSON object; rerun `ladder data prepare` into {path} to prepare it again",
                                 where=str(meta_path))
        if meta.get("format_version") != FORMAT_VERSION:
            raise DataInputError(f"prepared in format {meta.get('format_version')}, this version reads "
                                 f"{FORMAT_VERSION}: run `ladder data prepare` again", where=str(path))
        return cls(path, meta)

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
            entry = next(e for e in entries if e["name"] == name)
            vocab_size = int(self.meta["tokenizer"]["vocab_size"])
            dtype = token_dtype(vocab_size)
            paths = [self.path / f"{s['stem']}.tokens.npy" for s in entry["shards"]]
            lost = next((p for p in [*paths, base / f"{name}.docs.npy"] if not p.exists()), None)
            if lost is not None:
                raise DataInputError(f"is missing (removed since prepare wrote it); rerun the `ladder data prepare` "
                                     f"that wrote {self.path}: it writes what is missing again", where=str(lost))
            for p in paths:
                found = np.load(p, mmap_mode="r").dtype
                if found != dtype:
                    raise DataInputError(f"{p.relative_to(self.path)} holds {found} ids but the vocabulary has "
                                         f"{vocab_size:,} entries (needs {dtype}); ids may have wrapped: prepare "
                                         "this corpus again", where=str(self.path))
            tokens = ShardedTokens(paths, [s["tokens"] for s in entry["shards"]], dtype)
            index = np.load(base / f"{name}.docs.npy", mmap_mode="r")
            stems = [s["stem"] for s in entry["shards"]]

            def ids(stems=stems):
                out: list[str] = []
                for stem in stems:
                    out.extend(json.loads((self.path / f"{stem}.ids.json").read_text())["ids"])
                return out

            subset = None
            if split == "train":
                def subset(base=base, name=name, entry=entry):
                    return (np.load(base / f"{name}.order.npy", mmap_mode="r"),
                            np.load(base / f"{name}.strata.npy", mmap_mode="r"),
                            [(c["name"], c["docs"], c["tokens"]) for c in entry["collections"]])

            weights = None
            if "weighted_tokens" in entry:
                def weights(stems=stems, docs=[s["docs"] for s in entry["shards"]]):
                    out: list[float] = []
                    for stem, n in zip(stems, docs):
                        out.extend(json.loads((self.path / f"{stem}.ids.json").read_text()).get("weights", [1.0] * n))
                    return out

            self._shards[(split, name)] = DocumentShard(entry["name"], entry["domain"], tokens, index,
                                                        ids_loader=ids, subset_loader=subset, weights_loader=weights)
        return self._shards[(split, name)]

    def summary(self) -> dict:
        return {"path": str(self.path), "tokenizer": self.meta["tokenizer"],
                "sources": {s["name"]: {k: s[k] for k in ("domain", "share", "docs", "tokens", "bytes")}
                            for s in self.meta["sources"]},
                "eval": {e["name"]: {k: e[k] for k in ("domain", "docs", "tokens", "bytes")} for e in self.meta["eval"]}}
