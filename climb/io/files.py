"""Reading corpora and writing files safely.

Corpus files are Parquet, JSON Lines (optionally .gz / .zst), globs of them, or a
folder written by `datasets.save_to_disk`, on a local disk or at an fsspec URL
(s3://, gs://, hf://, http(s)://: climb/io/remote.py). Every stage reads a corpus
file with `read_documents`, so ids and order agree across stages. Empty or
whitespace-only documents and lines that are not valid UTF-8 are skipped and
counted, never dropped silently. A local file is a `Path`, a remote one its URL
(a `str`); both travel to Dask workers as strings, and each worker reads them itself.

    from climb.io.files import resolve_corpus_files, read_documents
    for batch in read_documents(path, "text", "id"):
        print(len(batch.ids), batch.skipped)
"""
from __future__ import annotations

import glob
import gzip
import io
import json
import math
import os
import re
from collections import Counter
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Sequence

import pyarrow as pa
import pyarrow.parquet as pq

from climb.io.errors import InputError, check_columns  # noqa: F401  (re-exported)
# The one atomic file writer (temporary file, fsync, rename), shared with the proxies package.
from proxies.atomic import atomic_path  # noqa: F401  (re-exported: climb.io.files.atomic_path)

JSONL_SUFFIXES = (".jsonl", ".json", ".ndjson")
PARQUET_SUFFIXES = (".parquet", ".pq")
CORPUS_SUFFIXES = tuple(b + c for b in PARQUET_SUFFIXES + JSONL_SUFFIXES + (".arrow",)
                        for c in ("", ".gz", ".zst", ".zstd"))
_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


@dataclass
class DocBatch:
    ids: list[str]
    texts: list[str]
    extra: dict[str, list] = field(default_factory=dict)
    skipped: Counter = field(default_factory=Counter)


def is_url(path) -> bool:
    """Whether a path is an fsspec URL (s3://, gs://, hf://, http(s)://, memory://, ...);
    a `Path`, a plain path and a file:// URL are local."""
    return isinstance(path, str) and bool(_URL.match(path)) and not path.startswith("file://")


def local_path(path: str | Path) -> Path:
    """A local path, given as a path or a file:// URL."""
    return Path(path[len("file://"):]) if isinstance(path, str) and path.startswith("file://") else Path(path)


def file_name(path: str | Path) -> str:
    """The last component of a path or URL."""
    if is_url(path):
        from climb.io.remote import basename
        return basename(path)
    return Path(path).name


def check_shard_names(files) -> None:
    """Corpus files must have distinct shard names (`shard_name`): every stage's unit is named so."""
    names = [shard_name(f) for f in files]
    clash = sorted({n for n in names if names.count(n) > 1})
    if clash:
        raise InputError(f"corpus files share the shard name(s) {clash} (e.g. part.parquet in two folders); "
                         "rename them or list one folder per run in corpus.paths")


def shard_name(path: str | Path) -> str:
    """The name a corpus file's shards take in every stage: its file name without extensions."""
    name = file_name(path)
    for ext in (".gz", ".zst", ".zstd", ".parquet", ".jsonl", ".json", ".ndjson", ".arrow", ".pq"):
        if name.endswith(ext):
            name = name[: -len(ext)]
    return name


def _strip_compression(name: str) -> str:
    for ext in (".gz", ".zst", ".zstd"):
        if name.endswith(ext):
            return name[: -len(ext)]
    return name


def _is_hf_saved(path: Path) -> bool:
    return path.is_dir() and (path / "state.json").exists() and (path / "dataset_info.json").exists()


def _kind(path: Path | str) -> str:
    if not is_url(path) and _is_hf_saved(path):
        return "hf"
    name = _strip_compression(file_name(path).lower())
    if name.endswith(PARQUET_SUFFIXES):
        return "parquet"
    if name.endswith(JSONL_SUFFIXES):
        return "jsonl"
    if name.endswith(".arrow"):
        return "arrow"
    raise InputError(f"{path}: unsupported file type; use Parquet, JSON Lines (.jsonl[.gz|.zst]) "
                     "or a folder written by datasets.save_to_disk")


