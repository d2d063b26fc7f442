"""Real servers for the remote-corpus tests, started by the tests themselves on 127.0.0.1.

- `s3_server` (session): moto's standalone S3 server on a free port; `s3` (per test) a
  fresh bucket on it, with credentials and endpoint set in the environment the way a
  user sets them (AWS_ACCESS_KEY_ID, ..., AWS_ENDPOINT_URL), so the code under test
  finds them as it would on a real store. Dask worker processes started during the
  test inherit them.
- `http_root` (per test): a folder served over http:// by `http.server`, with byte
  ranges (as every real file server, S3 and the Hub serve them), logging the bytes of
  every response so a test can check that no file was fetched whole.
"""
from __future__ import annotations

import functools
import http.server
import io
import logging
import os
import threading
import uuid
from pathlib import Path
from types import SimpleNamespace

import pytest

AWS_ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
           "AWS_EC2_METADATA_DISABLED": "true"}


@pytest.fixture(scope="session")
def s3_server():
    pytest.importorskip("s3fs")
    server_mod = pytest.importorskip("moto.server")
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = server_mod.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


def use_s3(monkeypatch, endpoint: str, **overrides) -> None:
    """Point the environment at the test server, and forget file systems made with another."""
    import s3fs
    for k in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_SHARED_CREDENTIALS_FILE", "AWS_CONFIG_FILE"):
        monkeypatch.delenv(k, raising=False)
    for k, v in {**AWS_ENV, "AWS_ENDPOINT_URL": endpoint, **overrides}.items():
        if v is None:
            monkeypatch.delenv(k, raising=False)
        else:
            monkeypatch.setenv(k, v)
    s3fs.S3FileSystem.clear_instance_cache()


@pytest.fixture
def s3(s3_server, monkeypatch):
    """A fresh bucket: .fs (an s3fs filesystem), .bucket, .url (s3://bucket), .endpoint."""
    import s3fs
    use_s3(monkeypatch, s3_server)
    fs = s3fs.S3FileSystem()
    bucket = f"climb-{uuid.uuid4().hex[:10]}"
    fs.mkdir(bucket)
    yield SimpleNamespace(fs=fs, bucket=bucket, url=f"s3://{bucket}", endpoint=s3_server)
    s3fs.S3FileSystem.clear_instance_cache()


def upload(fs, local: Path, url: str) -> None:
    """Copy a local file or folder's files to a URL (the test's way of filling a bucket)."""
    files = [local] if local.is_file() else sorted(p for p in local.rglob("*") if p.is_file())
    for p in files:
        rel = "" if local.is_file() else "/" + p.relative_to(local).as_posix()
        fs.pipe(url.split("://", 1)[1] + rel, p.read_bytes())


class RangeHandler(http.server.SimpleHTTPRequestHandler):
    """http.server's file handler plus single byte ranges (`Range: bytes=a-b`)."""

    sent: list  # (path, bytes) of every response body

    def log_message(self, *args):
        pass

    def send_head(self):
        path = self.translate_path(self.path)
        rng = self.headers.get("Range")
        if not rng or os.path.isdir(path) or not os.path.isfile(path):
            body = super().send_head()
            if body is not None and self.command == "GET":
                self.sent.append((self.path, len(body.getvalue()) if isinstance(body, io.BytesIO)
                                  else os.fstat(body.fileno()).st_size))
            return body
        with open(path, "rb") as f:
            st = os.fstat(f.fileno())
            first, _, last = rng.split("=", 1)[1].partition("-")
            start = int(first)
            end = min(int(last) if last else st.st_size - 1, st.st_size - 1)
            if start >= st.st_size:
                self.send_error(416)
                return None
            f.seek(start)
            data = f.read(end - start + 1)
        self.send_response(206)
        self.send_header("Content-Type", self.guess_type(path))
        self.send_header("Content-Range", f"bytes {start}-{end}/{st.st_size}")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Last-Modified", self.date_time_string(st.st_mtime))
        self.end_headers()
        if self.command == "GET":
            self.sent.append((self.path, len(data)))
        return io.BytesIO(data)


@pytest.fixture
def http_root(tmp_path):
    """(folder, base URL, log of (path, bytes sent)): files put in the folder are served at the URL."""
    pytest.importorskip("aiohttp")
    root = tmp_path / "www"
    root.mkdir()
    sent: list = []
    handler = type("Handler", (RangeHandler,), {"sent": sent})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(handler, directory=str(root)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield SimpleNamespace(root=root, url=f"http://127.0.0.1:{server.server_address[1]}", sent=sent)
    server.shutdown()
    server.server_close()
