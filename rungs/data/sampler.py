"""The source-scaled sampler: each source's capped unique subset, cycled its planned epochs.

For every source the plan gives a unique-token cap U and an epoch count e (the same e at every
rung; `ladder.plan.sources`). The subset is the prefix of the source's documents ordered by a hash of
their ids, cut at exactly U tokens (the last document truncated): a smaller rung's prefix is
contained in a larger one's, so subsets nest across rungs.

With `subset="stratified"` (the default) the prefix is taken per collection: a document's
collection is the part of its id before the first '/' (ids without one form a single collection),
and each collection gets U's share in proportion to its tokens in the source, so every rung sees
the source's mix of collections. A plain hash prefix over few, large documents does not: in the
demo's math source the Metamath statements were 41% of L4's subset, 23% of L7's and 31% of L9's,
and that alone put a step into math's held-out BPB (docs/backtest_diagnosis/README.md).
`subset="prefix"` is the plain prefix, kept to reproduce runs made before.

Each pass over the subset visits its documents in a fresh seeded permutation; sources are
interleaved in chunks so that each advances in proportion to its planned tokens U·e (i.e. by
share), and the stream is cut into packed sequences of `seq_len` (documents separated by EOS;
targets are inputs shifted by one).

A weighted source (documents with a `weight`, from `ladder data mix` with `diversity: weight`) counts
its tokens weighted: one pass over it is U_w = Σ_d w_d·n_d tokens (n_d with its EOS), and that is
the source's unique tokens in the plan (its cap and its epochs). Its subset is the same hash prefix
as an unweighted source's at the same fraction of the source (cap / U_w of its raw tokens, so
subsets still nest), and each pass draws every subset document c_d times, c_d = ⌊w_d⌋ plus one
more with probability w_d − ⌊w_d⌋ (seeded per source and pass), in a seeded permutation: over
passes a document's frequency is proportional to its weight, and a pass holds Σ w_d·n_d tokens in
expectation. An unweighted source's passes are exactly the permutations they always were.

With `order="keyed"` a pass visits its documents by a key of each document's own: a hash of (seed,
source, pass, document id), the weighted draw's coin likewise. Two arms whose subsets share documents (a
curated arm and its baseline) then see the shared ones in the same relative order on the same seed, where a
permutation of a subset of another size is a different order altogether: arms paired on their seed share
their data order's part of the seed noise as well as their initial weights'. `order="permutation"` (the
default) is the rule of every run made before. The keyed rule hashes (BLAKE2b) the ids of the subset's
documents when a stream starts, reading every id of the source: a start-up cost the permutation does not
have, small on the demo, large on a source of 10^8 documents. The subset keys `prepare` stores
(`<source>.keys.npy`) would avoid it, but give another order than the runs made with this one.

The state is a few integers per source plus the pieces read ahead but not yet emitted, so a
checkpoint restores the identical stream.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
from dataclasses import dataclass

import numpy as np
import torch

from rungs.data.corpus import PreparedCorpus
from rungs.data.errors import DataInputError, SourceTooSmallError
from rungs.data.subset import caps_by_collection, collection_of, fill_prefix, prefix_length, prefix_of

log = logging.getLogger(__name__)
STATE_VERSION = 1
SUBSET_RULES = ("stratified", "prefix")
ORDER_RULES = ("permutation", "keyed")


def _mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser, elementwise on uint64 (wrapping): a bijection that scatters nearby inputs."""
    with np.errstate(over="ignore"):
        x = x.astype(np.uint64, copy=True)
        x ^= x >> np.uint64(30)
        x *= np.uint64(0xBF58476D1CE4E5B9)
        x ^= x >> np.uint64(27)
        x *= np.uint64(0x94D049BB133111EB)
        x ^= x >> np.uint64(31)
    return x


def doc_id_hashes(doc_ids) -> np.ndarray:
    """A 64-bit hash of each document id (BLAKE2b), the same wherever the document is."""
    return np.fromiter((int.from_bytes(hashlib.blake2b(str(d).encode(), digest_size=8).digest(), "little")
                        for d in doc_ids), dtype=np.uint64, count=len(doc_ids))


