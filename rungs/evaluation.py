"""Held-out BPB of a model during and after training, its sampling error, and the unigram baseline.

Two evals, on two fixed sets of documents:

- The *final* eval (the number the fits consume) scores every held-out document of each domain (or
  the first `final_eval_max_docs_per_domain`). Beside BPB it reports the BPB's standard error from
  the sampling of the held-out documents (`ratio_standard_error`).
- The *intermediate* eval, every `eval_interval` steps, scores a fixed sample (`sample_documents`):
  documents taken in a spread order across the held-out set (0, n/2, n/4, 3n/4, ...: every prefix
  covers the set evenly) until the domain's token budget `eval_tokens_per_domain` is reached. The
  same documents every time, so the learning curve (`bpb/<domain>` in MLflow) is comparable step to
  step; a spread sample, so it tracks the final eval instead of whatever the first few documents
  are. At the last step the sample's BPB comes from the final eval's per-document sums
  (`DomainScore.sample_bpb`), so the curve ends on the same documents at no extra cost.
  (`eval_tokens_per_domain=None`: the first `eval_max_docs_per_domain` documents, as runs made
  before the budget existed.)

What it costs, on the cpu-demo-d2 L2 rung (520 steps, eval every 100, 2 shared CPU cores): the sample
is 17.7k-20.8k tokens per domain (3-19 documents; 114k tokens in all, 91k for the first four
documents it replaced), each sample eval 2.3-4.0 s, the five together 14% of the job's 99 s wall
clock; the final eval (485k tokens) 18 s, 18%. At the last step the sample's BPB was within 0.11 of
the final BPB in every domain; the final BPB's standard error was 0.019-0.10 (books-math).

The unigram baseline scores the final eval's documents with the training mixture's token
frequencies (each source's counts weighted by its share): a model that learned nothing beyond token
frequencies sits at the unigram BPB.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass

import numpy as np
import torch

from rungs.config import TrainConfig
from rungs.data.bpb import document_windows, evaluate_bpb, score_windows
from rungs.data.corpus import DocumentShard, PreparedCorpus


@dataclass(frozen=True)
class DomainScore:
    """One held-out domain's eval: BPB = Σ bits / Σ bytes over `docs` documents, and its standard error
    from the documents' sampling (NaN with fewer than two documents)."""

    bpb: float
    bpb_se: float
    docs: int
    tokens: int  # tokens scored
    bytes: int  # UTF-8 bytes of the documents
    # The final eval's: the intermediate sample's BPB from the same per-document sums, when the final
    # eval's documents include the sample's (the default), else None. It ends the learning curve at
    # the last step without scoring the sample a second time.
    sample_bpb: float | None = None
    # The final eval's: each document's bits and UTF-8 bytes, in held-out order (empty for the intermediate
    # eval). Seeds scored on the same documents differ by the model and by how each model fits each document;
    # `fits.heldout_noise` splits the seed noise into those two parts from them.
    doc_bits: tuple[float, ...] = ()
    doc_bytes: tuple[int, ...] = ()

    def to_dict(self) -> dict[str, float | int | tuple[float, ...] | tuple[int, ...] | None]:
        return asdict(self)


def spread_order(n: int) -> np.ndarray:
    """0..n-1 in van der Corput order scaled to n (0, n/2, n/4, 3n/4, ...; repeats dropped): for every
    2^k <= n, the first 2^k indices are floor(j·n/2^k), j < 2^k, one in each of 2^k equal strata of
    the range, so every prefix spans the whole set."""
    if n <= 1:
        return np.arange(n, dtype=np.int64)
    bits = int(math.ceil(math.log2(n)))
    i = np.arange(1 << bits, dtype=np.int64)
    rev = np.zeros_like(i)
    for b in range(bits):
        rev |= ((i >> b) & 1) << (bits - 1 - b)
    positions = (rev * n) >> bits  # floor(vdc(i) · n): every index appears, since n <= 2^bits
    _, first = np.unique(positions, return_index=True)
    return positions[np.sort(first)]


def sample_documents(shard: DocumentShard, token_budget: int) -> np.ndarray:
    """The intermediate eval's documents of one domain, ascending: the shortest prefix of the spread
    order whose documents hold at least `token_budget` tokens (all documents if they hold fewer)."""
    order = spread_order(shard.n_docs)
    tokens = np.asarray(shard.index[:, 1], dtype=np.int64)[order]
    take = int(np.searchsorted(np.cumsum(tokens), token_budget)) + 1
    return np.sort(order[:take])


def eval_docs(cfg: TrainConfig, final: bool) -> int | None:
    """The document cap of the first-N-documents selections (the final eval's; the legacy intermediate one's)."""
    return cfg.final_eval_max_docs_per_domain if final else cfg.eval_max_docs_per_domain


def eval_doc_ids(shard: DocumentShard, cfg: TrainConfig, final: bool) -> np.ndarray:
    """Which documents of `shard` an eval scores (see the module docstring)."""
    if not final and cfg.eval_tokens_per_domain is not None:
        return sample_documents(shard, cfg.eval_tokens_per_domain)
    cap = eval_docs(cfg, final)
    return np.arange(shard.n_docs if cap is None else min(shard.n_docs, cap), dtype=np.int64)


