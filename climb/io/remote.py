"""Corpora where they live: fsspec URLs in (s3://, gs://, hf://, http(s)://, memory://), object stores out.

Local paths never come here: `climb.io.files.is_url` tells the two apart, and every
caller keeps its local code path exactly as it was. A URL is opened with fsspec;
the filesystem of its protocol (s3fs, gcsfs, huggingface_hub, aiohttp for
http) is imported when the first URL of that protocol is met, and credentials
come from that filesystem's usual configuration: `AWS_*` variables or `~/.aws`
(and `AWS_ENDPOINT_URL` for an S3-compatible server), `GOOGLE_APPLICATION_CREDENTIALS`
or gcloud's login, `HF_TOKEN`, or fsspec's own `FSSPEC_<PROTOCOL>_<OPTION>`.

Reading streams: a file is an fsspec buffered file that fetches byte ranges
on demand, so a Parquet file is read row group by row group and a JSON Lines
file block by block; no whole remote file is copied first.

Writing (`write_atomic`): an object store has no rename. An object is written
under a hidden staging key, `<staging>/.climb-tmp/<random>/<name>`, and moved to
its final key only once complete (on S3 and GCS a server-side copy, which makes
the object appear whole or not at all); a failed write removes its staging key.
Globs here skip hidden names, as shell globs do, so nothing half-written is ever
visible under a final name.

Errors: a missing bucket, object, credential, package or server becomes one
`InputError` naming the URL and what to check.

    from climb.io import remote
    for url in remote.expand("s3://bucket/corpus/*.parquet"):
        print(url, remote.fingerprint(url))
"""
from __future__ import annotations

import datetime as _dt
import json
import posixpath
import uuid
from contextlib import contextmanager
from typing import IO, Callable, Iterator

import pyarrow as pa
import pyarrow.parquet as pq

from climb.io.errors import InputError, check_columns

STAGING = ".climb-tmp"
# Read in blocks of this size: memory stays bounded however large a file is.
BLOCK_SIZE = 8 * 2**20
_PACKAGES = {"s3": "s3fs", "s3a": "s3fs", "gs": "gcsfs", "gcs": "gcsfs", "hf": "huggingface_hub",
             "http": "aiohttp", "https": "aiohttp"}
_EXTRAS = {"s3fs": "s3", "gcsfs": "gcs", "huggingface_hub": "hf", "aiohttp": "http"}
# Stores whose first path component is a bucket (or container) that must exist.
_BUCKETS = ("s3", "s3a", "gs", "gcs", "abfs", "az")
_CREDENTIALS = {
    "s3": "AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, AWS_PROFILE or ~/.aws (AWS_ENDPOINT_URL for an "
          "S3-compatible server)",
    "gs": "GOOGLE_APPLICATION_CREDENTIALS or `gcloud auth application-default login`",
    "hf": "HF_TOKEN or `hf auth login`, and HF_HUB_OFFLINE unset",
    "http": "the address, and that the server is up",
}
_CREDENTIALS.update(s3a=_CREDENTIALS["s3"], gcs=_CREDENTIALS["gs"], https=_CREDENTIALS["http"])
# Store-client packages whose exceptions mean "cannot reach or may not read", not "bad data".
_STORE_MODULES = ("botocore", "aiobotocore", "s3fs", "gcsfs", "google", "huggingface_hub", "aiohttp", "requests")
# Keys of fsspec `info` that change with an object's content (first found wins), and with its time.
_TAG_KEYS = ("ETag", "etag", "md5Hash", "blob_id", "sha256", "checksum", "Content-MD5", "generation")
_TIME_KEYS = ("LastModified", "Last-Modified", "updated", "mtime", "last_modified", "created")


def protocol(url: str) -> str:
    return url.split("://", 1)[0].lower()


def basename(url: str) -> str:
    return url.split("?", 1)[0].rstrip("/").rsplit("/", 1)[-1]


def join(base: str, *parts: str) -> str:
    return "/".join([base.rstrip("/"), *(p.strip("/") for p in parts)])


def _hint(url: str) -> str:
    return _CREDENTIALS.get(protocol(url), "the filesystem's configuration (FSSPEC_<PROTOCOL>_<OPTION> variables)")


