"""Bits per byte on held-out sets: BPB = Σ cross-entropy (nats) / (ln 2 · Σ UTF-8 bytes).

Every document is scored completely and every token exactly once. The document is preceded by
EOS, so its first token has a context too; the EOS itself is never scored (it has no bytes).
Documents longer than the window are scored with sliding windows: the first window scores its
`seq_len` targets, each later window moves by `stride` and scores only its last `stride` targets,
which therefore see at least `seq_len - stride` tokens of context. Normalising by bytes makes the
number independent of the tokenizer.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass

import numpy as np
import torch

from rungs.data.corpus import PreparedCorpus
from rungs.data.errors import DataInputError


@dataclass(frozen=True)
class BpbResult:
    bpb: float
    nats: float  # total cross-entropy
    bytes: int  # total UTF-8 bytes of the documents
    tokens: int  # tokens scored
    docs: int

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Window:
    doc: int
    inputs: np.ndarray  # length <= seq_len
    score_from: int  # positions [score_from, len(inputs)) are scored
    targets: np.ndarray  # same length as inputs


def document_windows(doc: int, tokens: np.ndarray, eos_id: int, seq_len: int, stride: int) -> list[Window]:
    """Windows over EOS + tokens that score each of `tokens` exactly once."""
    seq = np.concatenate([[eos_id], np.asarray(tokens, dtype=np.int64)])
    n_targets = len(seq) - 1
    windows = []
    scored = 0  # targets 0..scored-1 (seq[1..scored]) are done
    while scored < n_targets:
        end = min(n_targets, seq_len if scored == 0 else scored + stride)  # exclusive target end
        begin = max(0, end - seq_len)  # inputs seq[begin:end] predict seq[begin+1:end+1]
        windows.append(Window(doc, seq[begin:end], scored - begin, seq[begin + 1:end + 1]))
        scored = end
    return windows


def evaluate_bpb(logits_fn: Callable[[torch.Tensor], torch.Tensor], corpus: PreparedCorpus, *, seq_len: int,
                 batch_size: int = 8, domains: list[str] | None = None, max_docs_per_domain: int | None = None,
                 stride: int | None = None) -> dict[str, BpbResult]:
    """BPB per held-out domain. `logits_fn(LongTensor[B, T]) -> FloatTensor[B, T, V]`, causal."""
    stride = stride or max(1, seq_len // 2)
    if not 0 < stride <= seq_len:
        raise DataInputError(f"stride must be in (0, seq_len={seq_len}], got {stride}", field="stride")
    results = {}
    for domain in domains if domains is not None else corpus.eval_domains:
        shard = corpus.eval_shard(domain)
        n_docs = shard.n_docs if max_docs_per_domain is None else min(shard.n_docs, max_docs_per_domain)
        windows = [w for d in range(n_docs)
                   for w in document_windows(d, shard.document_tokens(d), corpus.eos_id, seq_len, stride)]
        nats, tokens = score_windows(logits_fn, windows, seq_len, batch_size, corpus.eos_id)
        n_bytes = int(shard.index[:n_docs, 2].sum())
        results[domain] = BpbResult(bpb=nats / (math.log(2) * n_bytes) if n_bytes else float("nan"), nats=nats,
                                    bytes=n_bytes, tokens=tokens, docs=n_docs)
    return results


@torch.no_grad()
def score_windows(logits_fn, windows: list[Window], seq_len: int, batch_size: int, pad_id: int,
                  window_nats: list[float] | None = None) -> tuple[float, int]:
    """Σ nats over the scored positions of all windows (float64 accumulation) and their count; each
    window's own Σ nats is appended to `window_nats` when given (per-document sums; the total is the
    same either way)."""
    total_nats = 0.0
    total_tokens = 0
    for b in range(0, len(windows), batch_size):
        group = windows[b:b + batch_size]
        width = max(len(w.inputs) for w in group)
        inputs = torch.full((len(group), width), pad_id, dtype=torch.long)
        targets = torch.zeros((len(group), width), dtype=torch.long)
        mask = torch.zeros((len(group), width), dtype=torch.bool)
        for i, w in enumerate(group):
            n = len(w.inputs)
            inputs[i, :n] = torch.from_numpy(w.inputs)
            targets[i, :n] = torch.from_numpy(w.targets)
            mask[i, w.score_from:n] = True  # right padding: a causal model never sees it from real positions
        logits = logits_fn(inputs)
        if logits.shape[:2] != inputs.shape:
            raise DataInputError(f"logits_fn returned shape {tuple(logits.shape)} for inputs {tuple(inputs.shape)}")
        logp = torch.log_softmax(logits.double(), dim=-1)
        nll = -logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
        total_nats += float(nll[mask].sum())
        if window_nats is not None:
            window_nats.extend(torch.where(mask, nll, 0.0).sum(dim=1).tolist())
        total_tokens += int(mask.sum())
    return total_nats, total_tokens
