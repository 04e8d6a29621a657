"""Held-out BPB of a model during and after training, and the unigram baseline it must beat.

Every eval uses the same documents (the first `eval_max_docs_per_domain` of each held-out
domain), so BPB is comparable across steps. The unigram baseline scores the same documents with
the training mixture's token frequencies (each source's counts weighted by its share): a model
that learned nothing beyond token frequencies sits at the unigram BPB.
"""

from __future__ import annotations

import numpy as np
import torch

from rungs.config import TrainConfig
from rungs.data.bpb import evaluate_bpb
from rungs.data.corpus import PreparedCorpus


def evaluate_model(model: torch.nn.Module, corpus: PreparedCorpus, cfg: TrainConfig, *,
                   final: bool = False) -> dict[str, float]:
    """BPB per held-out domain (the final eval's documents when `final`); the model is put back in
    its previous train/eval mode."""
    was_training = model.training
    model.eval()
    # The device the engine built the model on (a sharded model's parameters are DTensors on the local one).
    device = next(model.parameters()).device

    def logits_fn(inputs: torch.Tensor) -> torch.Tensor:
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=cfg.bf16_on(device.type)):
            return model(inputs.to(device))[0].float().cpu()

    try:
        with torch.no_grad():
            results = evaluate_bpb(logits_fn, corpus, seq_len=cfg.seq_len, batch_size=cfg.eval_batch_size,
                                   max_docs_per_domain=eval_docs(cfg, final),
                                   stride=cfg.eval_stride or cfg.seq_len)
    finally:
        model.train(was_training)
    return {domain: r.bpb for domain, r in results.items()}


def unigram_log_probs(corpus: PreparedCorpus, sources: dict[str, float], vocab_size: int) -> torch.Tensor:
    """log p(token) of the share-weighted training mixture, add-one smoothed: (V,) float32."""
    probs = np.zeros(vocab_size, dtype=np.float64)
    for name, share in sources.items():
        tokens = np.asarray(corpus.train_shard(name).tokens)
        counts = np.bincount(tokens, minlength=vocab_size)[:vocab_size].astype(np.float64) + 1.0
        probs += share * counts / counts.sum()
    return torch.from_numpy(np.log(probs / probs.sum())).float()


def eval_docs(cfg: TrainConfig, final: bool) -> int | None:
    return cfg.final_eval_max_docs_per_domain if final else cfg.eval_max_docs_per_domain


def unigram_bpb(corpus: PreparedCorpus, cfg: TrainConfig, *, final: bool = True) -> dict[str, float]:
    """BPB of the unigram model on the eval documents the trained model is scored on (by default
    the final eval's, the ones its reported BPB comes from)."""
    logp = unigram_log_probs(corpus, {n: s.share for n, s in cfg.sources.items()}, cfg.vocab_size)
    results = evaluate_bpb(lambda x: logp.expand(*x.shape, -1), corpus, seq_len=cfg.seq_len,
                           batch_size=cfg.eval_batch_size, max_docs_per_domain=eval_docs(cfg, final),
                           stride=cfg.eval_stride or cfg.seq_len)
    return {domain: r.bpb for domain, r in results.items()}
