"""Inputs and child processes for `benchmarks.data`: corpora written from the demo's text (many files, or
one file in each format), a prepare measured in a fresh process (peak RSS, wall and CPU seconds), the
tokenize stage timed on 1 and 2 Ray workers, and a moto S3 server in a process of its own."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path


def demo_rows() -> list[tuple[str, str]]:
    from rungs.data.manifest import DEMO_MANIFEST, load_manifest

    return [(d.doc_id, d.text) for s in load_manifest(DEMO_MANIFEST).sources for d in s.documents()]


def _eval_lines() -> list[str]:
    from rungs.data.manifest import DEMO_MANIFEST, load_manifest

    return [f"  - {{domain: {e.name}, files: ['{e.files[0]}']}}" for e in load_manifest(DEMO_MANIFEST).eval_sets]


def write_scaled_corpus(root: Path, copies: int) -> Path:
    """The demo's training sources as `copies` JSONL files each (ids suffixed, text repeated), its held-out
    sets as they are: `copies` x the demo's training text."""
    from rungs.data.manifest import DEMO_MANIFEST, load_manifest

    lines = [f"name: demo{copies}x", "sources:"]
    for s in load_manifest(DEMO_MANIFEST).sources:
        rows = [(d.doc_id, d.text) for d in s.documents()]
        (root / s.name).mkdir(parents=True, exist_ok=True)
        for k in range(copies):
            with open(root / s.name / f"part-{k:03d}.jsonl", "w", encoding="utf-8") as f:
                for doc_id, text in rows:
                    f.write(json.dumps({"id": f"{doc_id}@{k}", "text": text}, ensure_ascii=False) + "\n")
        lines.append(f"  - {{name: {s.name}, domain: {s.domain}, share: {s.share}, files: ['{s.name}/*.jsonl']}}")
    (root / "manifest.yaml").write_text("\n".join(lines + ["eval:"] + _eval_lines()) + "\n")
    return root / "manifest.yaml"


ONE_FILE = {"jsonl": "train.jsonl", "zst": "train.jsonl.zst", "parquet": "train.parquet"}


def _copies(copies: float) -> list[tuple[str, str]]:
    """The demo's documents `copies` times over (a fraction takes the first documents), ids suffixed @k."""
    rows = demo_rows()
    return [(f"{rows[i % len(rows)][0]}@{i // len(rows)}", rows[i % len(rows)][1]) for i in range(round(copies * len(rows)))]


def write_one_file_corpus(root: Path, copies: float, fmt: str) -> Path:
    """The demo's training text `copies` times as ONE file of one source (JSONL, JSONL.zst or Parquet in row
    groups of 256 documents), as a new user would write a dump; the demo's held-out sets."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    root.mkdir(parents=True, exist_ok=True)
    rows = _copies(copies)
    name = ONE_FILE[fmt]
    if fmt == "parquet":
        pq.write_table(pa.table({"id": [i for i, _ in rows], "text": [t for _, t in rows]}), root / name,
                       row_group_size=256)
    else:
        sink = pa.CompressedOutputStream(str(root / name), "zstd") if fmt == "zst" else open(root / name, "wb")
        with sink as f:
            for begin in range(0, len(rows), 1024):
                f.write("".join(json.dumps({"id": i, "text": t}, ensure_ascii=False) + "\n"
                                for i, t in rows[begin:begin + 1024]).encode())
    lines = [f"name: one-{fmt}", "sources:", f"  - {{name: all, share: 1.0, files: [{name}]}}", "eval:"]
    (root / "manifest.yaml").write_text("\n".join(lines + _eval_lines()) + "\n")
    return root / "manifest.yaml"


def text_bytes(copies: float) -> int:
    return sum(len(t.encode()) for _, t in _copies(copies))


CHILD_PREPARE = textwrap.dedent("""
    import json, resource, sys, time
    from rungs.data.prepare import prepare
    t0, c0 = time.perf_counter(), time.process_time()
    prepare(sys.argv[1], sys.argv[2], vocab_size=512, workers=int(sys.argv[3]))
    # VmHWM, not getrusage's ru_maxrss: Linux carries ru_maxrss across exec from the forking parent.
    hwm = next(line for line in open("/proc/self/status") if line.startswith("VmHWM:"))
    print(json.dumps({"seconds": time.perf_counter() - t0, "cpu_seconds": time.process_time() - c0,
                      "peak_rss_bytes": int(hwm.split()[1]) * 1024, "load_1min": open("/proc/loadavg").read().split()[0]}))
