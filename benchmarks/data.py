"""Data pipeline speed and memory: tokenization into shards, prepare at scale (many
files, one large file in each format, split over workers, from an object store), the source-scaled
sampler and the cache key.

Checks, each against a reference measured in the same run where one exists:
- `tokenize_speed_over_raw_batch_encode` >= 0.8: `rungs.data.prepare.tokenize_documents` (encode,
  convert, append EOS, build the index) against the raw HF `tokenizers` batch-encode of the same
  texts with the same tokenizer (the faster of `encode_batch` and `encode_batch_fast`);
- `decontam_batched_over_one_at_a_time_600_char_docs` >= 2: the held-out n-gram match of every training
  document, a batch of documents per numpy pass (what `prepare` runs), against one document at a time, on the
  demo's training text cut into 600-character documents (the demo's own, ~4 kB each, are reported too);
- `sampler_time_over_train_step_time` < 0.01: the sampler's seconds per 1M tokens against a
  forward+backward of a small dense torch transformer (the size of the cpu-demo ladder's smallest
  rung, a dense 4x FFN in place of the MoE) on 1M tokens;
- `peak_rss_16x_over_1x` <= 1.2 and `peak_rss_16x_gb` <= 2: peak RSS of a whole `prepare` (one worker,
  BPE-512) on 16x the demo's training text (16 files per source; --quick: 2x) against 1x;
- `one_{jsonl,zst,parquet}_file_rss_growth_bytes_per_text_byte` <= 0.25 and `one_*_file_8x_peak_rss_gb` <= 2:
  the demo's text as ONE file of one source, prepared at 1x and 8x (--quick: 0.5x and 1x): extra peak RSS per
  extra byte of text, and the peak;
- `tokenize_per_worker_over_raw_encode` >= 0.8: one process (one Rust thread) tokenizing the 8x JSONL
  file's segments into shards against raw `encode_batch_fast` of the same texts (process CPU seconds);
- `one_file_two_workers_over_one` >= 1.6: the tokenize stage of that one file, cut into 8 MiB segments
  (--quick: 1x, 1 MiB), on 2 Ray workers against 1 (wall, warm workers; needs two idle cores);
- `s3_over_local_disk_throughput` >= 0.8: prepare of the 1x one-file corpus from a moto S3 server on
  loopback (its own process) against the same file on local disk (wall, best of 2 each);
- `sampler_setup_us_per_doc` <= 1 and `sampler_setup_bytes_per_doc` <= 16: choosing half the tokens of
  a 10^6-document source from its memory-mapped orders (stratified, 3 collections);
- `cache_key_seconds_per_gb` <= 1: `Manifest.content_hash` over 1 GB of input files (8 x 128 MB).
The results carry the measured rates and a linear extrapolation to 1 TB of text.
"""

from __future__ import annotations

import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

import numpy as np

import torch
from torch import nn