def resolve_corpus_files(patterns: Sequence[str], run_dir: Path | None = None,
                         max_shards: int = 0) -> list[Path | str]:
    """Expand globs and folders into a sorted list of corpus files (shards): local
    files as absolute `Path`s, remote ones as URLs."""
    files: list[Path | str] = []
    for pat in patterns:
        pat = pat.replace("{run}", str(run_dir)) if run_dir is not None else pat
        if is_url(pat):
            from climb.io.remote import expand
            found_urls = expand(pat, CORPUS_SUFFIXES)
            if not found_urls:
                raise InputError(f"no corpus files match {pat!r}; check corpus.paths in the config "
                                 "(e.g. --set corpus.paths=['s3://bucket/corpus/*.parquet'])")
            files += found_urls
            continue
        pat = str(local_path(pat))
        p = Path(pat)
        if _is_hf_saved(p):
            state = json.loads((p / "state.json").read_text())
            files += [p / f["filename"] for f in state.get("_data_files", [])]
            continue
        if p.is_dir():
            found = sorted(q for q in p.iterdir() if q.is_file() and not q.name.startswith((".", "_")))
        else:
            found = sorted(Path(x) for x in glob.glob(pat, recursive=True))
        if not found:
            raise InputError(f"no corpus files match {pat!r}; check corpus.paths in the config "
                             "(e.g. --set corpus.paths=['data/*.parquet'])")
        files += found
    # Absolute paths: Dask workers may run in another working directory.
    files = [f if isinstance(f, str) else f.resolve() for f in files]
    for f in files:
        _kind(f)
    if max_shards:
        files = files[:max_shards]
    return files


def _open_raw(path: Path | str):
    if is_url(path):
        from climb.io.remote import open_input
        return open_input(path)
    return open(path, "rb")


@contextmanager
def _open_text(path: Path | str):
    with _open_raw(path) as raw:
        name = file_name(path).lower()
        if name.endswith(".gz"):
            with gzip.open(raw) as fh:
                yield fh
        elif name.endswith((".zst", ".zstd")):
            import zstandard
            yield io.BufferedReader(zstandard.ZstdDecompressor().stream_reader(raw))
        else:
            yield raw


def _jsonl_records(path: Path | str, skipped: Counter) -> Iterator[dict]:
    """The JSON objects of a JSON Lines file, one a line; blank lines are passed over, lines
    that are not UTF-8 counted in `skipped`."""
    with _open_text(path) as fh:
        for lineno, raw in enumerate(fh, 1):
            if not raw.strip():
                continue
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError:
                skipped["invalid_utf8"] += 1
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise InputError(f"{path}:{lineno}: not valid JSON ({e.msg}); "
                                 "each line must be one JSON object") from e
            if not isinstance(rec, dict):
                raise InputError(f"{path}:{lineno}: a JSON {type(rec).__name__}, not an object; "
                                 "each line must be one JSON object")
            yield rec


def _iter_jsonl(path: Path, columns: list[str], batch_rows: int,
                skipped: Counter, present: set) -> Iterator[dict[str, list]]:
    buf: dict[str, list] = {c: [] for c in columns}
    for rec in _jsonl_records(path, skipped):
        for c in columns:
            buf[c].append(rec.get(c))
        present.update(c for c in columns if c in rec)
        if len(buf[columns[0]]) >= batch_rows:
            yield buf
            buf = {c: [] for c in columns}
    if buf[columns[0]]:
        yield buf


def _arrow_batches(path: Path | str, kind: str, columns: list[str], batch_rows: int) -> Iterator[dict[str, list]]:
    if is_url(path):
        from climb.io.remote import record_batches
        yield from record_batches(path, kind, columns, batch_rows)
        return
    if kind == "parquet":
        pf = pq.ParquetFile(path)
        names = pf.schema_arrow.names
        check_columns(path, names, columns)
        for b in pf.iter_batches(batch_size=batch_rows, columns=columns):
            yield b.to_pydict()
        return
    from datasets import Dataset  # arrow files written by datasets.save_to_disk
    ds = Dataset.from_file(str(path))
    check_columns(path, ds.column_names, columns)
    for b in ds.select_columns(columns).iter(batch_size=batch_rows):
        yield b


