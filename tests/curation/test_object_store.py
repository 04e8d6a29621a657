"""A corpus in an object store (moto's S3 server on loopback) curates to the attributes of the same corpus on
disk, and its arm names the held-out files by URL."""

from __future__ import annotations


import pytest
import yaml

from curation.mix import mix
from curation.pipeline import curate
from curation.rules import Rules
from tests.curation.corpus import write_corpus
from tests.curation.test_pipeline import attributes
from tests.s3_server import s3_server

BUCKET = "curation-corpus"


@pytest.fixture()
def s3():
    pytest.importorskip("s3fs")
    with s3_server(BUCKET) as client:
        yield client


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
