"""A corpus in an object store, read through a real S3 API on loopback (moto's server, started once for
this file): prepared to the bytes of the same corpus on disk, keyed without a full read, and each
failure (a missing bucket or key, a truncated object, a denied request, an object rewritten meanwhile)
one line naming the URL with nothing written."""

from __future__ import annotations

import gzip
import hashlib
import json
import os
from pathlib import Path

import pytest

from ladder.cli import main
from rungs.data.errors import DataInputError
from rungs.data.manifest import load_manifest
from rungs.data.prepare import prepare

from . import formats
from .conftest import make_docs, write_jsonl
from tests.s3_server import fresh_filesystems, s3_server

BUCKET = "ladder-corpus"
SHARD_BYTES = 3_000  # the large JSONL file is read in ranged requests, several shards of it


@pytest.fixture(scope="module")
def s3():
    """A moto S3 server on 127.0.0.1 (a port of its own), this process's AWS settings pointed at it; a boto3 client."""
    pytest.importorskip("s3fs")
    with s3_server(BUCKET) as client:
        yield client


def _corpus(root: Path) -> Path:
    """Source a: one JSONL file of many shards; source b: one gzip file; source p: Parquet row groups."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    write_jsonl(root / "a" / "big.jsonl", make_docs("a", 150, seed=1))
    (root / "b").mkdir()
    (root / "b" / "one.jsonl.gz").write_bytes(gzip.compress(
        "".join(json.dumps(d) + "\n" for d in make_docs("b", 40, seed=2, span=(7_000, 12_000))).encode(), mtime=0))
    rows = make_docs("p", 300, seed=5, min_words=3, max_words=20, span=(7_000, 12_000))
    pq.write_table(pa.table({"id": [r["id"] for r in rows], "text": [r["text"] for r in rows]}), root / "p.parquet",
                   row_group_size=40)
    write_jsonl(root / "held.jsonl", make_docs("x", 8, seed=3, span=(12_000, 20_000)))
    (root / "m.yaml").write_text("name: remote\nsources:\n"
                                 "  - {name: a, share: 0.5, files: ['a/*.jsonl']}\n"
                                 "  - {name: b, share: 0.3, files: ['b/one.jsonl.gz']}\n"
                                 "  - {name: p, share: 0.2, files: [p.parquet]}\n"
                                 "eval:\n  - {domain: x, files: [held.jsonl]}\n")
    return root / "m.yaml"


def _upload(s3, root: Path, prefix: str) -> None:
    for path in sorted(root.rglob("*")):
        if path.is_file() and path.suffix != ".yaml":
            s3.put_object(Bucket=BUCKET, Key=f"{prefix}/{path.relative_to(root)}", Body=path.read_bytes())


def _contents(root: Path) -> dict[str, object]:
    """Every file's bytes, the JSON ones less the input key (and meta's manifest path): what must match."""
    out: dict[str, object] = {}
    for p in sorted(root.rglob("*")):
        if not p.is_file():
            continue
        rel = str(p.relative_to(root))
        if p.suffix == ".json" and rel not in ("decontamination.json", "tokenizer.json"):
            doc = json.loads(p.read_text())
            doc.pop("key", None)
            doc.pop("manifest", None)
            doc.pop("manifest_relative", None)
            out[rel] = doc
        else:
            out[rel] = p.read_bytes()
    return out


def test_a_corpus_in_s3_prepares_to_the_bytes_of_the_same_corpus_on_disk(s3, tmp_path):
    manifest = _corpus(tmp_path / "corpus")
    _upload(s3, tmp_path / "corpus", "same")
    remote = tmp_path / "remote.yaml"
    remote.write_text(manifest.read_text() + f"base: s3://{BUCKET}/same\n")
    assert [str(f) for f in load_manifest(remote).sources[0].files] == [f"s3://{BUCKET}/same/a/big.jsonl"]
    local = prepare(manifest, tmp_path / "local", vocab_size=300, shard_bytes=SHARD_BYTES)
    from_s3 = prepare(remote, tmp_path / "from_s3", vocab_size=300, shard_bytes=SHARD_BYTES)
    meta = json.loads((from_s3 / "meta.json").read_text())
    assert len(meta["sources"][0]["shards"]) > 5 and meta["sources"][0]["docs"] == 150
    assert _contents(from_s3) == _contents(local)
    assert prepare(remote, from_s3, vocab_size=300, shard_bytes=SHARD_BYTES) == from_s3  # keyed: a no-op


def test_the_cache_key_of_an_object_is_its_size_version_and_ends_and_moves_with_it(s3, tmp_path):
    body = b"".join(json.dumps(d).encode() + b"\n" for d in make_docs("k", 400, seed=4))
    assert len(body) > 4 * 8_192
    s3.put_object(Bucket=BUCKET, Key="key/a.jsonl", Body=body)
    (tmp_path / "m.yaml").write_text(f"sources:\n  - {{name: a, share: 1.0, files: ['s3://{BUCKET}/key/a.jsonl']}}\n")
    manifest = load_manifest(tmp_path / "m.yaml")
    file = manifest.sources[0].files[0]
    etag = s3.head_object(Bucket=BUCKET, Key="key/a.jsonl")["ETag"]
    assert (file.size, file.version) == (len(body), f"ETag={etag}")
    from rungs.data.manifest import file_fingerprint

    expected = hashlib.sha256(f"{len(body)}|ETag={etag}|".encode() + body[:8_192] + body[-8_192:]).hexdigest()
    assert file_fingerprint(file) == expected
    key = manifest.content_hash()
    middle = len(body) // 2
    s3.put_object(Bucket=BUCKET, Key="key/a.jsonl", Body=body[:middle] + body[middle:middle + 1].swapcase()
                  + body[middle + 1:])  # same size and ends, new content: a new ETag
    assert load_manifest(tmp_path / "m.yaml").content_hash() != key


def test_an_object_rewritten_after_it_was_listed_is_refused(s3, tmp_path):
    s3.put_object(Bucket=BUCKET, Key="moved/a.jsonl", Body=b'{"id": "1", "text": "first version"}\n')
    (tmp_path / "m.yaml").write_text(f"sources:\n  - {{name: a, share: 1.0, files: ['s3://{BUCKET}/moved/a.jsonl']}}\n")
    ds = load_manifest(tmp_path / "m.yaml").sources[0]
    s3.put_object(Bucket=BUCKET, Key="moved/a.jsonl", Body=b'{"id": "1", "text": "second, longer version"}\n')
    with pytest.raises(DataInputError, match=rf"s3://{BUCKET}/moved/a\.jsonl: changed since this prepare listed it"):
        list(ds.documents())


def _missing_bucket(s3, tmp_path):
    return "s3://no-such-corpus-bucket/a.jsonl", "the bucket does not exist"


def _missing_key(s3, tmp_path):
    return f"s3://{BUCKET}/nowhere/a.jsonl", "no such object"


def _truncated(s3, tmp_path):
    blob = gzip.compress(b"".join(json.dumps(d).encode() + b"\n" for d in make_docs("t", 60, seed=7)))
    s3.put_object(Bucket=BUCKET, Key="cut/a.jsonl.gz", Body=blob[:len(blob) // 2])
    return f"s3://{BUCKET}/cut/a.jsonl.gz", "is not a readable gzip file"


def _truncated_line(s3, tmp_path):
    body = b"".join(json.dumps(d).encode() + b"\n" for d in make_docs("t", 60, seed=7))
    s3.put_object(Bucket=BUCKET, Key="cut/b.jsonl", Body=body[:len(body) - 40])
    return f"s3://{BUCKET}/cut/b.jsonl", "line 60 is not a JSON object"


CASES = [_missing_bucket, _missing_key, _truncated, _truncated_line]


@pytest.mark.parametrize("case", CASES, ids=[c.__name__.strip("_") for c in CASES])
def test_a_bad_object_is_one_line_naming_its_url_and_nothing_is_written(case, s3, tmp_path, capsys):
    url, message = case(s3, tmp_path)
    write_jsonl(tmp_path / "held.jsonl", make_docs("x", 4, seed=3, span=(12_000, 20_000)))
    (tmp_path / "m.yaml").write_text(f"sources:\n  - {{name: a, share: 1.0, files: ['{url}']}}\n"
                                     "eval:\n  - {domain: x, files: [held.jsonl]}\n")
    out = tmp_path / "out"
    assert main(["data", "prepare", str(tmp_path / "m.yaml"), "--out", str(out), "--tokenizer", "byte"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith(f"ladder data: error: {url}: ") and message in err, err
    assert not out.exists()


def test_a_denied_request_is_one_line_naming_the_url_and_nothing_is_written(s3, tmp_path, capsys, monkeypatch):
    """Credentials of a user whose policy denies reading the corpus's prefix, with moto checking every request."""
    import boto3
    import moto.settings

    s3.put_object(Bucket=BUCKET, Key="private/a.jsonl", Body=b'{"id": "1", "text": "not for you"}\n')
    iam = boto3.client("iam", endpoint_url=os.environ["AWS_ENDPOINT_URL"])
    iam.create_user(UserName="reader")
    keys = iam.create_access_key(UserName="reader")["AccessKey"]
    iam.put_user_policy(UserName="reader", PolicyName="no-private", PolicyDocument=json.dumps({
        "Version": "2012-10-17", "Statement": [
            # s3:List*: AWS names a listing s3:ListBucket, moto 5.2 s3:ListObjectsV2
            {"Effect": "Allow", "Action": ["s3:List*", "s3:GetObject"],
             "Resource": [f"arn:aws:s3:::{BUCKET}", f"arn:aws:s3:::{BUCKET}/*"]},
            {"Effect": "Deny", "Action": ["s3:GetObject"], "Resource": [f"arn:aws:s3:::{BUCKET}/private/*"]}]}))
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", keys["AccessKeyId"])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", keys["SecretAccessKey"])
    monkeypatch.setattr(moto.settings, "INITIAL_NO_AUTH_ACTION_COUNT", 0)
    fresh_filesystems()
    url = f"s3://{BUCKET}/private/a.jsonl"  # listed (ListBucket is allowed), then refused when read
    (tmp_path / "m.yaml").write_text(f"sources:\n  - {{name: a, share: 1.0, files: ['s3://{BUCKET}/private/*.jsonl']}}\n")
    out = tmp_path / "out"
    try:
        assert main(["data", "prepare", str(tmp_path / "m.yaml"), "--out", str(out), "--tokenizer", "byte"]) == 2
    finally:
        monkeypatch.undo()
        fresh_filesystems()
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"ladder data: error: {url}: ") and "access denied" in err, err
    assert not out.exists()


def test_a_bgzf_object_is_split_by_its_members_only_on_local_disk(s3, tmp_path):
    """Finding a remote gzip's members would mean reading it: one worker, and the plan says why."""
    from rungs.data.segments import plan_file

    data = b"".join(json.dumps(d).encode() + b"\n" for d in make_docs("g", 100, seed=2))
    s3.put_object(Bucket=BUCKET, Key="bgzf/a.jsonl.gz", Body=formats.bgzf(data, 1_000))
    s3.put_object(Bucket=BUCKET, Key="bgzf/b.jsonl.zst", Body=formats.zstd_seekable(data, 1_000))
    (tmp_path / "m.yaml").write_text(f"sources:\n  - {{name: a, share: 1.0, files: ['s3://{BUCKET}/bgzf/*']}}\n")
    gz, zst = load_manifest(tmp_path / "m.yaml").sources[0].files
    assert "remote gzip" in plan_file(gz, 2_000).reason and len(plan_file(gz, 2_000).segments) == 1
    assert len(plan_file(zst, 2_000).segments) > 3  # the seek table is read from the object's tail
