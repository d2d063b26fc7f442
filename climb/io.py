"""Reading corpora and writing files safely.

Corpus files are Parquet, JSON Lines (optionally .gz / .zst), globs of them, or a
folder written by `datasets.save_to_disk`. Every stage reads a corpus file with
`read_documents`, so ids and order agree across stages. Empty or whitespace-only
documents and lines that are not valid UTF-8 are skipped and counted, never
dropped silently.

    from climb.io import resolve_corpus_files, read_documents
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
import tempfile
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Sequence

import pyarrow as pa
import pyarrow.parquet as pq

JSONL_SUFFIXES = (".jsonl", ".json", ".ndjson")
PARQUET_SUFFIXES = (".parquet", ".pq")


class InputError(ValueError):
    """Bad input a user can fix; the message names the file and the fix."""


@dataclass
class DocBatch:
    ids: list[str]
    texts: list[str]
    extra: dict[str, list] = field(default_factory=dict)
    skipped: Counter = field(default_factory=Counter)


def _strip_compression(name: str) -> str:
    for ext in (".gz", ".zst", ".zstd"):
        if name.endswith(ext):
            return name[: -len(ext)]
    return name


def _is_hf_saved(path: Path) -> bool:
    return path.is_dir() and (path / "state.json").exists() and (path / "dataset_info.json").exists()


def _kind(path: Path) -> str:
    if _is_hf_saved(path):
        return "hf"
    name = _strip_compression(path.name.lower())
    if name.endswith(PARQUET_SUFFIXES):
        return "parquet"
    if name.endswith(JSONL_SUFFIXES):
        return "jsonl"
    if name.endswith(".arrow"):
        return "arrow"
    raise InputError(f"{path}: unsupported file type; use Parquet, JSON Lines (.jsonl[.gz|.zst]) "
                     "or a folder written by datasets.save_to_disk")


def resolve_corpus_files(patterns: Sequence[str], run_dir: Path | None = None,
                         max_shards: int = 0) -> list[Path]:
    """Expand globs and folders into a sorted list of corpus files (shards)."""
    files: list[Path] = []
    for pat in patterns:
        pat = pat.replace("{run}", str(run_dir)) if run_dir is not None else pat
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
    files = [f.resolve() for f in files]
    for f in files:
        _kind(f)
    if max_shards:
        files = files[:max_shards]
    return files


def _open_text(path: Path):
    raw = open(path, "rb")
    name = path.name.lower()
    if name.endswith(".gz"):
        return gzip.open(raw)
    if name.endswith((".zst", ".zstd")):
        import zstandard
        return io.BufferedReader(zstandard.ZstdDecompressor().stream_reader(raw))
    return raw


def _iter_jsonl(path: Path, columns: list[str], batch_rows: int,
                skipped: Counter, present: set) -> Iterator[dict[str, list]]:
    buf: dict[str, list] = {c: [] for c in columns}
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
            for c in columns:
                buf[c].append(rec.get(c))
            present.update(c for c in columns if c in rec)
            if len(buf[columns[0]]) >= batch_rows:
                yield buf
                buf = {c: [] for c in columns}
    if buf[columns[0]]:
        yield buf


def _arrow_batches(path: Path, kind: str, columns: list[str], batch_rows: int) -> Iterator[dict[str, list]]:
    if kind == "parquet":
        pf = pq.ParquetFile(path)
        names = pf.schema_arrow.names
        _check_columns(path, names, columns)
        for b in pf.iter_batches(batch_size=batch_rows, columns=columns):
            yield b.to_pydict()
        return
    from datasets import Dataset  # arrow files written by datasets.save_to_disk
    ds = Dataset.from_file(str(path))
    _check_columns(path, ds.column_names, columns)
    for b in ds.select_columns(columns).iter(batch_size=batch_rows):
        yield b


def _check_columns(path: Path, names: Sequence[str], wanted: Sequence[str]) -> None:
    missing = [c for c in wanted if c not in names]
    if missing:
        raise InputError(f"{path}: missing column(s) {missing}; it has {list(names)}. "
                         "Set corpus.text_column / corpus.id_column (e.g. --set corpus.text_column=content), "
                         "or id_column=\"\" to make ids")


def read_documents(path: Path, text_column: str = "text", id_column: str = "id",
                   extra_columns: Sequence[str] = (), batch_rows: int = 2048) -> Iterator[DocBatch]:
    """Stream (ids, texts) from one corpus file in batches; skips are counted per batch."""
    path = Path(path)
    kind = _kind(path)
    columns = [text_column] + ([id_column] if id_column else []) + list(extra_columns)
    skipped: Counter = Counter()
    if not path.exists():
        raise InputError(f"{path}: file not found; check corpus.paths")
    if kind in ("parquet", "arrow") and path.is_file() and path.stat().st_size == 0:
        raise InputError(f"{path}: empty file (0 bytes), not a {kind} file; remove it or re-create it")
    present: set = set()  # JSON Lines fields seen in at least one record
    try:
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
                out.ids.append(str(doc_id) if doc_id is not None else f"{path.stem}:{r}")
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
    except _read_errors() as e:
        raise InputError(f"{path}: cannot read ({e}); is it a complete, uncorrupted "
                         f"{kind} file? Remove or re-create it") from e


def _read_errors() -> tuple:
    errors: tuple = (pa.ArrowInvalid, OSError, EOFError)
    try:
        import zstandard
        errors += (zstandard.ZstdError,)
    except ImportError:
        pass
    return errors


def count_bytes(texts: Sequence[str]) -> int:
    return sum(len(t.encode("utf-8")) for t in texts)


@contextmanager
def atomic_path(path: str | Path):
    """Yield a temporary path next to `path`; rename it into place on success."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as e:  # name the file meant, not the temporary one
        raise type(e)(e.errno, e.strerror, str(path)) from None
    os.close(fd)
    try:
        yield Path(tmp)
        os.chmod(tmp, 0o644)  # mkstemp makes files private; outputs are meant to be shared
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def write_json(path: str | Path, obj) -> None:
    with atomic_path(path) as tmp:
        Path(tmp).write_text(strict_json(obj, indent=2) + "\n")


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


def write_parquet(path: str | Path, table: pa.Table, row_group_size: int = 8192) -> None:
    """Write a table with zstd and bounded row groups, atomically."""
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp, compression="zstd", row_group_size=row_group_size)


def fingerprint(paths: Sequence[str | Path]) -> list[list]:
    """Cheap input fingerprints: name, size and mtime of each file."""
    out = []
    for p in paths:
        st = os.stat(p)
        out.append([str(p), st.st_size, int(st.st_mtime)])
    return out
