"""A real S3 API on loopback for tests of corpora in object stores: moto's server on 127.0.0.1 (a port of its
own), this process's AWS settings pointed at it for the duration, s3fs's cached filesystems dropped on the
way in and out (they hold the endpoint they were made with)."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager

AWS_KEYS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION", "AWS_ENDPOINT_URL_S3",
            "AWS_ENDPOINT_URL")


def fresh_filesystems() -> None:
    import s3fs

    s3fs.S3FileSystem.clear_instance_cache()


@contextmanager
def s3_server(bucket: str) -> Iterator[object]:
    """A boto3 client of a fresh moto S3 server holding the empty `bucket`."""
    import boto3
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    saved = {k: os.environ.get(k) for k in AWS_KEYS}
    endpoint = f"http://127.0.0.1:{server.get_host_and_port()[1]}"
    os.environ.update(AWS_ACCESS_KEY_ID="test", AWS_SECRET_ACCESS_KEY="test", AWS_DEFAULT_REGION="us-east-1",
                      AWS_ENDPOINT_URL_S3=endpoint, AWS_ENDPOINT_URL=endpoint)
    fresh_filesystems()
    client = boto3.client("s3", endpoint_url=endpoint)
    client.create_bucket(Bucket=bucket)
    try:
        yield client
    finally:
        server.stop()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        fresh_filesystems()
