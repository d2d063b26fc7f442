"""The sources of a corpus's documents (web, code, books ...), read cheaply.

A document's source is the value of `corpus.source_column`, or, where no column is
named, the corpus file it came from (its shard name, `climb.io.files.shard_name`).
A Parquet file is read for that column alone (with the text as well only where some
of its rows are empty documents, which every stage skips: the text tells which);
other files are streamed as `read_documents` streams them, the column beside the
text. A document whose column is null has the source `MISSING`.

    from climb.io.sources import corpus_source_names
    corpus_source_names(cfg, files)   # ['books', 'code', 'web']
"""
from __future__ import annotations

from contextlib import nullcontext
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from climb.io.errors import InputError
from climb.io.files import _kind, is_url, local_path, peek, read_documents, shard_name

MISSING = "(no source)"  # the source of a document whose source column is null


def corpus_source_names(cfg, files) -> list[str]:
    """The sorted distinct sources of the corpus files `files` (`cfg`: the run's config): the
    values of `corpus.source_column` (a Parquet file read for that column alone), or the files'
    shard names when no column is named. A file without the column raises an InputError."""
    column = cfg.corpus.source_column
    if not column:
        return sorted({shard_name(f) for f in files})
    names: set[str] = set()
    for f in files:
        names.update(file_sources(f, cfg.corpus)[0])
    return sorted(names)


def file_sources(path: Path | str, corpus, documents: int | None = None) -> tuple[list[str], np.ndarray | None]:
    """The sources named in one corpus file (sorted; `corpus`: the run's CorpusConfig, whose
    `source_column` is set) and, given `documents` (how many documents the stages read from it,
    empty ones skipped), each document's source as an index into them, in corpus order.

    A Parquet file's names are those of every row; its documents' sources come from that
    column alone when every row is a document (as many rows as `documents`), else from its
    documents as `read_documents` yields them, the text telling which rows are empty."""
    column = corpus.source_column
    if _kind(path if is_url(path) else local_path(path)) == "parquet":
        values = _parquet_column(path, column)
        names = _names(values)
        if documents is None:
            return names, None
        if len(values) == documents:
            return names, _codes(values, names)
        return names, _codes(_document_values(path, corpus), names)
    _check_has(path, column)
    values = _document_values(path, corpus)
    names = _names(values)
    return names, None if documents is None else _codes(values, names)


def _missing(path: Path | str, column: str, have) -> InputError:
    return InputError(f"{path}: no column {column!r} (corpus.source_column); it has {list(have)}. Set "
                      "corpus.source_column to the column naming each document's source, or to \"\" to use "
                      "the corpus files as sources")


def _parquet_column(path: Path | str, column: str) -> pa.ChunkedArray:
    """Every row's value of `column` in a Parquet file (a path or a URL), that column alone read."""
    remote = is_url(path)
    if remote:
        from climb.io.remote import open_input
    try:
        with open_input(path) if remote else nullcontext(local_path(path)) as src:
            pf = pq.ParquetFile(src, pre_buffer=False) if remote else pq.ParquetFile(src)
            if column not in pf.schema_arrow.names:
                raise _missing(path, column, pf.schema_arrow.names)
            return pf.read(columns=[column]).column(column)
    except (pa.ArrowInvalid, OSError) as e:
        raise InputError(f"{path}: cannot read its {column!r} column (corpus.source_column: {e}); is it a "
                         "complete, uncorrupted Parquet file?") from e


def _check_has(path: Path | str, column: str) -> None:
    """A JSON Lines or Arrow file must have the column (a JSON Lines file: in its first records)."""
    fields, rows, _ = peek(path, [column])
    if rows and column not in fields:
        raise _missing(path, column, fields)


def _document_values(path: Path | str, corpus) -> pa.Array:
    """The source column's value of each document `read_documents` yields from the file."""
    column = corpus.source_column
    out: list = []
    for b in read_documents(path, corpus.text_column, corpus.id_column, [column], corpus.batch_rows):
        out += b.extra[column]
    return pa.array([None if v is None else str(v) for v in out], type=pa.string())


def _as_text(values) -> pa.Array:
    """The values as strings, null as MISSING."""
    arr = values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values
    if not pa.types.is_string(arr.type) and not pa.types.is_large_string(arr.type):
        arr = pc.cast(arr, pa.string())
    return pc.fill_null(arr, MISSING)


def _names(values) -> list[str]:
    return sorted(pc.unique(_as_text(values)).to_pylist())


def _codes(values, names: list[str]) -> np.ndarray:
    """Each value's index in `names` (which holds every one of them)."""
    return pc.index_in(_as_text(values), value_set=pa.array(names, pa.string())).to_numpy(
        zero_copy_only=False).astype(np.int64)
