"""Shared set-up for the training-job tests: the demo corpus (prepared once into the same cache
`ladder train` uses) and small configs built from the cpu-demo recipe's smallest rung."""

from __future__ import annotations

from pathlib import Path

from ladder.plan.resolve import resolve_train_config

REPO = Path(__file__).resolve().parents[2]
DATA_CACHE = REPO / "runs" / "data"


# Final and periodic evaluation on the first held-out document of each domain, for tests whose checks
# are not about BPB (the whole held-out sets cost ~9 s of a 13 s cpu-demo L3 trial).
# (A one-token budget makes the intermediate sample the spread order's first document: the first.)
ONE_DOC_EVAL = {"eval_tokens_per_domain": 1, "eval_max_docs_per_domain": 1, "final_eval_max_docs_per_domain": 1}


def tiny_config(**overrides) -> dict:
    """cpu-demo L3 (d_model 48, 8 experts top-2, vocab 512) with a short sequence and small batch,
    no tracking unless asked, evaluation on one document per domain."""
    base = {
        "seq_len": 64, "batch_sequences": 4, "data_cache_root": str(DATA_CACHE), "tracking_uri": None,
        **ONE_DOC_EVAL, "eval_interval": 1000, "checkpoint_interval": 1000, "threads": 1,
        "warmup_steps": 2,
    }
    base.update(overrides)
    return resolve_train_config("cpu-demo", 3, base)