def filesystem(url: str):
    """(fsspec filesystem, path inside it) for a URL; the protocol's package is imported here."""
    try:
        import fsspec
        return fsspec.core.url_to_fs(url)
    except ImportError as e:
        pkg = _PACKAGES.get(protocol(url), "the fsspec implementation of this protocol")
        extra = _EXTRAS.get(pkg, "remote")
        raise InputError(f"{url}: {protocol(url)}:// URLs need {pkg} ({e}); install it with "
                         f"pip install 'climb[{extra}]'") from None
    except ValueError as e:
        raise InputError(f"{url}: {e}; use a local path or an fsspec URL (s3://, gs://, hf://, http(s)://)") from None


def _store_error(e: BaseException) -> bool:
    if isinstance(e, (ConnectionError, TimeoutError)):
        return True
    return any(type(c).__module__.split(".")[0] in _STORE_MODULES for c in (e, e.__cause__) if c is not None)


@contextmanager
def errors(url: str, doing: str = "read") -> Iterator[None]:
    """Turn a store's failures (no such bucket or object, no access, no server) into one InputError."""
    try:
        yield
    except InputError:
        raise
    except FileNotFoundError as e:
        bucket = " (does the bucket exist?)" if protocol(url) in _BUCKETS else ""
        raise InputError(f"{url}: not found ({_why(e)}); check the URL{bucket}") from e
    except PermissionError as e:
        raise InputError(f"{url}: access denied ({_why(e)}); check the credentials: {_hint(url)}") from e
    except Exception as e:  # noqa: BLE001 - narrowed by _store_error
        if not _store_error(e):
            raise
        name = type(e).__name__
        what = "no credentials found" if "Credentials" in name else f"cannot {doing} ({name}: {_why(e)})"
        raise InputError(f"{url}: {what}; check {_hint(url)}") from e


def _why(e: BaseException) -> str:
    return " ".join(str(e).split()) or type(e).__name__


def _hidden(path: str, base: str) -> bool:
    """Whether a name below `base` (the part of a glob before its first wildcard) is hidden."""
    rest = path[len(base):] if path.startswith(base) else basename(path)
    return any(part.startswith(".") for part in rest.split("/") if part)


def _literal_prefix(path: str) -> str:
    parts = path.split("/")
    for i, part in enumerate(parts):
        if any(ch in part for ch in "*?["):
            return "/".join(parts[:i])
    return path


def _check_bucket(url: str, fs, path: str) -> None:
    if protocol(url) not in _BUCKETS:
        return
    bucket = path.split("/", 1)[0]
    with errors(url, "list"):
        if not fs.exists(bucket):
            raise InputError(f"{url}: the bucket {bucket!r} does not exist (or these credentials cannot see "
                             f"it); check the URL and {_hint(url)}")


def expand(pattern: str, suffixes: tuple[str, ...]) -> list[str]:
    """The files a URL names, as URLs, sorted: a glob, one file (a name ending in one of
    `suffixes`), a folder (its visible files), or a `datasets.save_to_disk` folder (its
    data files). An empty list where nothing matches; an error where the bucket is missing."""
    fs, path = filesystem(pattern)
    with errors(pattern, "list"):
        fs.invalidate_cache()  # an object changed since the last listing is seen as changed
        if any(ch in path for ch in "*?["):
            base = _literal_prefix(path)
            found = fs.glob(path, detail=True)
            files = [p for p, info in found.items()
                     if info.get("type", "file") != "directory" and not _hidden(p, base)]
        elif basename(path).lower().endswith(suffixes):
            # One file: an `info` (a HEAD), never a listing, which over http would fetch it.
            # Only "not found" means no file; any other failure is reported as it is.
            try:
                fs.info(path)
                files = [path]
            except FileNotFoundError as e:
                cause = e.__cause__ or e.__context__  # fsspec's http reports any failure as not found
                if isinstance(cause, OSError) and not isinstance(cause, FileNotFoundError):
                    raise InputError(f"{pattern}: cannot reach it ({type(cause).__name__}: {_why(cause)}); "
                                     f"check {_hint(pattern)}") from e
                files = []
        elif fs.exists(join(path, "state.json")) and fs.exists(join(path, "dataset_info.json")):
            with fs.open(join(path, "state.json"), "rb") as fh:
                state = json.load(fh)
            files = [join(path, f["filename"]) for f in state.get("_data_files", [])]
        else:
            files = [e["name"] for e in fs.ls(path, detail=True) if e.get("type") == "file"
                     and not basename(e["name"]).startswith((".", "_"))] if fs.isdir(path) else []
        if not files:
            _check_bucket(pattern, fs, path)
    return sorted(_url(pattern, p) for p in files)


