"""`ladder data prepare MANIFEST --out DIR [--overwrite]`: tokenized shards, held-out sets and the decontamination
report (into a new or empty directory, or one it prepared; see `rungs.data.out_dir`);
`ladder data inspect DIR`: the shard manifest of a prepared directory and a decoded sample of documents.

Exit 2 with one line naming the file and field on bad input (nothing is written); exit 1 with one
line naming the file when the disk fills (no half-written file is left visible; rerun once space is
freed and the prepare continues from its last finished step).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from ladder.errors import LadderInputError
from ladder.cli.output import make_table, print_json, stdout_console
from rungs.data.corpus import PreparedCorpus
from rungs.data.errors import DataDiskFullError, DataInputError
from rungs.data.manifest import DEMO_MANIFEST
from rungs.data.prepare import SHARD_BYTES, prepare
from rungs.data.tokenizer import BYTE_VOCAB_SIZE


def register(sub: argparse._SubParsersAction) -> None:
    data = sub.add_parser("data", help="corpus preparation: tokenizer, shards, held-out sets")
    data_sub = data.add_subparsers(dest="data_command", required=True)
    p = data_sub.add_parser("prepare", help="tokenize a corpus manifest into shards (resumable, idempotent)")
    p.add_argument("manifest", help="corpus manifest YAML, or 'demo' for the shipped demo corpus")
    p.add_argument("--out", required=True, help="output directory for the shards")
    p.add_argument("--vocab-size", type=int, default=None,
                   help="vocabulary size: of the BPE to train (default 512, cpu-demo's), or the model's vocabulary "
                        "a --tokenizer file (or byte's 257 ids) must fit (default: the file's own size)")
    p.add_argument("--tokenizer", default="bpe",
                   help="'bpe' (train a byte-level BPE, default), 'byte', or the path of a Hugging Face tokenizer.json "
                        "with an <|endoftext|> token (a fixed vocabulary; over 65,536 entries the shards are uint32)")
    p.add_argument("--workers", type=int, default=None,
                   help="parallel workers (Ray tasks, one segment of an input file each); default: every core when the inputs "
                        f"exceed {AUTO_PARALLEL_BYTES >> 20} MB, else 1 (in this process: Ray's start-up would cost "
                        "more than it saves). The output is the same bytes for any number")
    p.add_argument("--address", default=None, help="a Ray cluster to run the workers on (e.g. ray://head:10001)")
    p.add_argument("--shard-bytes", type=int, default=SHARD_BYTES,
                   help=f"input bytes per shard (default {SHARD_BYTES >> 20} MiB): a large file is cut into segments "
                        "of this size, one shard each; another size gives other shards")
    p.add_argument("--split-bytes", type=int, default=None,
                   help="input bytes per task (default: one shard); the output is the same for any value")
    p.add_argument("--overwrite", action="store_true",
                   help="replace a corpus prepared in --out from other inputs (only the files prepare wrote there)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(handler=run, on_interrupt="rerun the same command to resume: finished shards are kept")
    i = data_sub.add_parser("inspect", help="print a prepared directory's shard manifest and decode sample documents")
    i.add_argument("dir", help="a directory written by `ladder data prepare`")
    i.add_argument("--docs", type=int, default=2, help="documents decoded per set (default 2)")
    i.add_argument("--chars", type=int, default=200, help="characters shown per decoded document (default 200)")
    i.add_argument("--json", action="store_true", help="print one JSON object")
    i.set_defaults(handler=run_inspect)
    from ladder.cli import curate as curate_cli  # curate, mix, and inspect --removed

    curate_cli.register(data_sub)


AUTO_PARALLEL_BYTES = 64 << 20


def auto_workers(manifest_path: Path) -> int:
    """Every core for inputs over AUTO_PARALLEL_BYTES (on disk), else 1 (and 1 for a bad manifest: prepare
    checks its arguments in order and names what is wrong)."""
    import os

    from rungs.data.manifest import load_manifest

    try:
        manifest = load_manifest(manifest_path)
    except DataInputError:
        return 1
    from rungs.data.storage import size_of

    size = sum(size_of(f) for ds in manifest.sources + manifest.eval_sets for f in ds.files)
    return (os.cpu_count() or 1) if size > AUTO_PARALLEL_BYTES else 1


def resolve_manifest(name: str) -> Path:
    return DEMO_MANIFEST if name == "demo" else Path(name)


def _vocab_size(args: argparse.Namespace) -> int:
    if args.vocab_size is not None:
        if args.tokenizer == "byte" and args.vocab_size < BYTE_VOCAB_SIZE:  # the model's vocabulary must hold its ids
            raise LadderInputError(f"the byte tokenizer has {BYTE_VOCAB_SIZE} ids (256 bytes and <|endoftext|>); a "
                                   f"vocabulary of {args.vocab_size} cannot hold them (leave the flag out)",
                                   field="--vocab-size")
        return args.vocab_size
    if args.tokenizer in ("bpe", "byte"):
        return 512
    from rungs.data.prepare import tokenizer_file_vocab_size

    try:
        return tokenizer_file_vocab_size(Path(args.tokenizer))
    except DataInputError as err:
        raise LadderInputError(err.detail, where=err.where, field=err.field) from None


def prepare_payload(out: Path, wall_seconds: float) -> dict:
    corpus = PreparedCorpus.open(out)
    summary = corpus.summary()
    decon = json.loads((out / "decontamination.json").read_text())
    return {
        "out": str(out), "manifest": corpus.meta["manifest"], "tokenizer": summary["tokenizer"],
        "sources": summary["sources"], "eval": summary["eval"],
        "decontamination": {"rule": decon["rule"], "train_docs_removed": decon["train_docs_removed"],
                            "eval_docs_overlapping_train": decon["eval_docs_overlapping_train"],
                            "report": str(out / "decontamination.json")},
        "wall_seconds": wall_seconds,
    }


def run(args: argparse.Namespace) -> int:
    t0 = time.perf_counter()
    manifest = resolve_manifest(args.manifest)
    if args.workers is not None and args.workers < 1:
        raise LadderInputError(f"--workers must be at least 1, got {args.workers}", field="--workers")
    vocab_size = _vocab_size(args)
    try:
        workers = args.workers if args.workers is not None else (1 if args.address else auto_workers(manifest))
        out = prepare(manifest, Path(args.out), vocab_size=vocab_size, tokenizer=args.tokenizer,
                      workers=workers, address=args.address, shard_bytes=args.shard_bytes,
                      split_bytes=args.split_bytes, overwrite=args.overwrite)
    except DataInputError as err:
        raise LadderInputError(err.detail, where=err.where or args.manifest, field=err.field) from None
    except DataDiskFullError as err:
        sys.stderr.write(f"ladder data: error: {err.strerror}\n")
        return 1
    payload = prepare_payload(out, time.perf_counter() - t0)
    if args.json:
        print_json(payload)
        return 0
    render(payload)
    return 0


def render(payload: dict) -> None:
    decon = payload["decontamination"]
    rows = []
    for split, sets in (("train", payload["sources"]), ("eval", payload["eval"])):
        for name, s in sets.items():
            removed = decon["train_docs_removed" if split == "train" else "eval_docs_overlapping_train"].get(name, 0)
            rows.append([split, name, s["domain"], f"{s['share']:.0%}" if split == "train" else "",
                         s["docs"], s["bytes"], s["tokens"], s["bytes"] / s["tokens"], removed])
    tok = payload["tokenizer"]
    stdout_console.print(make_table(
        f"ladder data prepare → {payload['out']} ({tok['kind']} tokenizer, vocab {tok['vocab_size']})",
        ["split", "name", "domain", "share", "docs", "bytes", "tokens", "bytes/token", "overlap docs"], rows))
    stdout_console.print(f"decontamination ({decon['rule']}): overlap docs are training documents removed and "
                         f"held-out documents reported; details in {decon['report']}")


def sample_docs(n_docs: int, docs: int) -> list[int]:
    """`docs` documents (at most all `n_docs`) spread evenly over a set: its first and last and between."""
    take = min(docs, n_docs)
    return [round(k * (n_docs - 1) / max(take - 1, 1)) for k in range(take)]


def inspect_payload(directory: Path, docs: int, chars: int) -> dict:
    """The shard manifest and, per set, `docs` documents spread over it, decoded (first `chars` characters)."""
    corpus = PreparedCorpus.open(directory)
    tok = corpus.tokenizer
    sets = []
    for split, entries in (("train", corpus.meta["sources"]), ("eval", corpus.meta["eval"])):
        for e in entries:
            shard = corpus.train_shard(e["name"]) if split == "train" else corpus.eval_shard(e["name"])
            picks = sample_docs(shard.n_docs, docs)
            sample = [{"doc": i, "id": shard.doc_ids[i], "tokens": int(shard.index[i, 1]) - 1,
                       "bytes": int(shard.index[i, 2]), "text": tok.decode(shard.document_tokens(i).tolist())[:chars]}
                      for i in picks]
            sets.append({"split": split, "name": e["name"], "domain": e["domain"], "docs": e["docs"],
                         "tokens": e["tokens"], "bytes": e["bytes"], "shards": e["shards"], "sample": sample})
    return {"dir": str(directory), "format_version": corpus.meta["format_version"], "key": corpus.meta["key"],
            "tokenizer": corpus.meta["tokenizer"], "sets": sets}


def run_inspect(args: argparse.Namespace) -> int:
    if args.docs < 0 or args.chars < 0:
        raise LadderInputError("--docs and --chars must be >= 0", field="--docs")
    try:
        payload = inspect_payload(Path(args.dir), args.docs, args.chars)
    except DataInputError as err:
        raise LadderInputError(err.detail, where=err.where or args.dir, field=err.field) from None
    if args.json:
        print_json(payload)
        return 0
    tok = payload["tokenizer"]
    rows = [[s["split"], s["name"], sh["stem"].rpartition("/")[2], sh["docs"], sh["tokens"], sh["bytes"],
             sh["sha256"][:12]] for s in payload["sets"] for sh in s["shards"]]
    stdout_console.print(make_table(
        f"ladder data inspect {payload['dir']} (format {payload['format_version']}, {tok['kind']} tokenizer, "
        f"vocab {tok['vocab_size']})", ["split", "set", "shard", "docs", "tokens", "bytes", "sha256"], rows))
    for s in payload["sets"]:
        for d in s["sample"]:
            stdout_console.print(f"[bold]{s['split']}/{s['name']}[/bold] doc {d['doc']} {d['id']!r} "
                                 f"({d['tokens']} tokens, {d['bytes']} bytes):", highlight=False)
            stdout_console.print(repr(d["text"]), markup=False, highlight=False)
    return 0