from benchmarks.common import Report, main_for, time_call
from benchmarks.data_inputs import CHILD_PREPARE, CHILD_SPLIT, ONE_FILE, moto_s3, run_child, text_bytes, \
    write_one_file_corpus, write_scaled_corpus


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
    from ladder.plan.generator import plan_rung
    from ladder.plan.recipe import load_recipe
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
    # Process CPU seconds (all threads): the work per MB, which the machine's other jobs do not inflate; wall
    # time under load measured 0.45x here against 1.0x+ idle.
    cpu = {"repeats": repeats, "clock": time.process_time}
    raw_seconds = min(time_call(lambda: tok.hf.encode_batch(texts, add_special_tokens=False), **cpu),
                      time_call(lambda: tok.hf.encode_batch_fast(texts, add_special_tokens=False), **cpu))
    ours_seconds = time_call(lambda: tokenize_documents(tok, texts), **cpu)
    report.results["tokenize"] = {"megabytes": megabytes, "docs": len(texts), "clock": "process_time",
                                  "raw_batch_encode_mb_per_s": megabytes / raw_seconds,
                                  "tokenize_documents_mb_per_s": megabytes / ours_seconds}
    report.check("tokenize_speed_over_raw_batch_encode", raw_seconds / ours_seconds, ">=", 0.8)

    decontamination(report, texts, cpu)

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

    with tempfile.TemporaryDirectory(prefix="bench-data-") as tmp:
        root = Path(tmp)
        scaled(report, root, quick)
        large = one_file(report, root, quick)
        split_workers(report, root, large, quick)
        from_s3(report, root, quick)
        setup_us, setup_bytes = sampler_setup(root / "setup", 10**5 if quick else 10**6)
        report.results["sampler_setup"] = {"docs": 10**5 if quick else 10**6, "us_per_doc": setup_us,
                                           "bytes_per_doc": setup_bytes}
        report.check("sampler_setup_us_per_doc", setup_us, "<=", 1.0)
        report.check("sampler_setup_bytes_per_doc", setup_bytes, "<=", 16.0)
        key_s = cache_key_seconds(root / "key", 8, 128 << 20)
        report.results["cache_key"] = {"gb": 1.0, "files": 8, "seconds": key_s}
        report.check("cache_key_seconds_per_gb", key_s, "<=", 1.0)
    report.results["extrapolation_1tb"] = extrapolate(report.results)
    return report


def decontamination(report: Report, texts: list[str], cpu: dict) -> None:
    """The held-out n-gram match `prepare` runs on every training document, a batch of documents per numpy
    pass (`HeldOutIndex.matches_many`), against matching one document at a time (`matches`), on the demo's
    documents and on the same text cut into 600-character documents (a web page's paragraph)."""
    from rungs.data.decontam import HeldOutIndex, ngram_hash_array
    from rungs.data.manifest import DEMO_MANIFEST, load_manifest

    manifest = load_manifest(DEMO_MANIFEST)
    index = HeldOutIndex.build([(f"{e.name}\x00{d.doc_id}", ngram_hash_array(d.text, manifest.ngram_words))
                                for e in manifest.eval_sets for d in e.documents()], manifest.ngram_words)
    megabytes = sum(len(t.encode()) for t in texts) / 1e6
    short = [t[i:i + 600] for t in texts for i in range(0, len(t), 600)]
    results: dict[str, object] = {"megabytes": megabytes, "clock": "process_time",
                                  "held_out_ngrams": int(len(index.hashes))}
    for name, docs in (("demo_documents", texts), ("600_char_documents", short)):
        one = time_call(lambda: [index.matches(t) for t in docs], **cpu)
        many = time_call(lambda: index.matches_many(docs), **cpu)
        assert index.matches_many(docs) == [index.matches(t) for t in docs]
        results[name] = {"docs": len(docs), "one_at_a_time_mb_per_s": megabytes / one,
                         "batched_mb_per_s": megabytes / many}
    report.results["decontamination"] = results
    short_rates = results["600_char_documents"]
    report.check("decontam_batched_over_one_at_a_time_600_char_docs",
                 short_rates["batched_mb_per_s"] / short_rates["one_at_a_time_mb_per_s"], ">=", 2.0)


def scaled(report: Report, root: Path, quick: bool) -> None:
    """Prepare at 1x and 16x (2x with --quick) the demo text in many files: peak RSS."""
    big = 2 if quick else 16
    runs = {}
    for copies in (1, big):
        manifest = write_scaled_corpus(root / f"corpus{copies}", copies)
        text_mb = sum(f.stat().st_size for f in (root / f"corpus{copies}").rglob("*.jsonl")) / 1e6
        runs[copies] = {"jsonl_mb": text_mb, **run_child(CHILD_PREPARE, manifest, root / f"prepared{copies}", 1)}
    report.results["prepare"] = {f"{k}x": v for k, v in runs.items()}
    report.check(f"peak_rss_{big}x_over_1x", runs[big]["peak_rss_bytes"] / runs[1]["peak_rss_bytes"], "<=", 1.2)
    report.check(f"peak_rss_{big}x_gb", runs[big]["peak_rss_bytes"] / 1e9, "<=", 2.0)