""")

# The tokenize stage of one large JSONL file cut into segments, on 1 and on 2 Ray workers (started and warm
# before timing: the first round warms them), each task's CPU seconds summed beside the wall time; before
# that, one process (one Rust thread) against the raw batch encode of the same texts, in CPU seconds.
CHILD_SPLIT = textwrap.dedent("""
    import json, sys, time
    from pathlib import Path
    from rungs.data.filework import tokenize_unit
    from rungs.data.manifest import load_manifest
    from rungs.data.prepare import plan_inputs
    from rungs.data.scanning import units_of
    from rungs.data.vocabulary import TokenizerLoader
    from rungs.data.workers import ray_session, run_units

    prepared, manifest_path, out, shard_bytes = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3]), int(sys.argv[4])
    manifest = load_manifest(manifest_path)
    ds = manifest.sources[0]
    plan = plan_inputs(manifest, shard_bytes)[("train", ds.name, 0)]
    units = units_of("train", ds, 0, plan, 1)
    tok = TokenizerLoader(prepared, "bpe")()
    texts = [d.text for d in ds.file_documents(ds.files[0])]
    mb = sum(len(t.encode()) for t in texts) / 1e6

    def best(fn, n=2):  # process CPU seconds: one worker's throughput, whatever else runs on the machine
        times = []
        for _ in range(n):
            t0 = time.process_time(); fn(); times.append(time.process_time() - t0)
        return min(times)

    raw = best(lambda: tok.hf.encode_batch_fast(texts, add_special_tokens=False))
    k = iter(range(100))
    ours = best(lambda: [tokenize_unit(u, tokenizer=tok, out=out / f"one{n}", key="bench",
                                       first_lines=(0,) * len(u.segments), removed=(frozenset(),) * len(u.segments))
                         for n in [next(k)] for u in units])

    def timed(unit, **kw):
        c0 = time.process_time()
        infos = tokenize_unit(unit, **kw)
        return time.process_time() - c0

    seconds, cpu = {}, {}
    with ray_session(2, None):
        for w in (2, 1, 2):
            calls = [((u,), {"tokenizer": TokenizerLoader(prepared, "bpe"), "out": out / f"w{w}-{time.time_ns()}",
                             "key": "bench", "first_lines": (0,) * len(u.segments),
                             "removed": (frozenset(),) * len(u.segments)}) for u in units]
            t0 = time.perf_counter()
            cpu[w] = sum(run_units(timed, calls, w, None))
            seconds[w] = time.perf_counter() - t0
    print(json.dumps({"megabytes": mb, "raw_mb_per_s": mb / raw, "tokenize_mb_per_s": mb / ours,
                      "segments": len(plan.segments), "one_worker_s": seconds[1], "two_workers_s": seconds[2],
                      "one_worker_cpu_s": cpu[1], "two_workers_cpu_s": cpu[2],
                      "load_1min": open("/proc/loadavg").read().split()[0]}))
""")


def run_child(script: str, *args: object, env: dict | None = None) -> dict:
    done = subprocess.run([sys.executable, "-c", script, *map(str, args)], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"benchmark child failed: {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


@contextlib.contextmanager
def moto_s3(bucket: str):
    """A moto S3 server in its own process on 127.0.0.1 (not a thread of this one: no shared GIL); the env
    that points a prepare at it, and a boto3 client with `bucket` created."""
    import boto3

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen([str(Path(sys.executable).parent / "moto_server"), "-H", "127.0.0.1", "-p", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    endpoint = f"http://127.0.0.1:{port}"
    env = {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench", "AWS_DEFAULT_REGION": "us-east-1",
           "AWS_ENDPOINT_URL_S3": endpoint, "AWS_ENDPOINT_URL": endpoint}
    try:
        client = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="bench", aws_secret_access_key="bench",
                              region_name="us-east-1")
        for _ in range(600):
            try:
                client.create_bucket(Bucket=bucket)
                break
            except Exception:  # not listening yet
                time.sleep(0.1)
        yield env, client
    finally:
        server.terminate()
        server.wait(timeout=30)
