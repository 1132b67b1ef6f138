"""A loopback S3 server (moto's) for the tests of remote catalogs, with the credentials
a client needs in the environment while it serves."""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator

CREDENTIALS = {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test", "AWS_DEFAULT_REGION": "us-east-1"}


@contextlib.contextmanager
def loopback_s3(bucket: str) -> Iterator[str]:
    """Serve S3 on 127.0.0.1 with `bucket` made; yields the query part of a catalog URI
    that reaches it (``endpoint_override=...&scheme=http&region=us-east-1``)."""
    import pyarrow.fs as pafs
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    saved = {k: os.environ.get(k) for k in CREDENTIALS}
    os.environ.update(CREDENTIALS)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    server.start()
    try:
        host, port = server.get_host_and_port()
        endpoint = f"endpoint_override={host}:{port}&scheme=http&region=us-east-1"
        pafs.S3FileSystem(
            endpoint_override=f"{host}:{port}", scheme="http", region="us-east-1", allow_bucket_creation=True
        ).create_dir(bucket)
        yield endpoint
    finally:
        server.stop()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