def read_documents(path: Path | str, text_column: str = "text", id_column: str = "id",
                   extra_columns: Sequence[str] = (), batch_rows: int = 2048) -> Iterator[DocBatch]:
    """Stream (ids, texts) from one corpus file (a path or a URL) in batches; skips are
    counted per batch."""
    remote = is_url(path)
    path = path if remote else local_path(path)
    kind = _kind(path)
    columns = [text_column] + ([id_column] if id_column else []) + list(extra_columns)
    if remote:
        from climb.io.remote import errors, info
        size = info(path).get("size")
        guard = errors(path)
    else:
        if not path.exists():
            raise InputError(f"{path}: file not found; check corpus.paths")
        size = path.stat().st_size if path.is_file() else None
        guard = nullcontext()
    if kind in ("parquet", "arrow") and size == 0:
        raise InputError(f"{path}: empty file (0 bytes), not a {kind} file; remove it or re-create it")
    stem = Path(file_name(path)).stem
    try:
        with guard:
            yield from _doc_batches(path, kind, stem, text_column, id_column, list(extra_columns), columns,
                                    batch_rows)
    except _read_errors() as e:
        raise InputError(f"{path}: cannot read ({e}); is it a complete, uncorrupted "
                         f"{kind} file? Remove or re-create it") from e


def peek(path: Path | str, columns: Sequence[str], n: int = 200) -> tuple[list[str], int, dict[str, list]]:
    """The first `n` records of a corpus file (a path or a URL), read as `read_documents` reads
    it, for checks that must not read the whole file: (the fields the file has: a Parquet or
    Arrow file's columns, the keys of the JSON Lines records read; the records read; the
    values of each of `columns` the file has, None where a record lacks it)."""
    remote = is_url(path)
    path = path if remote else local_path(path)
    kind = _kind(path)
    if not remote and not path.exists():
        raise InputError(f"{path}: file not found")
    if kind in ("parquet", "arrow") and not remote and path.stat().st_size == 0:
        raise InputError(f"{path}: empty file (0 bytes), not a {kind} file; remove it or re-create it")
    try:
        with (nullcontext() if not remote else _remote_errors(path)):
            return _peek(path, kind, list(columns), n)
    except _read_errors() as e:
        raise InputError(f"{path}: cannot read ({e}); is it a complete, uncorrupted "
                         f"{kind} file? Remove or re-create it") from e


def _remote_errors(url: str):
    from climb.io.remote import errors
    return errors(url)


def _peek(path: Path | str, kind: str, columns: list[str], n: int) -> tuple[list[str], int, dict[str, list]]:
    if kind == "jsonl":
        fields: dict[str, None] = {}  # in the order first seen
        values: dict[str, list] = {c: [] for c in columns}
        rows = 0
        for rec in _jsonl_records(path, Counter()):
            fields.update(dict.fromkeys(rec))
            for c in columns:
                values[c].append(rec.get(c))
            rows += 1
            if rows >= n:
                break
        return list(fields), rows, {c: v for c, v in values.items() if c in fields}
    with _open_raw(path) if is_url(path) else nullcontext(path) as src:
        if kind == "parquet":
            pf = pq.ParquetFile(src, pre_buffer=False) if is_url(path) else pq.ParquetFile(src)
            names = pf.schema_arrow.names
            have = [c for c in columns if c in names]
            rows = min(n, pf.metadata.num_rows)
            batch = next(pf.iter_batches(batch_size=n, columns=have), None) if have and rows else None
            rows = batch.num_rows if batch is not None else rows  # a first row group may hold fewer
            return names, rows, {c: (batch.column(c).to_pylist() if batch is not None else []) for c in have}
        if is_url(path):
            reader = pa.ipc.open_stream(src)
            names = reader.schema.names
            batch = next(iter(reader), None)
            part = batch.slice(0, n) if batch is not None else None
        else:
            from datasets import Dataset
            ds = Dataset.from_file(str(src))
            names = ds.column_names
            part = ds.data.table.slice(0, n)
        have = [c for c in columns if c in names]
        rows = part.num_rows if part is not None else 0
        return names, rows, {c: (part.column(c).to_pylist() if part is not None else []) for c in have}


def read_aligned(path: Path | str, corpus, rows: int, ids: Sequence[str] | None = None,
                 extra_columns: Sequence[str] = ()) -> Iterator[tuple[int, DocBatch]]:
    """One shard's documents in batches, each with the row of its first document in the
    per-row arrays an earlier stage wrote for the shard (embeddings, assignments, token
    counts): `rows` of them, and, given `ids`, the same ids in the same order. A shard that
    no longer lines up with them (edited since it was embedded) raises an InputError.
    `corpus` is the run's CorpusConfig (text and id columns, batch size)."""
    start = 0
    for b in read_documents(path, corpus.text_column, corpus.id_column, extra_columns, corpus.batch_rows):
        end = start + len(b.texts)
        if end > rows or (ids is not None and list(ids[start:end]) != b.ids):
            break
        yield start, b
        start = end
    else:
        if start == rows:
            return
    raise InputError(f"{path} changed since it was embedded (its documents no longer match the stored "
                     "per-document data); run `climb embed` (same --config and --run) again")


