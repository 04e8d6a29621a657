"""Where one trial beats another: per-token NLL change on a held-out domain, grouped by target token.

When a rung's BPB falls more than the law expects (math's L8→L9 on set.mm), this says which tokens
carry the fall. Both trials must share a tokenizer (the same prepared corpus). Prints the total
change in nats, the tokens that gained most, and the share of the change on "copyable" targets
(whose K-gram ending at the target already occurred earlier in the window):

    python scripts/token_nll_diff.py runs/sweeps/backtest/<L8 trial> runs/sweeps/backtest/<L9 trial> \
        --domain math --origin metamath --prepared runs/data/demo-bpe512-17385b760b81
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np
import torch

from rungs.data.bpb import document_windows
from rungs.data.corpus import PreparedCorpus

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bpb_by_origin import load_trial_model  # noqa: E402


def copyable(inputs: np.ndarray, targets: np.ndarray, k: int) -> np.ndarray:
    """For each target, whether the k-gram ending at it occurred earlier in the window."""
    seq = np.concatenate([inputs[:1], targets])
    seen: set[tuple[int, ...]] = set()
    flags = np.zeros(len(targets), dtype=bool)
    for j in range(len(targets)):
        end = j + 2  # seq[:end] ends at target j
        if end >= k:
            gram = tuple(seq[end - k:end])
            flags[j] = gram in seen
            seen.add(gram)
    return flags


def token_nll(run_dir: Path, corpus: PreparedCorpus, domain: str, origin: str, k: int) -> list[tuple[int, float, bool]]:
    """(target token, NLL in nats, copyable) for every scored position of the domain's documents of `origin`."""
    _, cfg, _, model = load_trial_model(run_dir)
    shard = corpus.eval_shard(domain)
    out = []
    with torch.no_grad():
        for d, doc_id in enumerate(shard.doc_ids):
            if not doc_id.startswith(origin):
                continue
            for w in document_windows(d, shard.document_tokens(d), corpus.eos_id, cfg.seq_len, cfg.eval_stride or cfg.seq_len):
                logp = torch.log_softmax(model(torch.from_numpy(np.asarray(w.inputs))[None])[0][0].double(), -1)
                nll = -logp.gather(-1, torch.from_numpy(np.asarray(w.targets))[:, None]).squeeze(-1).numpy()
                flags = copyable(np.asarray(w.inputs), np.asarray(w.targets), k)
                out += [(int(w.targets[j]), float(nll[j]), bool(flags[j])) for j in range(w.score_from, len(w.targets))]
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before", type=Path, help="trial directory (config.json and checkpoint)")
    parser.add_argument("after", type=Path)
    parser.add_argument("--domain", required=True)
    parser.add_argument("--origin", default="", help="only documents whose id starts with this")
    parser.add_argument("--prepared", type=Path, required=True, help="the prepared corpus both trials trained on")
    parser.add_argument("--k", type=int, default=4, help="k-gram length for 'copyable' targets")
    parser.add_argument("--top", type=int, default=15)
    args = parser.parse_args()
    corpus = PreparedCorpus.open(args.prepared)
    torch.set_num_threads(1)
    before = token_nll(args.before, corpus, args.domain, args.origin, args.k)
    after = token_nll(args.after, corpus, args.domain, args.origin, args.k)
    if not before or len(before) != len(after):
        print("no scored tokens, or the trials score different windows (different seq_len?)", file=sys.stderr)
        return 2
    by_token: dict[int, list[float]] = defaultdict(lambda: [0.0, 0])
    by_kind = {True: [0.0, 0.0, 0], False: [0.0, 0.0, 0]}
    for (tok, nb, flag), (_, na, _) in zip(before, after):
        by_token[tok][0] += na - nb
        by_token[tok][1] += 1
        by_kind[flag][0] += nb
        by_kind[flag][1] += na
        by_kind[flag][2] += 1
    tokenizer = corpus.tokenizer
    top = sorted(by_token.items(), key=lambda kv: kv[1][0])[:args.top]
    print(json.dumps({
        "tokens": len(before), "nats_change": sum(v[0] for v in by_token.values()),
        "copyable": {("yes" if f else "no"): {"tokens": c, "nats_per_token_before": b / c, "nats_per_token_after": a / c}
                     for f, (b, a, c) in by_kind.items() if c},
        "top_gains": [{"token": tokenizer.decode([t]), "count": int(c), "nats_change": s, "per_token": s / c}
                      for t, (s, c) in top],
    }, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
