"""Data pipeline speed and memory (issues 3 and 20): tokenization into shards, prepare at scale, the
source-scaled sampler and the cache key.

Checks, each against a reference measured in the same run where one exists:
- `tokenize_speed_over_raw_batch_encode` >= 0.8: `rungs.data.prepare.tokenize_documents` (encode,
  convert, append EOS, build the index) against the raw HF `tokenizers` batch-encode of the same
  texts with the same tokenizer (the faster of `encode_batch` and `encode_batch_fast`);
- `sampler_time_over_train_step_time` < 0.01: the sampler's seconds per 1M tokens against a
  forward+backward of a small dense torch transformer (the size of the cpu-demo ladder's smallest
  rung, a dense 4x FFN in place of the MoE) on 1M tokens;
- `tokenize_file_per_worker_over_raw_encode` >= 0.8: one worker (one Rust thread) reading a JSONL file
  into a shard (`rungs.data.filework.tokenize_file`) against raw `encode_batch_fast` of the same texts
  with one thread;
- `two_workers_over_one` >= 1.6: the tokenize phase of prepare over 8 files, 2 Ray workers against 1
  (Ray started and warm before timing; both with one Rust thread per worker);
- `peak_rss_16x_over_1x` <= 1.2 and `peak_rss_16x_gb` <= 2: peak RSS of a whole `prepare` (one worker,
  BPE-512) on 16x the demo's training text (16 files per source; --quick: 4x) against 1x;
- `sampler_setup_us_per_doc` <= 1 and `sampler_setup_bytes_per_doc` <= 16: choosing half the tokens of
  a 10^6-document source from its memory-mapped orders (stratified, 3 collections);
- `cache_key_seconds_per_gb` <= 1: `Manifest.content_hash` over 1 GB of input files (8 x 128 MB).
The results carry the measured rates and a linear extrapolation to 1 TB of text.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time
import tracemalloc
from pathlib import Path

import numpy as np

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
        scaled(report, root, quick, tok)
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


def write_scaled_corpus(root: Path, copies: int) -> Path:
    """The demo's training sources as `copies` JSONL files each (ids suffixed, text repeated), its held-out
    sets as they are: `copies` x the demo's training text."""
    from rungs.data.manifest import DEMO_MANIFEST, load_manifest

    demo = load_manifest(DEMO_MANIFEST)
    lines = [f"name: demo{copies}x", "sources:"]
    for s in demo.sources:
        rows = [json.dumps({"id": d.doc_id, "text": d.text}, ensure_ascii=False) for d in s.documents()]
        (root / s.name).mkdir(parents=True, exist_ok=True)
        for k in range(copies):
            with open(root / s.name / f"part-{k:03d}.jsonl", "w", encoding="utf-8") as f:
                for row in rows:
                    doc = json.loads(row)
                    f.write(json.dumps({"id": f"{doc['id']}@{k}", "text": doc["text"]}, ensure_ascii=False) + "\n")
        lines.append(f"  - {{name: {s.name}, domain: {s.domain}, share: {s.share}, files: ['{s.name}/*.jsonl']}}")
    lines.append("eval:")
    lines += [f"  - {{domain: {e.name}, files: ['{e.files[0]}']}}" for e in demo.eval_sets]
    (root / "manifest.yaml").write_text("\n".join(lines) + "\n")
    return root / "manifest.yaml"


_CHILD_PREPARE = textwrap.dedent("""
    import json, sys, time
    from rungs.data.prepare import prepare
    t0 = time.perf_counter()
    prepare(sys.argv[1], sys.argv[2], vocab_size=512, workers=1)
    # VmHWM, not getrusage's ru_maxrss: Linux carries ru_maxrss across exec from the forking parent.
    hwm = next(line for line in open("/proc/self/status") if line.startswith("VmHWM:"))
    print(json.dumps({"seconds": time.perf_counter() - t0, "peak_rss_bytes": int(hwm.split()[1]) * 1024}))
""")

