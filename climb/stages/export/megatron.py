"""The export for Megatron-LM / NeMo (`export.format = "megatron"` or `"both"`).

Megatron reads its own indexed datasets: a `.bin` of token ids and an `.idx` beside it,
named by their common prefix in `--data-path w1 prefix1 w2 prefix2 ...`. The export
writes one per cluster, `megatron/cluster_XXXXX.{bin,idx}`, with megatron-core's own
builder (`IndexedDatasetBuilder`; PyPI `megatron-core`, the `megatron` extra):

- the ids are those of the trainer's tokenizer (`export.tokenizer`), kept by the pass
  that counted the documents for the budget (`counts/<shard>.ids.npy`): the corpus is
  tokenised once;
- every document is one sequence ending in the tokenizer's end-of-document token
  (`export.eod`, or the first of export_units.EOD_TOKENS it has), as Megatron's
  `preprocess_data.py --append-eod` writes them; a document cut to fit its cluster's
  share keeps its first ids and the end-of-document token;
- the dtype is megatron-core's choice for the vocabulary (`DType.optimal_dtype`: uint16
  below 65,500 ids, else int32);
- each corpus shard writes its part of every cluster (`megatron-parts/`), so a killed
  export resumes shard by shard; once all are written, each cluster's parts are merged
  into one dataset (`add_index`), in shard order, and the parts removed.

`megatron_blend.txt` then names the clusters' prefixes with their weights realised in
the trainer's tokens, ready for `--data-path`.
"""
from __future__ import annotations

import logging
import shutil
from pathlib import Path

import numpy as np

from climb.io.files import InputError, is_url, write_json

log = logging.getLogger(__name__)

FORMATS = ("parquet", "megatron", "both")


def wants(fmt: str, kind: str) -> bool:
    """Whether export.format `fmt` writes `kind` ("parquet" or "megatron")."""
    return fmt == kind or fmt == "both"


def require() -> None:
    """Fail before any stage runs where megatron-core is not installed."""
    try:
        import megatron.core.datasets.indexed_dataset  # noqa: F401
    except ImportError as e:
        raise InputError(f"export.format = \"megatron\" writes with megatron-core's own builder, which cannot be "
                         f"imported ({e}); pip install 'climb[megatron]' (megatron-core)") from None


def dtype_for(vocab_size: int) -> np.dtype:
    """The token dtype megatron-core chooses for a vocabulary of this size."""
    from megatron.core.datasets.indexed_dataset import DType
    return np.dtype(DType.optimal_dtype(vocab_size))


def ids_file(counts_path: Path) -> Path:
    """Where the counting pass keeps a shard's kept documents' ids, one after another."""
    return counts_path.with_name(counts_path.stem + ".ids.npy")


def write_ids(path: Path, arrays: list[np.ndarray], dtype: np.dtype) -> None:
    from climb.io.files import write_npy
    write_npy(path, np.concatenate(arrays).astype(dtype) if arrays else np.zeros(0, dtype))


def doc_ids(counts: np.ndarray, ids: np.ndarray, keep_rows) -> dict[int, np.ndarray]:
    """{row: its ids} for the kept rows asked for; counts are sizes with the end-of-document
    token (0 for pruned rows), the ids those of the kept rows in row order."""
    lengths = np.where(counts > 0, counts - 1, 0)
    ends = np.cumsum(lengths)
    return {int(r): ids[ends[r] - lengths[r]:ends[r]] for r in keep_rows}


def _builder(prefix: Path, dtype: np.dtype):
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder
    prefix.parent.mkdir(parents=True, exist_ok=True)
    return IndexedDatasetBuilder(str(prefix) + ".bin.tmp", dtype=np.dtype(dtype).type)  # it takes a type


def _finish(builder, prefix: Path) -> None:
    builder.finalize(str(prefix) + ".idx.tmp")
    Path(str(prefix) + ".bin.tmp").replace(str(prefix) + ".bin")  # the .bin first: an .idx means both are whole
    Path(str(prefix) + ".idx.tmp").replace(str(prefix) + ".idx")


