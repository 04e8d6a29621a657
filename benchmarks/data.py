"""Data pipeline speed (issue 3): tokenization into shards and the source-scaled sampler.

Checks, each against a reference measured in the same run:
- `tokenize_speed_over_raw_batch_encode` >= 0.8: `rungs.data.prepare.tokenize_documents` (encode,
  convert, append EOS, build the index) against the raw HF `tokenizers` batch-encode of the same
  texts with the same tokenizer (the faster of `encode_batch` and `encode_batch_fast`);
- `sampler_time_over_train_step_time` < 0.01: the sampler's seconds per 1M tokens against a
  forward+backward of a small dense torch transformer (the size of the cpu-demo ladder's smallest
  rung, a dense 4x FFN in place of the MoE) on 1M tokens.
"""

from __future__ import annotations

import sys
import time

import torch
from torch import nn

from benchmarks.common import Report, main_for, time_call


def demo_texts(max_bytes: int) -> list[str]:
    """Training documents of the shipped demo corpus, an equal byte budget from each source."""
    from rungs.data.manifest import DEMO_MANIFEST, load_manifest

    sources = load_manifest(DEMO_MANIFEST).sources
    texts = []
    for source in sources:
        taken = 0
        for doc in source.documents():
            if taken >= max_bytes / len(sources):
                break
            texts.append(doc.text)
            taken += len(doc.text.encode())
    return texts


class DenseLM(nn.Module):
    """A plain pre-norm causal transformer: the reference cost of training on a token."""

    def __init__(self, vocab: int, d_model: int, n_layers: int, n_heads: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        layer = nn.TransformerEncoderLayer(d_model, n_heads, 4 * d_model, dropout=0.0, batch_first=True,
                                           norm_first=True)
        self.blocks = nn.TransformerEncoder(layer, n_layers, enable_nested_tensor=False)
        self.head = nn.Linear(d_model, vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        mask = nn.Transformer.generate_square_subsequent_mask(tokens.shape[1])
        return self.head(self.blocks(self.embed(tokens), mask=mask, is_causal=True))


def train_seconds_per_million_tokens(vocab: int, d_model: int, n_layers: int, n_heads: int, seq_len: int,
                                     batch_sequences: int, repeats: int) -> float:
    torch.manual_seed(0)
    model = DenseLM(vocab, d_model, n_layers, n_heads)
    tokens = torch.randint(0, vocab, (batch_sequences, seq_len + 1))

    def step() -> None:
        logits = model(tokens[:, :-1])
        loss = nn.functional.cross_entropy(logits.reshape(-1, vocab), tokens[:, 1:].reshape(-1))
        loss.backward()
        model.zero_grad(set_to_none=True)

    seconds = time_call(step, repeats=repeats, warmup=1)
    return seconds / (batch_sequences * seq_len) * 1e6


def run(quick: bool) -> Report:
    from ladder.plan import plan_rung
    from ladder.recipe import load_recipe
    from rungs.data.corpus import PreparedCorpus
    from rungs.data.prepare import ensure_prepared, tokenize_documents
    from rungs.data.sampler import SourceScaledSampler

    report = Report("data")
    recipe = load_recipe("cpu-demo")
    corpus = PreparedCorpus.open(ensure_prepared(vocab_size=recipe.vocab_size))
    tok = corpus.tokenizer

    # 1. tokenization: our shard path vs the raw batch encode, same texts, same tokenizer
    texts = demo_texts(2_000_000 if quick else 14_000_000)
    megabytes = sum(len(t.encode()) for t in texts) / 1e6
    repeats = 3 if quick else 5
    raw_seconds = min(time_call(lambda: tok.hf.encode_batch(texts, add_special_tokens=False), repeats=repeats),
                      time_call(lambda: tok.hf.encode_batch_fast(texts, add_special_tokens=False), repeats=repeats))
    ours_seconds = time_call(lambda: tokenize_documents(tok, texts), repeats=repeats)
    report.results["tokenize"] = {"megabytes": megabytes, "docs": len(texts),
                                  "raw_batch_encode_mb_per_s": megabytes / raw_seconds,
                                  "tokenize_documents_mb_per_s": megabytes / ours_seconds}
    report.check("tokenize_speed_over_raw_batch_encode", raw_seconds / ours_seconds, ">=", 0.8)

    # 2. sampler vs a training step on the same number of tokens
    full = plan_rung(recipe, recipe.full_scale_rung).to_dict()
    sampler = SourceScaledSampler(corpus, full["sources"], seq_len=full["seq_len"],
                                  batch_sequences=full["batch_sequences"], seed=0)
    sampler.next_batch()
    tokens_per_batch = full["seq_len"] * full["batch_sequences"]
    n_batches = max(1, int((1e6 if quick else 4e6) // tokens_per_batch))
    t0 = time.perf_counter()
    for _ in range(n_batches):
        sampler.next_batch()
    sampler_s = (time.perf_counter() - t0) / (n_batches * tokens_per_batch) * 1e6
    small = plan_rung(recipe, min(recipe.ladder_rungs)).to_dict()
    train_s = train_seconds_per_million_tokens(recipe.vocab_size, small["d_model"], small["n_layers"],
                                               small["n_heads"], small["seq_len"], small["batch_sequences"],
                                               repeats=3 if quick else 5)
    report.results["sampler"] = {"seconds_per_million_tokens": sampler_s, "batches": n_batches,
                                 "batch_tokens": tokens_per_batch}
    report.results["reference_train_step"] = {
        "seconds_per_million_tokens": train_s, "model": "dense pre-norm transformer, 4x FFN",
        "d_model": small["d_model"], "n_layers": small["n_layers"], "n_heads": small["n_heads"],
        "seq_len": small["seq_len"], "batch_sequences": small["batch_sequences"],
        "torch_threads": torch.get_num_threads()}
    report.check("sampler_time_over_train_step_time", sampler_s / train_s, "<", 0.01)
    return report


if __name__ == "__main__":
    sys.exit(main_for("data", run))
