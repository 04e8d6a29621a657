"""A corpus in an object store (moto's S3 server on loopback) curates to the attributes of the same corpus on
disk, and its arm names the held-out files by URL."""

from __future__ import annotations

import logging
import os

import pytest
import yaml

from curation.mix import mix
from curation.pipeline import curate
from curation.rules import Rules
from tests.curation.corpus import write_corpus
from tests.curation.test_pipeline import attributes

BUCKET = "curation-corpus"
AWS_KEYS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION", "AWS_ENDPOINT_URL_S3",
            "AWS_ENDPOINT_URL")


@pytest.fixture()
def s3():
    pytest.importorskip("s3fs")
    import boto3
    import s3fs
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    saved = {k: os.environ.get(k) for k in AWS_KEYS}
    endpoint = f"http://127.0.0.1:{server.get_host_and_port()[1]}"
    os.environ.update(AWS_ACCESS_KEY_ID="test", AWS_SECRET_ACCESS_KEY="test", AWS_DEFAULT_REGION="us-east-1",
                      AWS_ENDPOINT_URL_S3=endpoint, AWS_ENDPOINT_URL=endpoint)
    s3fs.S3FileSystem.clear_instance_cache()
    client = boto3.client("s3", endpoint_url=endpoint)
    client.create_bucket(Bucket=BUCKET)
    try:
        yield client
    finally:
        server.stop()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        s3fs.S3FileSystem.clear_instance_cache()


def test_a_corpus_in_s3_curates_like_the_same_corpus_on_disk(s3, tmp_path):
    local = tmp_path / "local"
    write_corpus(local, files_per_source=1, docs_per_file=25)
    for path in sorted(local.glob("*.jsonl")):
        s3.put_object(Bucket=BUCKET, Key=f"tiny/{path.name}", Body=path.read_bytes())
    remote = tmp_path / "remote.yaml"
    remote.write_text((local / "manifest.yaml").read_text() + f"base: s3://{BUCKET}/tiny\n")
    curate(local / "manifest.yaml", tmp_path / "cur_local", taggers=["exact", "near"], partitions=3)
    curate(remote, tmp_path / "cur_remote", taggers=["exact", "near"], partitions=3)
    for tagger in ("exact", "near"):
        assert attributes(tmp_path / "cur_remote", tagger) == attributes(tmp_path / "cur_local", tagger)
    mix(tmp_path / "cur_remote", Rules(near_duplicates="keep_one"), tmp_path / "arm")
    arm = yaml.safe_load((tmp_path / "arm" / "manifest.yaml").read_text())
    assert arm["eval"][0]["files"] == [f"s3://{BUCKET}/tiny/eval.jsonl"]