def write_part(prefix: Path, docs: list[np.ndarray], eod: int, dtype: np.dtype) -> dict:
    """One indexed dataset of these documents, each followed by `eod`; its documents and tokens."""
    b = _builder(prefix, dtype)
    tokens = 0
    for ids in docs:
        seq = np.append(ids, eod).astype(dtype)
        b.add_document(seq, [len(seq)])
        tokens += len(seq)
    _finish(b, prefix)
    return {"documents": len(docs), "tokens": tokens}


def merge(parts: list[Path], prefix: Path, dtype: np.dtype) -> None:
    """The parts, in this order, as one indexed dataset at `prefix`."""
    b = _builder(prefix, dtype)
    for p in parts:
        b.add_index(str(p))
    _finish(b, prefix)


def merge_clusters(parts_dir: Path, out_dir: Path, shards: list[str], done: list[dict], dtype: np.dtype,
                   dest: str | None) -> dict[int, str]:
    """Merge every cluster's per-shard parts (written by the shards in `done`) into
    <out_dir>/megatron/cluster_XXXXX, once (a marker per cluster), upload it to `dest`
    where that is a URL or another folder, remove the parts; {cluster: prefix as the blend
    names it}."""
    by_cluster: dict[int, list[Path]] = {}
    for shard in shards:
        got = next(d for d in done if d["shard"] == shard)
        for c, rel in sorted(got.get("megatron", {}).items(), key=lambda kv: int(kv[0])):
            by_cluster.setdefault(int(c), []).append(parts_dir / rel)
    prefixes = {}
    for c, parts in sorted(by_cluster.items()):
        rel = f"megatron/cluster_{c:05d}"
        local = out_dir / rel
        marker = Path(str(local) + ".done.json")
        if not marker.exists() or not Path(str(local) + ".idx").exists():
            merge(parts, local, dtype)
            write_json(marker, {"cluster": c, "parts": [p.name for p in parts]})
        prefixes[c] = _publish(local, rel, dest) if dest else str(local)
    if parts_dir.exists():
        shutil.rmtree(parts_dir)
    return prefixes


def _publish(local: Path, rel: str, dest: str) -> str:
    """The merged dataset at the destination (each file staged and moved whole); its prefix there."""
    from climb.io.files import join
    for ext in (".bin", ".idx"):  # the .idx last: a reader that finds it finds the .bin whole
        src, target = Path(str(local) + ext), join(dest, rel + ext)
        if is_url(dest):
            from climb.io.remote import write_atomic
            with open(src, "rb") as fh:
                write_atomic(target, lambda out: shutil.copyfileobj(fh, out), staging=dest)
        else:
            Path(target).parent.mkdir(parents=True, exist_ok=True)
            tmp = Path(target + ".tmp")
            shutil.copyfile(src, tmp)
            tmp.replace(target)
    for ext in (".bin", ".idx"):
        Path(str(local) + ext).unlink(missing_ok=True)
    return join(dest, rel)


def blend_text(real_w: np.ndarray, prefixes: dict[int, str]) -> str:
    """`--data-path` for Megatron-LM: each cluster's realised weight and prefix."""
    return " ".join(f"{real_w[c]:.6f} {p}" for c, p in sorted(prefixes.items())) + "\n"


def stats_of(prefixes: dict[int, str], out_dir: Path, dest: str | None) -> dict:
    """Documents, tokens and bytes of the merged datasets, read back with megatron-core's reader
    where they are local."""
    if dest and is_url(dest):
        return {"datasets": len(prefixes)}
    from megatron.core.datasets.indexed_dataset import IndexedDataset
    docs = tokens = size = 0
    for p in prefixes.values():
        ds = IndexedDataset(p)
        docs += len(ds.document_indices) - 1
        tokens += int(ds.sequence_lengths.sum())
        size += Path(p + ".bin").stat().st_size + Path(p + ".idx").stat().st_size
    return {"datasets": len(prefixes), "documents": docs, "tokens": tokens, "bytes": size,
            "bytes_per_token": round(size / tokens, 4) if tokens else None}


def check_ready(units_name: str, fmt: str) -> None:
    """export.format's needs, checked before any stage runs."""
    if not wants(fmt, "megatron"):
        return
    if units_name in ("", "bytes"):
        raise InputError("export.format = \"megatron\" writes your trainer's token ids; set export.tokenizer to its "
                         "tokenizer.json (or a folder or installed model holding one)")
    require()
