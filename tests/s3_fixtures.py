"""pytest fixtures for a real S3 server (S3Proxy, ``s3_server.py``), one per session.

    from s3_fixtures import s3, s3_env  # noqa: F401  (fixtures)

``s3`` is the server; ``s3_env`` sets its AWS variables in this process for one test
and gives a fresh bucket's ``s3://`` URL.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from s3_server import S3Server, s3_from_env, start_s3


@pytest.fixture(scope="session")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    server = s3_from_env()
    if server is not None:
        yield server
        return
    t0 = time.monotonic()
    server = start_s3(tmp_path_factory.mktemp("s3"))
    print(f"\nS3Proxy up in {time.monotonic() - t0:.1f} s at {server.endpoint}")
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def s3_env(s3: S3Server, monkeypatch: pytest.MonkeyPatch) -> str:
    """This process talks to the test S3 server; a fresh bucket's URL."""
    for key, value in s3.env().items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    return s3.bucket()
