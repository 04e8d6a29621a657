"""What a prepared directory holds, and the record of it: `progress.json` while it is built, the per-set
document tables from the shards, and `meta.json` last.

    meta.json, tokenizer.json (absent for the byte tokenizer), decontamination.json, progress.json
    train/<source>/<file:05d>-<k:04d>.{tokens.npy,index.npy,ids.json,json}   shards (shard_writer)
    train/<source>.{docs,keys,strata,order}.npy                             the source's document table
    eval/<domain>/...; eval/<domain>.docs.npy                               the same for the held-out sets

Per set, the document table is `<split>/<set>.docs.npy` (int64 [docs, 3]: start in the set's token
stream, tokens with EOS, bytes); training sources also `.keys.npy` (the sampler's uint64 hash of the
id), `.strata.npy` (document order by collection name, then key) and `.order.npy` (by key). `meta.json`
holds the input key, the tokenizer, per-set counts, and the shards with their counts and hashes;
`rungs.data.corpus.PreparedCorpus` reads it. Files an earlier prepare wrote that this corpus does not
list are removed; files a prepare did not write are never touched (`rungs.data.out_dir`).
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

import numpy as np

from rungs.data.atomic import _TMP_MARK, atomic_write_bytes, atomic_write_json, npy_bytes
from rungs.data.corpus import FORMAT_VERSION
from rungs.data.manifest import Manifest
from rungs.data.out_dir import set_table_files
from rungs.data.subset import collection_of, subset_key

log = logging.getLogger("rungs.data.prepare")


class Progress:
    """`progress.json`: the input key and the steps completed under it (shards keep their own marks)."""

    def __init__(self, out_dir: Path, key: str) -> None:
        self.path = out_dir / "progress.json"
        self.key = key
        state = json.loads(self.path.read_text()) if self.path.exists() else {}
        if state.get("key") != key:
            if state:
                log.info("prepare: inputs changed since the last attempt; starting over in %s", out_dir)
            state = {"key": key, "steps": {}}
        self.state = state

    def done(self, step: str) -> dict | None:
        return self.state["steps"].get(step)

    def mark(self, step: str, info: dict) -> None:
        self.state["steps"][step] = info
        atomic_write_json(self.path, self.state)


def write_set_table(out: Path, split: str, name: str, shards: list[dict], progress: Progress) -> dict:
    """The set's document table (and, for a source, the sampler's keys and orders) from its shards.

    Holds 8 bytes per document for the keys plus the sorts' indices; the shards are read one at a time."""
    step = f"{split}/{name}"
    info = progress.done(step)
    if info is not None and info.get("shards") == shards and \
            all((out / f).exists() for f in set_table_files(split, name)):  # a table lost since is written again
        return info
    tables, keys, codes, collections = [], [], [], {}
    start = 0
    for shard in shards:
        index = np.load(out / f"{shard['stem']}.index.npy")
        index[:, 0] += start
        start += shard["tokens"]
        tables.append(index)
        if split == "train":
            ids = json.loads((out / f"{shard['stem']}.ids.json").read_text())["ids"]
            keys.append(np.fromiter((subset_key(name, d) for d in ids), dtype=np.uint64, count=len(ids)))
            codes.append(np.fromiter((collections.setdefault(collection_of(d), len(collections)) for d in ids),
                                     dtype=np.int64, count=len(ids)))
    table = np.concatenate(tables) if tables else np.zeros((0, 3), np.int64)
    atomic_write_bytes(out / split / f"{name}.docs.npy", npy_bytes(table))
    info = {"docs": int(len(table)), "tokens": int(start), "bytes": int(table[:, 2].sum()), "shards": shards,
            "sha256": hashlib.sha256(b"".join(s["sha256"].encode() for s in shards)).hexdigest()}
    if split == "train":
        key_arr = np.concatenate(keys)
        names = sorted(collections)
        rank = np.empty(len(names), dtype=np.int64)
        for r, c in enumerate(names):
            rank[collections[c]] = r
        code_arr = rank[np.concatenate(codes)]
        atomic_write_bytes(out / split / f"{name}.keys.npy", npy_bytes(key_arr))
        atomic_write_bytes(out / split / f"{name}.order.npy", npy_bytes(np.argsort(key_arr, kind="stable")))
        atomic_write_bytes(out / split / f"{name}.strata.npy", npy_bytes(np.lexsort((key_arr, code_arr))))
        if any("weighted_tokens" in s for s in shards):
            # One weighted pass over the source: Σ weight · tokens (with EOS), what its epochs are counted in.
            info["weighted_tokens"] = float(sum(s.get("weighted_tokens", s["tokens"]) for s in shards))
        info["collections"] = [{"name": c, "docs": int((code_arr == r).sum()),
                                "tokens": int(table[code_arr == r, 1].sum())} for r, c in enumerate(names)]
    progress.mark(step, info)
    return info


def write_meta(out: Path, key: str, manifest: Manifest, tokenizer_json: dict, entries: dict[str, dict], *,
               owned: set[str]) -> None:
    """`meta.json`, written last (after the `owned` files not listed in it are removed): the corpus is ready."""
    meta = {
        "format_version": FORMAT_VERSION, "key": key, "manifest": str(manifest.path), "name": manifest.name,
        "tokenizer": tokenizer_json,
        "sources": [{"name": s.name, "domain": s.domain, "share": s.share, **entries[f"train/{s.name}"]}
                    for s in manifest.sources],
        "eval": [{"name": e.name, "domain": e.domain, **entries[f"eval/{e.name}"]} for e in manifest.eval_sets],
    }
    remove_unlisted(out, meta, owned)
    atomic_write_json(out / "meta.json", meta)


def remove_unlisted(out: Path, meta: dict, owned: set[str]) -> None:
    """Files under train/ and eval/ that a prepare wrote (`owned`: relative paths) and this corpus does not
    list (shards of a file since dropped from the manifest, sets since renamed): removed. Any other file is
    left alone, and only folders emptied here are removed."""
    keep = set()
    for split, entries in (("train", meta["sources"]), ("eval", meta["eval"])):
        for e in entries:
            keep.update(f"{split}/{e['name']}.{part}.npy" for part in ("docs", "keys", "order", "strata"))
            keep.update(f"{s['stem']}{ext}" for s in e["shards"] for ext in (".tokens.npy", ".index.npy",
                                                                            ".ids.json", ".json"))
    emptied = set()
    for split in ("train", "eval"):
        for path in sorted((out / split).rglob("*"), reverse=True):
            rel = path.relative_to(out).as_posix()
            if path.is_dir():
                if path in emptied and not any(path.iterdir()):
                    path.rmdir()
                    emptied.add(path.parent)
            elif rel in owned and rel not in keep and _TMP_MARK not in path.name:
                log.info("prepare: removing %s, written by an earlier prepare and not part of this corpus", path)
                path.unlink()
                emptied.add(path.parent)
