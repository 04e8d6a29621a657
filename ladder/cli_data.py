"""`ladder data prepare MANIFEST --out DIR`: tokenized shards, held-out sets and the decontamination report.

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
from ladder.output import make_table, print_json, stdout_console
from rungs.data.corpus import PreparedCorpus
from rungs.data.errors import DataDiskFullError, DataInputError
from rungs.data.manifest import DEMO_MANIFEST
from rungs.data.prepare import prepare


def register(sub: argparse._SubParsersAction) -> None:
    data = sub.add_parser("data", help="corpus preparation: tokenizer, shards, held-out sets")
    data_sub = data.add_subparsers(dest="data_command", required=True)
    p = data_sub.add_parser("prepare", help="tokenize a corpus manifest into shards (resumable, idempotent)")
    p.add_argument("manifest", help="corpus manifest YAML, or 'demo' for the shipped demo corpus")
    p.add_argument("--out", required=True, help="output directory for the shards")
    p.add_argument("--vocab-size", type=int, default=None,
                   help="vocabulary size: of the BPE to train (default 512, cpu-demo's), or the model's vocabulary "
                        "a --tokenizer file must fit (default: the file's own size)")
    p.add_argument("--tokenizer", default="bpe",
                   help="'bpe' (train a byte-level BPE, default), 'byte', or the path of a Hugging Face tokenizer.json "
                        "with an <|endoftext|> token (a fixed vocabulary; over 65,536 entries the shards are uint32)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(handler=run)


def resolve_manifest(name: str) -> Path:
    return DEMO_MANIFEST if name == "demo" else Path(name)


def _vocab_size(args: argparse.Namespace) -> int:
    if args.vocab_size is not None:
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
    try:
        out = prepare(resolve_manifest(args.manifest), Path(args.out), vocab_size=_vocab_size(args),
                      tokenizer=args.tokenizer)
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
