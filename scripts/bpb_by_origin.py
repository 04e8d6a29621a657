"""Held-out BPB of a sweep's finished trials, split by the origin of the held-out documents.

A domain's held-out set is a few blocks of consecutive chunks from a few origin files (the demo
corpus's NOTICE); when one domain's BPB curve bends or its seeds disagree, this shows which origin
does it. Reads each trial's `config.json` and final `checkpoint.pt` under runs/sweeps/SWEEP/, scores
the domain's held-out documents once per origin (the id before '#'), and prints one JSON line per
(trial, origin): rung, seed, train FLOPs, bytes and BPB.

    python scripts/bpb_by_origin.py backtest --domain math > docs/backtest_diagnosis/math_by_origin.jsonl
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections import defaultdict
from pathlib import Path

import torch

from rungs.checkpoint import checkpoint_path, load_checkpoint
from rungs.config import parse_config
from rungs.data.bpb import document_windows, score_windows
from rungs.data.corpus import PreparedCorpus
from rungs.data.prepare import ensure_prepared
from rungs.model import Transformer


def origin_of(doc_id: str) -> str:
    return doc_id.split("#", 1)[0]


def finished_trials(base: Path, tpp: float | None = None, subset: str | None = None) -> list[Path]:
    """A sweep's trial directories with a result and a checkpoint; with `tpp` / `subset`, only those
    planned at that TPP / trained with that subset rule (configs without the field used "prefix")."""
    trials = sorted(p for p in base.iterdir() if (p / "result.json").is_file() and checkpoint_path(p).is_file())
    configs = {p: json.loads((p / "config.json").read_text()) for p in trials}
    if tpp is not None:
        trials = [p for p in trials if configs[p].get("tpp") == tpp]
    if subset is not None:
        trials = [p for p in trials if configs[p].get("subset", "prefix") == subset]
    return trials


def load_trial_model(run_dir: Path):
    """(raw config, parsed config, checkpoint payload, model in eval mode) of a finished trial."""
    raw = json.loads((run_dir / "config.json").read_text())
    raw.setdefault("subset", "prefix")  # written before the field existed: the plain prefix rule
    cfg = parse_config(raw)
    payload = load_checkpoint(run_dir, config_key=cfg.resume_keys())
    if payload is None:
        raise SystemExit(f"{run_dir}: no checkpoint")
    model = Transformer(cfg.architecture())
    model.load_state_dict(payload["model"])
    model.eval()
    return raw, cfg, payload, model


def score_trial(run_dir: Path, domain: str, batch_size: int) -> list[dict]:
    raw, cfg, payload, model = load_trial_model(run_dir)
    corpus = PreparedCorpus.open(ensure_prepared(cfg.data_manifest, vocab_size=cfg.vocab_size,
                                                 cache_root=Path(cfg.data_cache_root)))
    shard = corpus.eval_shard(domain)
    docs_by_origin: dict[str, list[int]] = defaultdict(list)
    for i, doc_id in enumerate(shard.doc_ids):
        docs_by_origin[origin_of(doc_id)].append(i)

    def logits_fn(inputs: torch.Tensor) -> torch.Tensor:
        return model(inputs)[0].float()

    rows = []
    stride = cfg.eval_stride or cfg.seq_len
    for origin, docs in sorted(docs_by_origin.items()):
        windows = [w for d in docs for w in document_windows(d, shard.document_tokens(d), corpus.eos_id, cfg.seq_len,
                                                               stride)]
        nats, tokens = score_windows(logits_fn, windows, cfg.seq_len, batch_size, corpus.eos_id)
        n_bytes = int(shard.index[docs, 2].sum())
        rows.append({"trial_key": raw.get("trial_key"), "L": raw["L"], "seed": raw["seed"], "tpp": raw.get("tpp"),
                     "subset": raw["subset"],
                     "train_flops": float(payload["extra"]["train_flops"]),
                     "step": int(payload["step"]), "domain": domain, "origin": origin, "docs": len(docs),
                     "bytes": n_bytes, "tokens": tokens, "bpb": nats / (math.log(2) * n_bytes)})
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sweep", help="sweep name: trials are read from runs/sweeps/SWEEP/")
    parser.add_argument("--domain", required=True, help="held-out domain to split by origin")
    parser.add_argument("--root", default="runs/sweeps", help="where sweeps keep their trial directories")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--tpp", type=float, help="only the trials planned at this TPP (a sweep's directory keeps "
                        "the trials of its earlier plans too)")
    parser.add_argument("--subset", choices=["stratified", "prefix"], help="only the trials of this subset rule")
    args = parser.parse_args()
    base = Path(args.root) / args.sweep
    trials = finished_trials(base, args.tpp, args.subset)
    if not trials:
        print(f"no finished trials (result.json and checkpoint) under {base}", file=sys.stderr)
        return 2
    torch.set_num_threads(1)
    for i, run_dir in enumerate(trials, 1):
        for row in score_trial(run_dir, args.domain, args.batch_size):
            print(json.dumps(row), flush=True)
        print(f"[{i}/{len(trials)}] {run_dir.name}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