def _url(pattern: str, path: str) -> str:
    if "://" in path:  # http paths are URLs already
        return path
    return f"{protocol(pattern)}://{path}"


def info(url: str) -> dict:
    fs, path = filesystem(url)
    with errors(url):
        return fs.info(path)


def _stamp(value) -> str:
    return value.isoformat() if isinstance(value, _dt.datetime) else str(value)


def tag(entry: dict) -> list:
    """[size, content tag]: the ETag (or checksum, blob id) where the store gives one, else the time."""
    size = int(entry.get("size") or entry.get("Size") or 0)
    for k in _TAG_KEYS:
        if entry.get(k):
            return [size, _stamp(entry[k]).strip('"')]
    return [size, next((_stamp(entry[k]) for k in _TIME_KEYS if entry.get(k)), "")]


def fingerprint(url: str) -> list:
    """[url, size, ETag or checksum, modification time]: what changes when the object does."""
    entry = info(url)
    when = next((_stamp(entry[k]) for k in _TIME_KEYS if entry.get(k)), "")
    return [url, *tag(entry), when]


def open_input(url: str) -> IO[bytes]:
    """A streaming binary file: byte ranges fetched on demand, BLOCK_SIZE at a time.
    Reads from it may still fail: wrap them in `errors(url)`."""
    fs, path = filesystem(url)
    with errors(url):
        return fs.open(path, "rb", block_size=BLOCK_SIZE)


def record_batches(url: str, kind: str, columns: list[str], batch_rows: int) -> Iterator[dict[str, list]]:
    """Record batches of a remote Parquet file (row group by row group, byte ranges on
    demand) or Arrow IPC stream (as `datasets.save_to_disk` writes them)."""
    with open_input(url) as fh:
        if kind == "parquet":
            # No pre-buffering: it would fetch every row group of the file at once; the
            # file's own read-ahead (BLOCK_SIZE) batches the small reads into few requests.
            pf = pq.ParquetFile(fh, pre_buffer=False)
            check_columns(url, pf.schema_arrow.names, columns)
            for b in pf.iter_batches(batch_size=batch_rows, columns=columns):
                yield b.to_pydict()
            return
        reader = pa.ipc.open_stream(fh)
        check_columns(url, reader.schema.names, columns)
        for b in reader:
            b = b.select(columns)
            for s in range(0, b.num_rows, batch_rows):
                yield b.slice(s, batch_rows).to_pydict()


def write_atomic(url: str, write: Callable[[IO[bytes]], None], staging: str | None = None) -> None:
    """Write an object through `write(file)` under a hidden staging key, then move it to `url`.

    `staging` is the folder (URL) whose `.climb-tmp/` holds the staging key, by default
    the object's own folder; keep it on the same store so the move is a server-side copy.
    """
    fs, path = filesystem(url)
    root = filesystem(staging)[1] if staging else posixpath.dirname(path)
    tmp = join(root, STAGING, uuid.uuid4().hex, basename(path))
    with errors(url, "write"):
        try:
            with fs.open(tmp, "wb") as fh:
                write(fh)
            fs.mv(tmp, path)
        finally:
            try:
                if fs.exists(tmp):
                    fs.rm(tmp)
            except Exception:  # noqa: BLE001 - the write's own error, if any, matters more
                pass


def write_text(url: str, text: str, staging: str | None = None) -> None:
    write_atomic(url, lambda fh: fh.write(text.encode("utf-8")), staging)


def listing(root: str) -> dict[str, list]:
    """{path relative to root: [size, tag]} of every visible object under a folder URL."""
    fs, path = filesystem(root)
    with errors(root, "list"):
        fs.invalidate_cache()
        found = fs.find(path, detail=True) if fs.exists(path) else {}
    base = path.rstrip("/") + "/"
    return {p[len(base):]: tag(e) for p, e in found.items()
            if p.startswith(base) and not _hidden(p, base) and e.get("type", "file") != "directory"}


def remove(url: str) -> None:
    """Delete an object; one already gone is fine."""
    fs, path = filesystem(url)
    with errors(url, "delete"):
        try:
            fs.rm(path)
        except FileNotFoundError:
            pass


def check_destination(url: str) -> None:
    """Fail early, before hours of search, where an output URL cannot work: no package, no bucket, no access."""
    fs, path = filesystem(url)
    _check_bucket(url, fs, path)