def _doc_batches(path: Path | str, kind: str, stem: str, text_column: str, id_column: str,
                 extra_columns: list[str], columns: list[str], batch_rows: int) -> Iterator[DocBatch]:
    skipped: Counter = Counter()
    present: set = set()  # JSON Lines fields seen in at least one record
    source = (_iter_jsonl(path, columns, batch_rows, skipped, present) if kind == "jsonl"
              else _arrow_batches(path, kind, columns, batch_rows))
    row = 0
    for cols in source:
        out = DocBatch([], [], {c: [] for c in extra_columns}, Counter(skipped))
        skipped.clear()
        texts = cols[text_column]
        for i, text in enumerate(texts):
            r = row + i
            if not isinstance(text, str) or not text.strip():
                out.skipped["empty"] += 1
                continue
            doc_id = cols[id_column][i] if id_column else None
            out.ids.append(str(doc_id) if doc_id is not None else f"{stem}:{r}")
            out.texts.append(text)
            for c in extra_columns:
                out.extra[c].append(cols[c][i])
        row += len(texts)
        yield out
    if kind == "jsonl" and row and text_column not in present:
        raise InputError(f"{path}: no record has a {text_column!r} field; "
                         f"set corpus.text_column to the field holding the text")
    if skipped:
        yield DocBatch([], [], {c: [] for c in extra_columns}, Counter(skipped))


def _read_errors() -> tuple:
    errors: tuple = (pa.ArrowInvalid, OSError, EOFError)
    try:
        import zstandard
        errors += (zstandard.ZstdError,)
    except ImportError:
        pass
    return errors


def write_json(path: str | Path, obj) -> None:
    with atomic_path(path) as tmp:
        Path(tmp).write_text(strict_json(obj, indent=2) + "\n")


def write_npy(path: str | Path, array) -> None:
    """Save an array as .npy atomically (whole or not at all)."""
    import numpy as np
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as fh:
            np.save(fh, array)


def strict_json(obj, **kwargs) -> str:
    """JSON that strict readers accept: NaN and infinities become null."""
    return json.dumps(finite(obj), allow_nan=False, default=_json_default, **kwargs)


def finite(obj):
    """`obj` with every non-finite float (Python or numpy) replaced by None."""
    import numpy as np
    if isinstance(obj, (float, np.floating)):
        return float(obj) if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return finite(obj.tolist())
    return obj


def _json_default(o):
    import numpy as np
    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, (np.floating,)):
        return float(o)
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, Path):
        return str(o)
    raise TypeError(f"not JSON serialisable: {type(o)}")


def read_json(path: str | Path):
    return json.loads(Path(path).read_text())


def write_parquet(path: str | Path, table: pa.Table, row_group_size: int = 8192,
                  staging: str | None = None) -> None:
    """Write a table with zstd and bounded row groups, atomically: to a path, or to a URL
    through a hidden staging key (see climb.io.remote.write_atomic)."""
    if is_url(path):
        from climb.io.remote import write_atomic
        write_atomic(path, lambda fh: pq.write_table(table, fh, compression="zstd", row_group_size=row_group_size),
                     staging)
        return
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp, compression="zstd", row_group_size=row_group_size)


def write_text(path: str | Path, text: str, staging: str | None = None) -> None:
    """Write a text file (or object) atomically."""
    if is_url(path):
        from climb.io.remote import write_text as write_remote
        write_remote(path, text, staging)
        return
    with atomic_path(path) as tmp:
        Path(tmp).write_text(text)


def join(base: str, rel: str) -> str:
    """A path or URL under `base`."""
    return base.rstrip("/") + "/" + rel if is_url(base) else str(Path(base) / rel)


def file_stamp(path: str | Path) -> list[int]:
    """[size, mtime_ns] of a local file: how climb tells whether a file changed."""
    st = os.stat(path)
    return [st.st_size, st.st_mtime_ns]


def fingerprint(paths: Sequence[str | Path]) -> list[list]:
    """Cheap input fingerprints: name, size and mtime_ns of each local file (`file_stamp`);
    for a URL its name, size, ETag (or checksum) and modification time, as the store gives them."""
    out = []
    for p in paths:
        if is_url(p):
            from climb.io.remote import fingerprint as remote_fingerprint
            out.append(remote_fingerprint(p))
            continue
        out.append([str(p), *file_stamp(p)])
    return out