def one_file(report: Report, root: Path, quick: bool) -> Path:
    """The demo text as ONE file at 1x and 8x (0.5x and 1x with --quick), as JSONL, JSONL.zst and Parquet: peak
    RSS growth per byte of text, and the peak. Returns the large JSONL corpus's manifest."""
    small, big = (0.5, 1) if quick else (1, 8)
    results = {}
    for fmt in ONE_FILE:
        runs = {}
        for copies in (small, big):
            manifest = write_one_file_corpus(root / f"one-{fmt}-{copies}", copies, fmt)
            runs[copies] = run_child(CHILD_PREPARE, manifest, root / f"one-{fmt}-{copies}" / "out", 1)
        growth = (runs[big]["peak_rss_bytes"] - runs[small]["peak_rss_bytes"]) / (text_bytes(big) - text_bytes(small))
        results[fmt] = {"text_mb": {f"{c}x": text_bytes(c) / 1e6 for c in (small, big)},
                        **{f"{c}x": runs[c] for c in (small, big)}, "rss_growth_bytes_per_text_byte": growth}
        report.check(f"one_{fmt}_file_rss_growth_bytes_per_text_byte", growth, "<=", 0.25)
        report.check(f"one_{fmt}_file_{big}x_peak_rss_gb", runs[big]["peak_rss_bytes"] / 1e9, "<=", 2.0)
    report.results["one_file"] = results
    return root / f"one-jsonl-{big}" / "manifest.yaml"


def split_workers(report: Report, root: Path, manifest: Path, quick: bool) -> None:
    """One large JSONL file cut into segments, its tokenize stage on 1 and 2 workers (wall: needs idle cores;
    the CPU seconds say the work was the same), and one worker against the raw batch encode."""
    shard_bytes = (1 if quick else 8) << 20
    res = run_child(CHILD_SPLIT, manifest.parent / "out", manifest, root / "split", shard_bytes,
                    env={"RAYON_NUM_THREADS": "1"})
    res["shard_bytes"] = shard_bytes
    report.results["split"] = res
    report.check("tokenize_per_worker_over_raw_encode", res["tokenize_mb_per_s"] / res["raw_mb_per_s"], ">=", 0.8)
    report.check("one_file_two_workers_over_one", res["one_worker_s"] / res["two_workers_s"], ">=", 1.6)


def from_s3(report: Report, root: Path, quick: bool) -> None:
    """The same corpus (the demo text as one JSONL file, 1x; --quick: 0.5x) prepared from local disk and from a
    moto S3 server on loopback, alternately, twice each (--quick: once): the throughput of the best run of each."""
    copies = 0.5 if quick else 1
    local = write_one_file_corpus(root / "s3-local", copies, "jsonl")
    remote = root / "s3-remote.yaml"
    with moto_s3("bench-corpus") as (env, client):
        client.upload_file(str(local.parent / ONE_FILE["jsonl"]), "bench-corpus", f"one/{ONE_FILE['jsonl']}")
        text = local.read_text().replace(f"files: [{ONE_FILE['jsonl']}]", f"files: ['s3://bench-corpus/one/{ONE_FILE['jsonl']}']")
        remote.write_text(text)
        runs: dict[str, list[dict]] = {"local": [], "s3": []}
        for k in range(1 if quick else 2):
            for name, manifest in (("local", local), ("s3", remote)):
                runs[name].append(run_child(CHILD_PREPARE, manifest, root / f"s3-out-{name}-{k}", 1, env=env))
    mb = text_bytes(copies) / 1e6
    best = {name: min(r["seconds"] for r in rs) for name, rs in runs.items()}
    report.results["s3"] = {"text_mb": mb, "runs": runs, "mb_per_s": {n: mb / s for n, s in best.items()}}
    report.check("s3_over_local_disk_throughput", best["local"] / best["s3"], ">=", 0.8)