def ratio_standard_error(doc_bits: np.ndarray, doc_bytes: np.ndarray) -> float:
    """Standard error of R = Σ bits / Σ bytes when the documents are a sample (the delta method for a
    ratio estimator): SE² = Σ (bits_i − R·bytes_i)² / (Σ bytes)². It is what a bootstrap over
    documents estimates (its large-sample limit); NaN for fewer than two documents."""
    bits = np.asarray(doc_bits, dtype=np.float64)
    nbytes = np.asarray(doc_bytes, dtype=np.float64)
    if bits.size < 2:
        return float("nan")
    ratio = bits.sum() / nbytes.sum()
    return float(math.sqrt(float(np.sum((bits - ratio * nbytes) ** 2))) / nbytes.sum())


def score_domains(logits_fn: Callable[[torch.Tensor], torch.Tensor], corpus: PreparedCorpus, cfg: TrainConfig, *,
                  final: bool) -> dict[str, DomainScore]:
    """Score every held-out domain's eval documents. The total is summed exactly as
    `rungs.data.bpb.evaluate_bpb` sums it (same windows, same batches), so the BPB is the same number;
    the per-document sums only feed the standard error."""
    stride = cfg.eval_stride or cfg.seq_len
    scores = {}
    for domain in corpus.eval_domains:
        shard = corpus.eval_shard(domain)
        ids = eval_doc_ids(shard, cfg, final)
        windows = [w for position, d in enumerate(ids)
                   for w in document_windows(position, shard.document_tokens(int(d)), corpus.eos_id, cfg.seq_len,
                                             stride)]
        window_nats: list[float] = []
        nats, tokens = score_windows(logits_fn, windows, cfg.seq_len, cfg.eval_batch_size, corpus.eos_id,
                                     window_nats=window_nats)
        doc_nats = np.bincount([w.doc for w in windows], weights=window_nats, minlength=len(ids))
        doc_bytes = np.asarray(shard.index[:, 2], dtype=np.int64)[ids]
        n_bytes = int(doc_bytes.sum())
        sample_bpb = None
        if final:  # the final eval's documents are 0..len(ids)-1
            sample = eval_doc_ids(shard, cfg, final=False)
            if sample.size and sample.max() < len(ids) and doc_bytes[sample].sum():
                sample_bpb = float(doc_nats[sample].sum() / (math.log(2) * doc_bytes[sample].sum()))
        scores[domain] = DomainScore(bpb=nats / (math.log(2) * n_bytes) if n_bytes else float("nan"),
                                     bpb_se=ratio_standard_error(doc_nats / math.log(2), doc_bytes),
                                     docs=len(ids), tokens=tokens, bytes=n_bytes, sample_bpb=sample_bpb,
                                     doc_bits=tuple((doc_nats / math.log(2)).tolist()) if final else (),
                                     doc_bytes=tuple(doc_bytes.tolist()) if final else ())
    return scores


def evaluate_model(model: torch.nn.Module, corpus: PreparedCorpus, cfg: TrainConfig, *,
                   final: bool = False) -> dict[str, DomainScore]:
    """The eval per held-out domain (the final eval's documents when `final`, else the intermediate
    sample); the model is put back in its previous train/eval mode."""
    was_training = model.training
    model.eval()
    # The device the engine built the model on (a sharded model's parameters are DTensors on the local one).
    device = next(model.parameters()).device

    def logits_fn(inputs: torch.Tensor) -> torch.Tensor:
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=cfg.bf16_on(device.type)):
            return model(inputs.to(device))[0].float().cpu()

    try:
        with torch.no_grad():
            return score_domains(logits_fn, corpus, cfg, final=final)
    finally:
        model.train(was_training)


def unigram_log_probs(corpus: PreparedCorpus, sources: dict[str, float], vocab_size: int) -> torch.Tensor:
    """log p(token) of the share-weighted training mixture, add-one smoothed: (V,) float32."""
    probs = np.zeros(vocab_size, dtype=np.float64)
    for name, share in sources.items():
        tokens = np.asarray(corpus.train_shard(name).tokens)
        counts = np.bincount(tokens, minlength=vocab_size)[:vocab_size].astype(np.float64) + 1.0
        probs += share * counts / counts.sum()
    return torch.from_numpy(np.log(probs / probs.sum())).float()


def unigram_bpb(corpus: PreparedCorpus, cfg: TrainConfig, *, final: bool = True) -> dict[str, float]:
    """BPB of the unigram model on the eval documents the trained model is scored on (by default
    the final eval's, the ones its reported BPB comes from)."""
    logp = unigram_log_probs(corpus, {n: s.share for n, s in cfg.sources.items()}, cfg.vocab_size)
    results = evaluate_bpb(lambda x: logp.expand(*x.shape, -1), corpus, seq_len=cfg.seq_len,
                           batch_size=cfg.eval_batch_size, max_docs_per_domain=eval_docs(cfg, final),
                           stride=cfg.eval_stride or cfg.seq_len)
    return {domain: r.bpb for domain, r in results.items()}
