"""Math held-out BPB of a sweep's trials, scored three ways: as trained, without set.mm's proofs, proofs alone.

The science check's math miss came from the Metamath proofs in math's held-out set. This
rescoring is what showed it, and it is how the demo corpus came to drop them (`build_demo_corpus`,
`without_proofs`). It needs the corpus the trials were trained on: the held-out texts at a commit
from before the change, and that corpus's prepared directory (for its tokenizer):

    python scripts/math_without_proofs.py backtest --tpp 4 --corpus-commit b1118c1 \
        --prepared runs/data/demo-bpe512-17385b760b81 > docs/backtest_diagnosis/math_without_proofs_L4-L9_tpp4.jsonl

One JSON line per trial: rung, seed, train FLOPs, and BPB of the held-out math set as it was
("with_proofs"), with every set.mm proof replaced by '?' ("without_proofs"), and of the proofs alone.
"""

from __future__ import annotations

import argparse
import gzip
import io
import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch

from rungs.data.bpb import document_windows, score_windows
from rungs.data.corpus import PreparedCorpus

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
from bpb_by_origin import finished_trials, load_trial_model  # noqa: E402
from build_demo_corpus import _MM_COMMENT_OR_PROOF, without_proofs  # noqa: E402


def held_out_variants(commit: str) -> dict[str, list[str]]:
    """The math held-out texts at `commit`: as they were, without proofs, and the proofs alone."""
    raw = subprocess.run(["git", "show", f"{commit}:rungs/data/demo/corpus/eval_math.jsonl.gz"], cwd=ROOT,
                         check=True, capture_output=True).stdout
    return split_variants([json.loads(line) for line in gzip.open(io.BytesIO(raw), "rt", encoding="utf-8")])


def split_variants(docs: list[dict]) -> dict[str, list[str]]:
    """Documents as they are, with set.mm's proofs replaced by '?', and set.mm's proofs alone."""
    variants: dict[str, list[str]] = {"with_proofs": [], "without_proofs": [], "proofs": []}
    for doc in docs:
        text = doc["text"]
        variants["with_proofs"].append(text)
        if doc["id"].startswith("metamath/"):
            variants["without_proofs"].append(without_proofs(text))
            variants["proofs"].append("\n".join(m.group(0) for m in _MM_COMMENT_OR_PROOF.finditer(text)
                                                if m.group(1) is None))
        else:
            variants["without_proofs"].append(text)
    return variants


def score(run_dir: Path, corpus: PreparedCorpus, variants: dict[str, list[str]]) -> dict:
    raw, cfg, payload, model = load_trial_model(run_dir)
    row = {"trial_key": raw.get("trial_key"), "L": raw["L"], "seed": raw["seed"], "tpp": raw.get("tpp"),
           "train_flops": float(payload["extra"]["train_flops"])}
    for name, texts in variants.items():
        windows = []
        for i, text in enumerate(texts):
            ids = np.asarray(corpus.tokenizer.encode(text), dtype=np.int64)
            windows += document_windows(i, ids, corpus.eos_id, cfg.seq_len, cfg.eval_stride or cfg.seq_len)
        nats, _ = score_windows(lambda x: model(x)[0].float(), windows, cfg.seq_len, 16, corpus.eos_id)
        n_bytes = sum(len(t.encode()) for t in texts)
        row[name] = nats / (math.log(2) * n_bytes)
        row[f"{name}_bytes"] = n_bytes
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sweep", help="sweep name: trials are read from runs/sweeps/SWEEP/")
    parser.add_argument("--corpus-commit", required=True, help="a commit whose demo corpus the trials trained on")
    parser.add_argument("--prepared", type=Path, required=True, help="that corpus's prepared directory")
    parser.add_argument("--root", default="runs/sweeps")
    parser.add_argument("--tpp", type=float, help="only the trials planned at this TPP")
    args = parser.parse_args()
    base = Path(args.root) / args.sweep
    trials = finished_trials(base, args.tpp)
    if not trials:
        print(f"no finished trials under {base}", file=sys.stderr)
        return 2
    corpus = PreparedCorpus.open(args.prepared)
    variants = held_out_variants(args.corpus_commit)
    torch.set_num_threads(1)
    for i, run_dir in enumerate(trials, 1):
        print(json.dumps(score(run_dir, corpus, variants)), flush=True)
        print(f"[{i}/{len(trials)}] {run_dir.name}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