_CHILD_THROUGHPUT = textwrap.dedent("""
    import json, sys, time
    from pathlib import Path
    from rungs.data.corpus import PreparedCorpus
    from rungs.data.filework import tokenize_file
    from rungs.data.manifest import load_manifest
    from rungs.data.prepare import _run_units, _ray_session, _TokenizerLoader

    prepared, manifest_path, out = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
    tok = PreparedCorpus.open(prepared).tokenizer
    ds = load_manifest(manifest_path).sources[0]
    texts = [d.text for d in ds.file_documents(ds.files[0])]
    mb = sum(len(t.encode()) for t in texts) / 1e6

    def best(fn, n=3):  # process CPU seconds: one worker's throughput, whatever else runs on the machine
        times = []
        for _ in range(n):
            t0 = time.process_time(); fn(); times.append(time.process_time() - t0)
        return min(times)

    raw = best(lambda: tok.hf.encode_batch_fast(texts, add_special_tokens=False))
    k = iter(range(100))
    ours = best(lambda: tokenize_file(ds, ds.files[0], split="train", file_index=0, tokenizer=tok,
                                      out=out / f"one{next(k)}", key="bench"))
    sources = load_manifest(manifest_path).sources
    calls = [((s, p), {"split": "train", "file_index": i, "tokenizer": _TokenizerLoader(prepared, "bpe"),
                       "out": out / f"w{{w}}", "key": "bench"}) for s in sources[:1] for i, p in enumerate(s.files)]
    files_mb = sum(sum(len(d.text.encode()) for d in s.file_documents(p)) for (s, p), _ in calls) / 1e6
    seconds = {}
    with _ray_session(2, None):
        for w in (2, 1, 2):  # the first round warms the Ray workers (imports, tokenizer load)
            kw = [(a, dict(c, out=Path(str(c["out"]).format(w=f"{w}-{time.time_ns()}")))) for a, c in calls]
            t0 = time.perf_counter()
            list(_run_units(tokenize_file, kw, w, None))
            seconds[w] = time.perf_counter() - t0
    print(json.dumps({"megabytes": mb, "raw_mb_per_s": mb / raw, "tokenize_file_mb_per_s": mb / ours,
                      "files": len(calls), "files_mb": files_mb, "one_worker_s": seconds[1],
                      "two_workers_s": seconds[2]}))
""")


def _child(script: str, *args: str, env: dict | None = None) -> dict:
    done = subprocess.run([sys.executable, "-c", script, *map(str, args)], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"benchmark child failed: {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def scaled(report: Report, root: Path, quick: bool, tok) -> None:
    """Prepare at 1x and 16x (4x with --quick) the demo text: peak RSS; per-worker and 2-worker throughput."""
    big = 4 if quick else 16
    runs = {}
    for copies in (1, big):
        manifest = write_scaled_corpus(root / f"corpus{copies}", copies)
        text_mb = sum(f.stat().st_size for f in (root / f"corpus{copies}").rglob("*.jsonl")) / 1e6
        runs[copies] = {"jsonl_mb": text_mb, **_child(_CHILD_PREPARE, manifest, root / f"prepared{copies}")}
    report.results["prepare"] = {f"{k}x": v for k, v in runs.items()}
    report.check(f"peak_rss_{big}x_over_1x", runs[big]["peak_rss_bytes"] / runs[1]["peak_rss_bytes"], "<=", 1.2)
    report.check(f"peak_rss_{big}x_gb", runs[big]["peak_rss_bytes"] / 1e9, "<=", 2.0)
    # One source of the big corpus in `big` files: per-worker throughput and 1 vs 2 workers.
    manifest = root / f"corpus{big}" / "one.yaml"
    files = sorted((root / f"corpus{big}" / "web").glob("*.jsonl"))[:8]
    manifest.write_text("sources:\n  - {name: web, share: 1.0, files: [" + ", ".join(f"'{f}'" for f in files)
                        + "]}\n")
    res = _child(_CHILD_THROUGHPUT, root / f"prepared{big}", manifest, root / "throughput",
                 env={"RAYON_NUM_THREADS": "1"})
    report.results["workers"] = res
    report.check("tokenize_file_per_worker_over_raw_encode", res["tokenize_file_mb_per_s"] / res["raw_mb_per_s"],
                 ">=", 0.8)
    report.check("two_workers_over_one", res["one_worker_s"] / res["two_workers_s"], ">=", 1.6)


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


def extrapolate(results: dict) -> dict:
    """Linear in the text: CPU-seconds per MB of prepare (1 worker), the workers' speed-up, the key's cost."""
    prepare = results.get("prepare", {})
    big = max(prepare, key=lambda k: int(k[:-1])) if prepare else None
    out = {}
    if big:
        run = prepare[big]
        per_mb = run["seconds"] / run["jsonl_mb"]
        out["prepare_seconds_per_mb_one_worker"] = per_mb
        out["prepare_cpu_days_per_tb"] = per_mb * 1e6 / 86400
        out["peak_rss_gb_per_worker"] = run["peak_rss_bytes"] / 1e9
    w = results.get("workers")
    if w:
        out["tokenize_mb_per_s_per_worker"] = w["tokenize_file_mb_per_s"]
        out["two_worker_speedup"] = w["one_worker_s"] / w["two_workers_s"]
    key = results.get("cache_key")
    if key:
        out["cache_key_seconds_per_tb_at_1gb_files"] = key["seconds"] * 1000
    return out


if __name__ == "__main__":
    sys.exit(main_for("data", run))
