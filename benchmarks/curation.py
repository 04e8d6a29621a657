"""Curation: near-duplicate quality against exact Jaccard, the LSH catch curve against its formula, MinHash
and tagger throughput per core, memory as the corpus grows, and Ray scaling.

Checks:
- `near_recall_j_ge_0.85` >= 0.95 and `near_false_positive_rate_j_le_0.5` <= 0.02: on a generated corpus of
  planted pairs at known word-5-gram Jaccard (the reference: Python sets of 5-gram tuples), the share of pairs
  with J >= 0.85 that `ladder data curate` puts in one near-duplicate cluster, and of pairs with J <= 0.5 that
  it does (what `near_duplicates: keep_one` would then remove);
- `catch_curve_max_abs_error` <= 0.05: at every planted similarity, the share of pairs that share a band
  bucket (before verification) against the mean over those pairs of 1 - (1 - J^rows)^bands;
- `minhash_mb_per_s_per_core` >= 1: shingling + rensa signatures + band keys, MB of text per CPU second
  (datasketch measured on the same shingles for the choice, `results.minhash`);
- `peak_rss_4x_over_1x` <= 1.2: peak RSS of a whole curation (exact + near, one process) on 4x the files;
- `two_workers_over_one` >= 1.6: exact + near on 2 Ray workers against 1 (wall; needs two idle cores);
The results carry every tagger's MB per CPU second and an extrapolation to 1 TB on a 64-core node.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks.common import Report, main_for

SIMILARITIES = (0.3, 0.4, 0.5, 0.6, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95)
BASE_WORDS = 200


def planted_pairs(rng: np.random.Generator, pairs_per_s: int) -> tuple[list[str], list[tuple[int, int, float]]]:
    """Documents of BASE_WORDS random words (a vocabulary of 10^7: unrelated documents share no 5-gram), and
    for each planted s pairs (base, copy) where the copy has k words changed, spread out, so that its Jaccard
    (M - 5k) / (M + 5k) is about s. Returns the texts and (i, j, exact Jaccard) per pair."""
    texts, pairs = [], []
    shingles = BASE_WORDS - 4
    for s in SIMILARITIES:
        k = max(1, round(shingles * (1 - s) / (5 * (1 + s))))
        for _ in range(pairs_per_s):
            words = [f"w{x}" for x in rng.integers(0, 10**7, BASE_WORDS)]
            copy = list(words)
            step = BASE_WORDS // k
            for c in range(k):
                copy[c * step + step // 2] = f"n{rng.integers(0, 10**9)}"
            texts += [" ".join(words), " ".join(copy)]
            pairs.append((len(texts) - 2, len(texts) - 1, reference_jaccard(words, copy)))
    return texts, pairs


def reference_jaccard(a: list[str], b: list[str]) -> float:
    sa = {tuple(a[i:i + 5]) for i in range(len(a) - 4)}
    sb = {tuple(b[i:i + 5]) for i in range(len(b) - 4)}
    return len(sa & sb) / len(sa | sb)


def write_jsonl_manifest(root: Path, sources: dict[str, list[list[str]]]) -> Path:
    """One source per key, one JSONL file per list of texts; shares equal."""
    root.mkdir(parents=True, exist_ok=True)
    lines = ["name: bench", "sources:"]
    for name, files in sources.items():
        for k, texts in enumerate(files):
            (root / f"{name}{k}.jsonl").write_text("".join(json.dumps({"id": f"{name}{k}/{i}", "text": t}) + "\n"
                                                           for i, t in enumerate(texts)))
        lines.append(f"  - {{name: {name}, share: {1 / len(sources)!r}, files: ['{name}*.jsonl']}}")
    (root / "manifest.yaml").write_text("\n".join(lines) + "\n")
    return root / "manifest.yaml"


def catch_curve(texts, pairs, params) -> dict:
    from curation.minhash import band_keys, shingle_sets, signatures

    flat, offsets = shingle_sets(texts)
    keys = band_keys(signatures(flat, offsets, params), params)
    rows = {}
    for s_index, s in enumerate(SIMILARITIES):
        block = pairs[s_index * (len(pairs) // len(SIMILARITIES)):(s_index + 1) * (len(pairs) // len(SIMILARITIES))]
        caught = [bool((keys[i] == keys[j]).any()) for i, j, _ in block]
        jac = np.array([j for _, _, j in block])
        rows[str(s)] = {"pairs": len(block), "mean_jaccard": float(jac.mean()), "caught": float(np.mean(caught)),
                        "analytic": float(params.catch_probability(jac).mean())}
    return rows


def minhash_throughput(texts: list[str], params) -> dict:
    from datasketch import MinHash

    from curation.minhash import band_keys, shingle_sets, signatures, words

    mb = sum(len(t.encode()) for t in texts) / 1e6
    t0 = time.process_time()
    flat, offsets = shingle_sets(texts)
    t_shingle = time.process_time() - t0
    band_keys(signatures(flat, offsets, params), params)
    t_rensa = time.process_time() - t0
    grams = []
    for t in texts:
        w = words(t)
        grams.append([" ".join(w[i:i + 5]).encode() for i in range(len(w) - 4)])
    t1 = time.process_time()
    for g in grams:
        MinHash(num_perm=params.num_perm, seed=params.seed).update_batch(g)
    t_datasketch = time.process_time() - t1
    return {"megabytes": mb, "docs": len(texts), "clock": "process_time", "rensa_path_mb_per_s": mb / t_rensa,
            "rensa_signatures_per_s": len(texts) / max(t_rensa - t_shingle, 1e-9),
            "datasketch_signatures_per_s": len(texts) / t_datasketch,
            "shingling_mb_per_s": mb / t_shingle, "rensa_signatures_mb_per_s": mb / max(t_rensa - t_shingle, 1e-9),
            "datasketch_signatures_mb_per_s": mb / t_datasketch, "chosen": "rensa"}


# VmHWM (this process's peak RSS since its exec), not ru_maxrss: Linux carries ru_maxrss over from the parent
# through fork and exec, so a child of a large benchmark process would report the parent's peak.
CHILD = """
import json, re, sys, time
from ladder.run.curate import run_curation
t0 = time.perf_counter()
run_curation(sys.argv[1], sys.argv[2], taggers=["exact", "near"], workers=1, progress=False)
hwm_kb = int(re.search(r"VmHWM:\\s+(\\d+) kB", open("/proc/self/status").read()).group(1))
print(json.dumps({"wall_seconds": time.perf_counter() - t0, "peak_rss_bytes": hwm_kb * 1024}))
"""


def child_curation(manifest: Path, out: Path) -> dict:
    proc = subprocess.run([sys.executable, "-c", CHILD, str(manifest), str(out)], capture_output=True, text=True,
                          check=True, env=dict(os.environ, PYTHONPATH=str(Path.cwd())))
    return json.loads(proc.stdout.strip().splitlines()[-1])


def demo_files(n_files: int, docs_per_file: int) -> list[list[str]]:
    from rungs.data.manifest import DEMO_MANIFEST, load_manifest

    texts = [d.text for s in load_manifest(DEMO_MANIFEST).sources for d in s.documents()]
    return [[texts[(f * docs_per_file + i) % len(texts)] + f"\nfile {f} doc {i}" for i in range(docs_per_file)]
            for f in range(n_files)]


def random_files(n_files: int, docs_per_file: int, seed: int = 0) -> list[list[str]]:
    """Files of the same size distribution and different content: documents of 100-2,000 random words."""
    rng = np.random.default_rng(seed)
    vocab = np.array([f"w{k}" for k in range(100_000)])
    return [[" ".join(vocab[rng.integers(0, len(vocab), int(rng.integers(100, 2000)))]) for _ in range(docs_per_file)]
            for _ in range(n_files)]


def tagger_throughput(root: Path, quick: bool) -> dict:
    from curation.model_taggers import ModelOptions
    from curation.pipeline import curate

    files = demo_files(2, 300 if quick else 1200)
    manifest = write_jsonl_manifest(root / "tagger_corpus", {"good": [files[0]], "web": [files[1]]})
    mb = sum(len(t.encode()) for f in files for t in f) / 1e6
    options = ModelOptions(quality_positive=("good",), quality_negative=("web",), quality_docs=200)
    out = {}
    for tagger in ("exact", "near", "topics", "semantic", "quality"):
        t0 = time.process_time()
        curate(manifest, root / "tagger_out", taggers=[tagger], partitions=4, model_options=options)
        out[tagger] = {"mb_per_cpu_second": mb / (time.process_time() - t0)}
    out["megabytes"] = mb
    return out


def _burn(n: int) -> float:
    total = 0
    for i in range(n):
        total += i * i
    return float(total > 0)


def ray_scaling(root: Path, quick: bool) -> dict:
    """exact + near in this process (1 worker) and on 2 Ray workers, wall; and, for reference, what the
    machine gives two pure-CPU Ray tasks over one at that moment (2.0 with two idle cores)."""
    from functools import partial

    import ray

    from curation.pipeline import curate
    from ladder.run.curate import run_curation
    from rungs.data.workers import run_units

    manifest = write_jsonl_manifest(root / "ray_corpus", {"d": random_files(8, 300 if quick else 1000, seed=1)})
    warm = write_jsonl_manifest(root / "ray_warm_corpus", {"d": random_files(4, 20, seed=2)})
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        # both workers started and their imports done before the timing
        run_curation(warm, root / "ray_warm", taggers=["exact", "near"], workers=2, progress=False)
        walls = {}
        for workers in (1, 2):
            t0 = time.perf_counter()
            curate(manifest, root / f"ray_{workers}", taggers=["exact", "near"], partitions=4,
                   mapper=partial(run_units, workers=workers, address=None))
            walls[workers] = time.perf_counter() - t0
        burn = ray.remote(num_cpus=1)(_burn)
        t0 = time.perf_counter()
        ray.get(burn.remote(10**7))
        one = time.perf_counter() - t0
        t0 = time.perf_counter()
        ray.get([burn.remote(10**7) for _ in range(2)])
        two = time.perf_counter() - t0
    finally:
        ray.shutdown()
    return {"one_worker_seconds": walls[1], "two_workers_seconds": walls[2], "speedup": walls[1] / walls[2],
            "machine_two_cpu_tasks_over_one": 2 * one / two}


def run(quick: bool) -> Report:
    from curation.minhash import LSHParams
    from curation.pipeline import curate
    from curation.store import read_npz

    report = Report("curation")
    params = LSHParams()
    rng = np.random.default_rng(0)
    texts, pairs = planted_pairs(rng, 800)
    curve = catch_curve(texts, pairs, params)
    report.results["catch_curve"] = {"bands": params.bands, "rows": params.rows, "by_similarity": curve}
    report.check("catch_curve_max_abs_error", max(abs(r["caught"] - r["analytic"]) for r in curve.values()), "<=", 0.05)

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        half = len(texts) // 2
        manifest = write_jsonl_manifest(root / "planted", {"p": [texts[:half], texts[half:]]})
        curate(manifest, root / "planted_out", taggers=["near"], partitions=4)
        cluster = np.concatenate([read_npz(root / "planted_out" / "attributes" / "near" / f"p-{k:05d}.npz")["cluster"]
                                  for k in range(2)])
        same = np.array([cluster[i] == cluster[j] for i, j, _ in pairs])
        jac = np.array([j for _, _, j in pairs])
        report.results["near_quality"] = {"pairs_j_ge_0.85": int((jac >= 0.85).sum()),
                                          "pairs_j_le_0.5": int((jac <= 0.5).sum()), "threshold": params.threshold}
        report.check("near_recall_j_ge_0.85", float(same[jac >= 0.85].mean()), ">=", 0.95)
        report.check("near_false_positive_rate_j_le_0.5", float(same[jac <= 0.5].mean()), "<=", 0.02)

        mh = minhash_throughput(texts[:2000 if quick else 8000], params)
        report.results["minhash"] = mh
        report.check("minhash_mb_per_s_per_core", mh["rensa_path_mb_per_s"], ">=", 1.0)

        report.results["taggers"] = tagger_throughput(root, quick)

        docs = 300 if quick else 1000
        files = random_files(8, docs)
        small = write_jsonl_manifest(root / "rss1", {"d": files[:2]})
        large = write_jsonl_manifest(root / "rss4", {"d": files})
        r1, r4 = child_curation(small, root / "rss1_out"), child_curation(large, root / "rss4_out")
        report.results["memory"] = {"one_x": r1, "four_x": r4, "files_one_x": 2, "files_four_x": 8,
                                    "docs_per_file": docs}
        report.check("peak_rss_4x_over_1x", r4["peak_rss_bytes"] / r1["peak_rss_bytes"], "<=", 1.2)

        scaling = ray_scaling(root, quick)
        report.results["ray"] = scaling
        report.check("two_workers_over_one", scaling["speedup"], ">=", 1.6)

    tg = report.results["taggers"]
    dedup_cpu_s_per_mb = 1 / tg["exact"]["mb_per_cpu_second"] + 1 / tg["near"]["mb_per_cpu_second"]
    efficiency = min(1.0, scaling["speedup"] / 2)
    hours = 1e6 * dedup_cpu_s_per_mb / (64 * max(efficiency, 0.5)) / 3600
    all_cpu_s_per_mb = sum(1 / tg[t]["mb_per_cpu_second"] for t in ("exact", "near", "topics", "semantic", "quality"))
    report.results["extrapolation_1tb_64_cores"] = {
        "exact_and_near_hours": hours,
        "all_taggers_hours": 1e6 * all_cpu_s_per_mb / (64 * max(efficiency, 0.5)) / 3600,
        "assumes": "linear in bytes at the measured MB per CPU second; parallel efficiency = the measured 2-worker "
                   "speedup / 2 (at least 0.5); the shuffles' disk traffic is not modelled"}
    return report


if __name__ == "__main__":
    sys.exit(main_for("curation", run))