def keyed_order(id_hashes: np.ndarray, *, seed: int, source_key: int, epoch: int,
                weights: np.ndarray | None = None) -> np.ndarray:
    """One pass's order of a subset's documents (indices into `id_hashes`), each placed by a key of its own
    id and (seed, source, pass): any subset's order is the full set's order with the others left out. With
    `weights`, document d is drawn ⌊w_d⌋ times and once more where its own coin falls below w_d − ⌊w_d⌋,
    every copy placed by its own key."""
    with np.errstate(over="ignore"):
        salt = _mix64(np.array([seed], np.uint64) ^ _mix64(np.array([source_key], np.uint64))
                      ^ _mix64(np.array([epoch + 1], np.uint64) * np.uint64(0x9E3779B97F4A7C15)))[0]
        keys = _mix64(id_hashes ^ salt)
        if weights is None:
            return np.argsort(keys, kind="stable")
        whole = np.floor(weights)
        coin = (_mix64(keys ^ np.uint64(0xD1B54A32D192ED03)) >> np.uint64(11)).astype(np.float64) / 2.0**53
        counts = whole.astype(np.int64) + (coin < weights - whole)
        drawn = np.repeat(np.arange(len(id_hashes), dtype=np.int64), counts)
        copy = np.arange(len(drawn), dtype=np.int64) - np.repeat(np.cumsum(counts) - counts, counts)
        copy_keys = _mix64(keys[drawn] ^ _mix64(copy.astype(np.uint64) + np.uint64(1)))
        return drawn[np.argsort(copy_keys, kind="stable")]


@dataclass(frozen=True)
class TokenOrigin:
    source: str
    doc_id: str
    token_offset: int  # position within the document's tokens (== its length for the EOS after it)


@dataclass
class Batch:
    inputs: torch.Tensor  # int64 [batch_sequences, seq_len]
    targets: torch.Tensor  # int64 [batch_sequences, seq_len], inputs shifted by one
    segments: np.ndarray  # int64 [pieces, 5]: buffer start, source index, doc index, doc offset, length
    _sampler: SourceScaledSampler

    def locate(self, row: int, position: int, *, target: bool = False) -> TokenOrigin:
        """Where `inputs[row, position]` (or `targets[row, position]`) came from."""
        seq_len = self.inputs.shape[1]
        if not (0 <= row < self.inputs.shape[0] and 0 <= position < seq_len):
            raise IndexError(f"({row}, {position}) is outside the batch shape {tuple(self.inputs.shape)}")
        flat = row * seq_len + position + (1 if target else 0)
        k = int(np.searchsorted(self.segments[:, 0], flat, side="right")) - 1
        start, src, doc, offset, _ = (int(v) for v in self.segments[k])
        stream = self._sampler.streams[src]
        return TokenOrigin(stream.name, stream.shard.doc_ids[doc], offset + flat - start)


class _SourceStream:
    """One source's capped subset and its cursor (epoch, position in the epoch's order, offset)."""

    def __init__(self, name: str, shard, cap_tokens: int, epochs: float, seed: int, subset: str,
                 order: str = "permutation") -> None:
        self.name = name
        self.order_rule = order
        self._id_hashes: np.ndarray | None = None
        self.shard = shard
        self.cap_tokens = cap_tokens
        self.epochs = epochs
        self.planned_tokens = cap_tokens * epochs
        self.seed = seed
        self.weighted = bool(getattr(shard, "weighted", False))
        raw_cap = cap_tokens
        if self.weighted:  # the cap is in weighted tokens: the same fraction of the source's raw tokens
            raw_cap = min(shard.n_tokens, max(1, int(round(cap_tokens * shard.n_tokens / shard.weighted_tokens))))
        self.seg_doc, self.seg_len = select_subset(shard, name, raw_cap, stratified=subset == "stratified")
        self.seg_weight = np.asarray(shard.weights, dtype=np.float64)[self.seg_doc] if self.weighted else None
        self.tokens = shard.tokens  # memory-mapped shards: only the pages the subset touches are read
        self.doc_starts = shard.index[:, 0]
        self.epoch = 0
        self.pos = 0
        self.offset = 0
        self.pulled = 0
        self._order_epoch = -1
        self._order = np.zeros(0, np.int64)

    def order(self) -> np.ndarray:
        if self._order_epoch != self.epoch:
            name_key = int.from_bytes(hashlib.sha256(self.name.encode()).digest()[:4], "little")
            if self.order_rule == "keyed":
                if self._id_hashes is None:
                    self._id_hashes = doc_id_hashes([self.shard.doc_ids[int(d)] for d in self.seg_doc])
                self._order = keyed_order(self._id_hashes, seed=self.seed, source_key=name_key, epoch=self.epoch,
                                          weights=self.seg_weight)
                self._order_epoch = self.epoch
                return self._order
            rng = np.random.default_rng([self.seed, name_key, self.epoch])
            if self.seg_weight is None:
                self._order = rng.permutation(len(self.seg_doc))
            else:
                whole = np.floor(self.seg_weight)
                counts = whole.astype(np.int64) + (rng.random(len(self.seg_weight)) < self.seg_weight - whole)
                drawn = np.repeat(np.arange(len(self.seg_doc), dtype=np.int64), counts)
                self._order = drawn[rng.permutation(len(drawn))]
            self._order_epoch = self.epoch
        return self._order

    def take(self, n: int) -> list[tuple[int, int, int]]:
        """The next n tokens as pieces (doc index, doc offset, length), crossing documents and epochs."""
        pieces = []
        order = self.order()
        while n > 0:
            if len(order) == 0:  # a weighted pass that drew no document (every weight below 1)
                self.epoch += 1
                order = self.order()
                continue
            seg = int(order[self.pos])
            length = min(n, int(self.seg_len[seg]) - self.offset)
            pieces.append((int(self.seg_doc[seg]), self.offset, length))
            self.offset += length
            self.pulled += length
            n -= length
            if self.offset == self.seg_len[seg]:
                self.offset = 0
                self.pos += 1
                if self.pos == len(order):
                    self.pos = 0
                    self.epoch += 1
                    order = self.order()
        return pieces

    def state(self) -> dict:
        return {"epoch": self.epoch, "pos": self.pos, "offset": self.offset, "pulled": self.pulled}