def sampler_setup(root: Path, n: int) -> tuple[float, float]:
    """Seconds and peak bytes per document of choosing half a source's tokens, arrays as prepare writes them."""
    from rungs.data.corpus import DocumentShard
    from rungs.data.sampler import select_subset

    root.mkdir(parents=True)
    rng = np.random.default_rng(0)
    lengths = rng.integers(50, 500, n).astype(np.int64)
    index = np.stack([np.concatenate([[0], np.cumsum(lengths)[:-1]]), lengths, lengths * 3], axis=1)
    keys = rng.integers(0, 2**63, n, dtype=np.int64).astype(np.uint64)
    codes = rng.integers(0, 3, n)
    np.save(root / "index.npy", index)
    np.save(root / "order.npy", np.argsort(keys, kind="stable"))
    np.save(root / "strata.npy", np.lexsort((keys, codes)))
    collections = [(c, int((codes == r).sum()), int(lengths[codes == r].sum())) for r, c in enumerate("abc")]
    tokens = np.zeros(int(lengths.sum()), np.uint16)

    def shard() -> DocumentShard:
        return DocumentShard("s", "d", tokens, np.load(root / "index.npy", mmap_mode="r"),
                             subset_loader=lambda: (np.load(root / "order.npy", mmap_mode="r"),
                                                    np.load(root / "strata.npy", mmap_mode="r"), collections))

    cap = int(lengths.sum()) // 2
    seconds = time_call(lambda: select_subset(shard(), "s", cap), repeats=3)
    tracemalloc.start()
    select_subset(shard(), "s", cap)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return seconds / n * 1e6, peak / n


def cache_key_seconds(root: Path, files: int, size: int) -> float:
    """Seconds of `content_hash` over `files` sparse files of `size` bytes (the key reads 16 KiB of each)."""
    from rungs.data.manifest import load_manifest

    root.mkdir(parents=True)
    for k in range(files):
        with open(root / f"part-{k}.txt", "wb") as f:
            f.write(b"head")
            f.truncate(size)
            f.seek(size - 4)
            f.write(b"tail")
    (root / "m.yaml").write_text("sources:\n  - {name: t, share: 1.0, files: ['*.txt']}\n")
    manifest = load_manifest(root / "m.yaml")
    return time_call(manifest.content_hash, repeats=3)


def extrapolate(results: dict, cores: int = 64, tb: float = 1.0) -> dict:
    """Linear in the text: a 1 TB corpus on a `cores`-core node, from the one-file prepare's CPU seconds per MB
    (scan, BPE sample, tokenize; every thread counted), the measured 2-worker efficiency, the bounded RSS per
    worker, and the object-store bandwidth the workers would read at (each byte is read twice: scan, tokenize)."""
    out: dict = {"cores": cores, "tb": tb}
    one = results.get("one_file", {}).get("jsonl")
    if one:
        big = max((k for k in one if k.endswith("x")), key=lambda k: float(k[:-1]))
        cpu_per_mb = one[big]["cpu_seconds"] / one["text_mb"][big]
        split = results.get("split", {})
        efficiency = min(1.0, split["one_worker_s"] / split["two_workers_s"] / 2) if split else 1.0
        worker_seconds = cpu_per_mb * tb * 1e6
        out.update(cpu_seconds_per_mb=cpu_per_mb, worker_days=worker_seconds / 86400, parallel_efficiency=efficiency,
                   hours_on_node=worker_seconds / (cores * efficiency) / 3600,
                   peak_rss_gb_per_worker=one[big]["peak_rss_bytes"] / 1e9,
                   node_memory_gb=cores * one[big]["peak_rss_bytes"] / 1e9,
                   object_store_mb_per_s_needed=2 * cores * efficiency / cpu_per_mb)
    key = results.get("cache_key")
    if key:
        out["cache_key_seconds_at_1gb_files"] = key["seconds"] * 1000 * tb
    return out


if __name__ == "__main__":
    sys.exit(main_for("data", run))