def collection_tokens(shard, docs: np.ndarray, used: np.ndarray) -> dict[str, int]:
    """Tokens per collection (sorted by name) of a subset given as (doc indices, tokens used of each)."""
    out: dict[str, int] = {}
    ids = shard.doc_ids
    for d, n in zip(docs.tolist(), used.tolist()):
        c = collection_of(ids[d])
        out[c] = out.get(c, 0) + n
    return dict(sorted(out.items()))


def collection_caps(shard, cap_tokens: int) -> dict[str, tuple[np.ndarray, int]]:
    """Per collection (sorted by name): its document indices (in subset-key order) and its share of
    `cap_tokens`, proportional to the collections' tokens (cumulative floors: they sum to `cap_tokens`)."""
    _, strata, collections = shard.subset_arrays(shard.name)
    caps = caps_by_collection([tokens for _, _, tokens in collections], cap_tokens)
    out, pos = {}, 0
    for (name, docs, _), cap in zip(collections, caps):
        out[name] = (np.asarray(strata[pos:pos + docs], dtype=np.int64), cap)
        pos += docs
    return out


def select_subset(shard, source: str, cap_tokens: int, *, stratified: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """The source's unique subset at `cap_tokens`: (doc indices, tokens used of each).

    Stratified: a hash prefix within each collection, sized by the collection's share (module
    docstring); otherwise one hash prefix over all documents. Vectorised (`rungs.data.subset`): reads
    the head of each collection's precomputed order, a block at a time."""
    if not 0 < cap_tokens <= shard.n_tokens:
        raise DataInputError(f"a unique subset of {cap_tokens:,} tokens is outside 1..{shard.n_tokens:,}, the "
                             f"source's size", field=f"sources.{source}")
    order, strata, collections = shard.subset_arrays(source)
    lengths = shard.index[:, 1]
    if not stratified:
        return prefix_of(order, lengths, cap_tokens)
    caps = caps_by_collection([t for _, _, t in collections], cap_tokens)
    spans, pos = [], 0  # per collection with a cap: (its slice of the strata order, docs taken, last used)
    for (_, n_docs, _), cap in zip(collections, caps):
        if cap > 0:
            members = strata[pos:pos + n_docs]
            spans.append((members, *prefix_length(members, lengths, cap)))
        pos += n_docs
    total = sum(n for _, n, _ in spans)
    docs, used = np.empty(total, np.int64), np.empty(total, np.int64)
    at = 0
    for members, n, last in spans:
        fill_prefix(members, lengths, n, last, docs[at:at + n], used[at:at + n])
        at += n
    return docs, used


def _plan_float(plan: dict, source: str, key: str) -> float:
    entry = plan[source]
    if not isinstance(entry, dict):  # a SourceAllocation-like object instead of its dict
        entry = {k: getattr(entry, k) for k in ("share", "unique_tokens", "epochs") if hasattr(entry, k)}
    if key not in entry:
        raise DataInputError(f"plan entry for {source!r} needs {key!r} (share, unique_tokens, epochs)", field="plan")
    try:
        value = float(entry[key])
    except (TypeError, ValueError):
        raise DataInputError(f"{key} must be a number, got {entry[key]!r}", field=f"plan.{source}.{key}") from None
    if not 0 < value < math.inf:
        raise DataInputError(f"{key} must be a positive finite number, got {value}", field=f"plan.{source}.{key}")
    return value


class SourceScaledSampler:
    def __init__(self, corpus: PreparedCorpus, plan: dict[str, dict], *, seq_len: int, batch_sequences: int,
                 seed: int, chunk_tokens: int | None = None, subset: str = "stratified",
                 order: str = "permutation") -> None:
        if subset not in SUBSET_RULES:
            raise DataInputError(f"subset must be one of {SUBSET_RULES}, got {subset!r}", field="subset")
        if order not in ORDER_RULES:
            raise DataInputError(f"order must be one of {ORDER_RULES}, got {order!r}", field="data_order")
        if seq_len <= 0 or batch_sequences <= 0:
            raise DataInputError(f"seq_len and batch_sequences must be positive, got {seq_len}, {batch_sequences}")
        if chunk_tokens is not None and chunk_tokens <= 0:  # a chunk that adds no tokens never fills a batch
            raise DataInputError(f"chunk_tokens must be positive, got {chunk_tokens}", field="chunk_tokens")
        if seed < 0:  # numpy's seed sequences take non-negative integers only
            raise DataInputError(f"seed must be a non-negative integer, got {seed}", field="seed")
        if not plan:
            raise DataInputError("the plan has no sources", field="plan")
        unknown = [s for s in plan if s not in corpus.train_sources]
        if unknown:
            raise DataInputError(f"plan sources {unknown} are not in the corpus (it has {corpus.train_sources})",
                                 where=str(corpus.path), field="plan")
        total_share = sum(_plan_float(plan, s, "share") for s in plan)
        if abs(total_share - 1.0) > 1e-6:
            raise DataInputError(f"plan shares sum to {total_share:.6g}; they must sum to 1", field="plan")
        self.seq_len = seq_len
        self.batch_sequences = batch_sequences
        self.seed = int(seed)
        self.chunk_tokens = chunk_tokens or seq_len
        self.subset = subset
        self.order = order
        self.plan = {s: {k: _plan_float(plan, s, k) for k in ("share", "unique_tokens", "epochs")} for s in plan}
        self.streams: list[_SourceStream] = []
        for name in plan:
            cap = max(1, int(round(_plan_float(plan, name, "unique_tokens"))))
            shard = corpus.train_shard(name)
            size = int(np.ceil(shard.weighted_tokens)) if shard.weighted else shard.n_tokens
            if cap > size:
                short = cap - size
                raise SourceTooSmallError(
                    f"source {name!r} has {size:,} {'weighted ' if shard.weighted else ''}tokens but the plan caps its "
                    f"unique data at {cap:,}: "
                    f"short by {short:,} tokens ({short / cap:.1%} of the cap); add documents to the source or lower "
                    f"its unique_tokens in the recipe mixture", where=str(corpus.path), field=f"sources.{name}")
            self.streams.append(_SourceStream(name, shard, cap, _plan_float(plan, name, "epochs"), self.seed,
                                             subset, order))
        # What the stream is drawn from: each source's train shards, by content. The cursors in a saved
        # state index these documents, so a state is only restored onto the same tokens.
        self.corpus_path = corpus.path
        self.data_sha256 = {name: corpus.source_info(name).get("sha256") for name in plan}
        self.pending: list[tuple[int, int, int, int]] = []  # (source index, doc index, offset, length)
        self._pending_tokens = 0
        self.batches = 0
        self._warned_past_plan = False

    # ---- stream ----
    def _pull_chunk(self) -> None:
        progress = [s.pulled / s.planned_tokens for s in self.streams]
        i = progress.index(min(progress))  # the source furthest behind its share (ties: plan order)
        if progress[i] >= 1.0 and not self._warned_past_plan:
            log.warning("sampler: every source has passed its planned epochs; continuing to cycle")
            self._warned_past_plan = True
        self.pending.extend((i, d, o, n) for d, o, n in self.streams[i].take(self.chunk_tokens))
        self._pending_tokens += self.chunk_tokens

    def next_batch(self) -> Batch:
        need = self.batch_sequences * self.seq_len + 1
        while self._pending_tokens < need:
            self._pull_chunk()
        buffer = np.empty(need, dtype=np.int64)
        segments = []
        filled = 0
        keep: list[tuple[int, int, int, int]] = []
        for k, (src, doc, off, n) in enumerate(self.pending):
            take = min(n, need - filled)
            stream = self.streams[src]
            start = int(stream.doc_starts[doc]) + off
            buffer[filled:filled + take] = stream.tokens[start:start + take]
            segments.append((filled, src, doc, off, take))
            filled += take
            if filled == need:
                # The last token is both this batch's final target and the next batch's first input.
                keep = [(src, doc, off + take - 1, n - take + 1)] + self.pending[k + 1:]
                break
        self.pending = keep
        self._pending_tokens = sum(p[3] for p in keep)
        self.batches += 1
        tokens = torch.from_numpy(buffer)
        shape = (self.batch_sequences, self.seq_len)
        return Batch(tokens[:-1].view(shape), tokens[1:].view(shape), np.asarray(segments, dtype=np.int64), self)

    # ---- state ----
    def _plan_key(self) -> str:
        payload = json.dumps([self.plan, self.seq_len, self.batch_sequences, self.seed, self.chunk_tokens]
                             + ([] if self.subset == "prefix" else [self.subset])
                             + ([] if self.order == "permutation" else [self.order]),
                             sort_keys=True, default=float)
        return hashlib.sha256(payload.encode()).hexdigest()[:16]

    def state_dict(self) -> dict:
        return {"version": STATE_VERSION, "plan_key": self._plan_key(), "batches": self.batches,
                "streams": {s.name: s.state() for s in self.streams}, "pending": [list(p) for p in self.pending],
                "data_sha256": dict(self.data_sha256)}

    def load_state_dict(self, state: dict) -> None:
        if state.get("version") != STATE_VERSION or state.get("plan_key") != self._plan_key():
            raise DataInputError("sampler state was saved for a different plan, shape or seed", field="state")
        # A corpus prepared again from edited files (or another tokenizer) keeps the config, and with it
        # the checkpoint's key: without this check the job would continue on other documents (and
        # other token ids) from cursors that index the old ones. States saved before it was recorded
        # carry no data_sha256 and are restored as they were.
        for name, saved in (state.get("data_sha256") or {}).items():
            now = self.data_sha256.get(name)
            if saved is not None and now is not None and saved != now:
                raise DataInputError(
                    f"the checkpoint's data stream was drawn from other training data (shards sha256 {saved[:12]}…, "
                    f"now {now[:12]}…): the corpus was prepared again from changed files or with another tokenizer. "
                    "Restore the corpus the job started on, or start over with --fresh (resume=False)",
                    where=str(self.corpus_path), field=f"sources.{name}")
        for s in self.streams:
            st = state["streams"][s.name]
            s.epoch, s.pos, s.offset, s.pulled = int(st["epoch"]), int(st["pos"]), int(st["offset"]), int(st["pulled"])
        self.pending = [tuple(int(v) for v in p) for p in state["pending"]]
        self._pending_tokens = sum(p[3] for p in self.pending)
        self.batches = int(state["batches"])

    def report(self) -> dict[str, dict]:
        """Per source: planned vs realised unique tokens and epochs, over the tokens emitted so far."""
        held = [0] * len(self.streams)
        for src, _, _, n in self.pending:
            held[src] += n
        out = {}
        for i, s in enumerate(self.streams):
            emitted = s.pulled - held[i]
            out[s.name] = {
                "planned_unique_tokens": s.cap_tokens, "planned_epochs": s.epochs,
                "planned_tokens": s.planned_tokens, "emitted_tokens": emitted,
                "unique_tokens": min(emitted, s.cap_tokens), "epochs": emitted / s.cap_tokens,
                "subset_docs": len(s.seg_doc), "subset_rule": self.subset,
                "subset_collections": collection_tokens(s.shard, s.seg_doc, s.seg_len),
            }
        return out
