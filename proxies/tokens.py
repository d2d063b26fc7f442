"""Per-cluster token stores: tokenize a corpus once, then memory-map it for proxy training.

Layout under ``out_dir``::

    parts/{shard}/cluster_00003.bin   raw token ids of the shard's docs in cluster 3 (until merged)
    parts/{shard}/doc_tokens.npy      tokens (EOS included) of each of the shard's docs, in order
    parts/{shard}/done.json           shard stats; written last, so its presence means complete
    cluster_00003.bin                 all shards' parts concatenated in the given order
    index.json                        {dtype, n_clusters, tokens, bytes, docs, shards}; written last

Once the merge is complete the parts' token files are dropped (``drop_merged_parts``):
they would hold every token a second time. A store merged again (a shard added) takes
each dropped part's tokens from the previous merged files, where ``index.json``'s
``shard_tokens`` locates them; a part found neither way is tokenized again.

Every document is tokenized with EOS appended, so documents inside a cluster file
are separated by EOS exactly as in the proxies' training stream.  ``bytes`` counts
the UTF-8 bytes of the source text, so bits-per-byte style statistics are possible.

Usage::

    from proxies.tokens import write_shard_tokens, merge_token_stores, TokenStore
    write_shard_tokens(texts, cluster_ids, tok, "runs/x/tokens", "shard-000")   # per shard, any process
    merge_token_stores("runs/x/tokens", ["shard-000", "shard-001"], n_clusters=64)
    drop_merged_parts("runs/x/tokens", ["shard-000", "shard-001"])                   # optional
    store = TokenStore("runs/x/tokens"); store.array(3)  # np.memmap

Tested by ``pytest tests/test_proxies_data.py``.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from .atomic import atomic_path
from .tokenizer import encode_arrays

logger = logging.getLogger(__name__)

_ENCODE_BATCH = 1024
# Buffered tokens before appending to the part files, bounding memory per shard.
_FLUSH_TOKENS = 1 << 24


def token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16) if vocab_size <= 65536 else np.dtype(np.uint32)


def _cluster_file(directory: Path, c: int) -> Path:
    return directory / f"cluster_{c:05d}.bin"


def _write_json_atomic(path: Path, obj: dict) -> None:
    with atomic_path(path) as tmp, open(tmp, "w") as f:
        json.dump(obj, f, indent=1)


def _fsync_path(path: Path) -> None:
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def _load_shard_stats(done: Path) -> dict:
    with open(done) as f:
        stats = json.load(f)
    # JSON object keys are strings; callers index by int cluster id.
    for key in ("tokens_per_cluster", "bytes_per_cluster", "docs_per_cluster"):
        stats[key] = {int(k): int(v) for k, v in stats.get(key, {}).items()}
    return stats


def write_shard_tokens(
    texts: Sequence[str],
    clusters: Sequence[int] | np.ndarray,
    tokenizer,
    out_dir: str | Path,
    shard_name: str,
) -> dict:
    """Tokenize one shard's docs (EOS appended) into per-cluster part files.

    Returns {docs, tokens, tokens_per_cluster, bytes_per_cluster, docs_per_cluster, dtype}.
    If the shard's done.json already exists nothing is recomputed and its stats are returned.
    """
    part_dir = Path(out_dir) / "parts" / shard_name
    done = part_dir / "done.json"
    if done.exists():
        stats = _load_shard_stats(done)
        bad = _bad_parts(part_dir, stats)
        if not bad:
            logger.info("shard %s already tokenized (%s); skipping", shard_name, done)
            return stats
        # Parts written twice (two writers), cut short, or dropped after a merge: tokenize the shard again.
        logger.warning("shard %s: %s is missing or does not match %s; tokenizing it again", shard_name, bad, done)
        done.unlink()

    clusters = np.asarray(clusters)
    if len(texts) != len(clusters):
        raise ValueError(
            f"shard {shard_name}: {len(texts)} texts but {len(clusters)} cluster ids; "
            "pass one cluster id per text"
        )
    if len(clusters) and (not np.issubdtype(clusters.dtype, np.integer) or clusters.min() < 0):
        raise ValueError(f"shard {shard_name}: cluster ids must be non-negative integers")
    dtype = token_dtype(tokenizer.vocab_size)
    eos = tokenizer.eos_id

    part_dir.mkdir(parents=True, exist_ok=True)
    # A crashed earlier attempt may have left partial part files; they are appended to below.
    for stale in part_dir.glob("cluster_*.bin"):
        stale.unlink()

    tokens: dict[int, int] = {}
    nbytes: dict[int, int] = {}
    ndocs: dict[int, int] = {}
    buffers: dict[int, list[np.ndarray]] = {}
    buffered = 0
    doc_tokens = np.empty(len(texts), dtype=np.int64)

    def flush() -> None:
        for c, chunks in buffers.items():
            with open(_cluster_file(part_dir, c), "ab") as f:
                np.concatenate(chunks).tofile(f)
        buffers.clear()

    for start in range(0, len(texts), _ENCODE_BATCH):
        batch = [str(t) for t in texts[start : start + _ENCODE_BATCH]]
        encoded = encode_arrays(tokenizer, batch, dtype)
        for j, (text, ids, c) in enumerate(zip(batch, encoded, clusters[start : start + _ENCODE_BATCH])):
            c = int(c)
            arr = np.empty(len(ids) + 1, dtype=dtype)
            arr[:-1] = ids
            arr[-1] = eos
            buffers.setdefault(c, []).append(arr)
            doc_tokens[start + j] = arr.size
            tokens[c] = tokens.get(c, 0) + arr.size
            nbytes[c] = nbytes.get(c, 0) + len(text.encode("utf-8"))
            ndocs[c] = ndocs.get(c, 0) + 1
            buffered += arr.size
        if buffered >= _FLUSH_TOKENS:
            flush()
            buffered = 0
    flush()
    for c in tokens:
        _fsync_path(_cluster_file(part_dir, c))
    # Per-document token counts (EOS included), in input order: export budgets by them.
    np.save(part_dir / "doc_tokens.npy", doc_tokens)

    stats = {
        "docs": int(len(texts)),
        "tokens": int(sum(tokens.values())),
        "tokens_per_cluster": dict(sorted(tokens.items())),
        "bytes_per_cluster": dict(sorted(nbytes.items())),
        "docs_per_cluster": dict(sorted(ndocs.items())),
        "dtype": dtype.name,
    }
    _write_json_atomic(done, stats)
    logger.info("shard %s: %d docs, %d tokens in %d clusters", shard_name, stats["docs"], stats["tokens"], len(tokens))
    return stats


def _bad_parts(part_dir: Path, stats: dict) -> str | None:
    """The first part file whose size disagrees with the shard's done.json (None: all agree)."""
    itemsize = np.dtype(stats["dtype"]).itemsize
    for c, n in stats["tokens_per_cluster"].items():
        f = _cluster_file(part_dir, c)
        if not f.exists() or f.stat().st_size != n * itemsize:
            return str(f)
    if not (part_dir / "doc_tokens.npy").exists():
        return str(part_dir / "doc_tokens.npy")
    return None


def _bad_merged(out_dir: Path, index: dict) -> str | None:
    """The first merged cluster file whose size disagrees with index.json (None: all agree)."""
    itemsize = np.dtype(index["dtype"]).itemsize
    for c, n in enumerate(index["tokens"]):
        f = _cluster_file(out_dir, c)
        if n and (not f.exists() or f.stat().st_size != n * itemsize):
            return str(f)
    return None


def store_is_complete(out_dir: str | Path) -> bool:
    """Whether a merged store exists with every cluster file of the size its index says."""
    index_path = Path(out_dir) / "index.json"
    if not index_path.exists():
        return False
    try:
        with open(index_path) as f:
            index = json.load(f)
    except ValueError:
        return False
    return _bad_merged(Path(out_dir), index) is None


def merged_slices(out_dir: str | Path) -> dict[str, dict[int, tuple[int, int]]]:
    """{shard: {cluster: (offset, tokens)}} of a complete merged store whose index records its
    shards' tokens (``shard_tokens``): where each shard's tokens lie in the cluster files."""
    out_dir = Path(out_dir)
    index_path = out_dir / "index.json"
    if not store_is_complete(out_dir):
        return {}
    with open(index_path) as f:
        index = json.load(f)
    per = index.get("shard_tokens")
    if per is None:
        return {}
    offsets = [0] * index["n_clusters"]
    out: dict[str, dict[int, tuple[int, int]]] = {}
    for name in index["shards"]:
        out[name] = {}
        for c, n in sorted((int(k), int(v)) for k, v in per[name].items()):
            out[name][c] = (offsets[c], n)
            offsets[c] += n
    return out


def _signature(stats: dict) -> list:
    """What identifies a part's content for the merged store: its tokens per cluster, documents and
    the source its writer recorded (a caller's digest of its input; none: the counts alone)."""
    return [sorted([int(c), int(n)] for c, n in stats["tokens_per_cluster"].items() if n), int(stats["docs"]),
            stats.get("source")]


def part_in_store(out_dir: str | Path, shard_name: str) -> bool:
    """Whether a shard's part, its token files dropped, still has its tokens in the merged store
    (the store's record of the shard equals the part's done.json)."""
    out_dir = Path(out_dir)
    done = out_dir / "parts" / shard_name / "done.json"
    if not done.exists() or merged_slices(out_dir).get(shard_name) is None:
        return False
    with open(out_dir / "index.json") as f:
        recorded = (json.load(f).get("shard_signatures") or {}).get(shard_name)
    return recorded == _signature(_load_shard_stats(done))


def merge_token_stores(out_dir: str | Path, shard_names: Sequence[str], n_clusters: int) -> dict:
    """Concatenate shard parts (in ``shard_names`` order) into one file per cluster; a part whose
    token files were dropped is read from the previous merged files (``part_in_store``).

    Writes ``index.json`` last and atomically; returns its content. If an index for the
    same shard list and n_clusters already exists, returns it without rewriting.
    """
    out_dir = Path(out_dir)
    shard_names = list(shard_names)
    index_path = out_dir / "index.json"
    previous: dict[str, dict[int, tuple[int, int]]] = {}
    if index_path.exists():
        with open(index_path) as f:
            index = json.load(f)
        now = {}
        for name in shard_names:
            done = out_dir / "parts" / name / "done.json"
            now[name] = _signature(_load_shard_stats(done)) if done.exists() else None
        recorded = index.get("shard_signatures")
        if (index.get("shards") == shard_names and index.get("n_clusters") == n_clusters
                and _bad_merged(out_dir, index) is None and (recorded is None or recorded == now)):
            logger.info("token store %s already merged; skipping", out_dir)
            return index
        previous = {s: sl for s, sl in merged_slices(out_dir).items() if part_in_store(out_dir, s)}
        if previous:  # the old index goes only once the new cluster files are in place
            stale = index_path.with_name("index.previous.json")
            index_path.replace(stale)
        else:
            index_path.unlink()  # stale: remove first so a crash below leaves no valid-looking index

    shard_stats = []
    for name in shard_names:
        done = out_dir / "parts" / name / "done.json"
        if not done.exists():
            raise FileNotFoundError(
                f"shard {name} is not tokenized ({done} missing); run write_shard_tokens for it first"
            )
        stats = _load_shard_stats(done)
        bad = [c for c in stats["tokens_per_cluster"] if c >= n_clusters]
        if bad:
            raise ValueError(f"shard {name} has cluster ids {bad[:5]} >= n_clusters={n_clusters}")
        shard_stats.append(stats)
    dtypes = {s["dtype"] for s in shard_stats}
    if len(dtypes) > 1:
        raise ValueError(f"shards were tokenized with different dtypes {sorted(dtypes)}; retokenize with one tokenizer")
    dtype = np.dtype(dtypes.pop() if dtypes else "uint16")

    tokens, nbytes, ndocs = [0] * n_clusters, [0] * n_clusters, [0] * n_clusters
    for c in range(n_clusters):
        dst = _cluster_file(out_dir, c)
        old = open(dst, "rb") if dst.exists() and any(c in sl for sl in previous.values()) else None
        try:
            with atomic_path(dst) as tmp, open(tmp, "wb") as out:
                for name, stats in zip(shard_names, shard_stats):
                    n = stats["tokens_per_cluster"].get(c, 0)
                    if n == 0:
                        continue
                    src = _cluster_file(out_dir / "parts" / name, c)
                    if not src.exists() and name in previous:  # its tokens are in the previous merge
                        offset, m = previous[name][c]
                        old.seek(offset * dtype.itemsize)
                        out.write(old.read(m * dtype.itemsize))
                    else:
                        if not src.exists() or src.stat().st_size != n * dtype.itemsize:
                            raise ValueError(
                                f"{src} has {src.stat().st_size if src.exists() else 0} bytes, expected "
                                f"{n * dtype.itemsize}; delete {src.parent} and re-run write_shard_tokens for "
                                f"shard {name}")
                        with open(src, "rb") as f:
                            shutil.copyfileobj(f, out, length=1 << 22)
                    tokens[c] += n
                    nbytes[c] += stats["bytes_per_cluster"].get(c, 0)
                    ndocs[c] += stats["docs_per_cluster"].get(c, 0)
        finally:
            if old is not None:
                old.close()

    index = {
        "dtype": dtype.name,
        "n_clusters": n_clusters,
        "tokens": tokens,
        "bytes": nbytes,
        "docs": ndocs,
        "shards": shard_names,
        # each shard's tokens per cluster, in merge order: where they lie when merged again
        "shard_tokens": {name: {str(c): int(v) for c, v in st["tokens_per_cluster"].items() if v}
                         for name, st in zip(shard_names, shard_stats)},
        "shard_signatures": {name: _signature(st) for name, st in zip(shard_names, shard_stats)},
    }
    _write_json_atomic(index_path, index)
    index_path.with_name("index.previous.json").unlink(missing_ok=True)
    logger.info("merged %d shards into %s: %d tokens", len(shard_names), out_dir, sum(tokens))
    return index


def drop_merged_parts(out_dir: str | Path, shard_names: Sequence[str]) -> int:
    """Delete the shard parts' token files once the merged store is complete; returns the
    bytes freed. ``doc_tokens.npy`` and ``done.json`` stay (the export sizes documents by the
    first). Refuses, deleting nothing, while the merged store is incomplete."""
    out_dir = Path(out_dir)
    if not store_is_complete(out_dir):
        raise RuntimeError(f"{out_dir}: the merged store is not complete; its parts are still needed")
    freed = 0
    for name in shard_names:
        for f in (out_dir / "parts" / name).glob("cluster_*.bin"):
            freed += f.stat().st_size
            f.unlink()
    return freed


class TokenStore:
    """Read-only view of a merged token store; cluster arrays are memory-mapped lazily."""

    def __init__(self, out_dir: str | Path) -> None:
        self.path = Path(out_dir)
        index_path = self.path / "index.json"
        if not index_path.exists():
            raise FileNotFoundError(
                f"{index_path} not found; build the store with write_shard_tokens + merge_token_stores"
            )
        with open(index_path) as f:
            self.index = json.load(f)
        self.dtype = np.dtype(self.index["dtype"])
        self.n_clusters = int(self.index["n_clusters"])
        self.tokens = np.asarray(self.index["tokens"], dtype=np.int64)
        self.bytes = np.asarray(self.index["bytes"], dtype=np.int64)
        self._maps: dict[int, np.ndarray] = {}

    def array(self, c: int) -> np.ndarray:
        """Token ids of cluster c as a read-only np.memmap (an empty array if the cluster is empty)."""
        if not 0 <= c < self.n_clusters:
            raise IndexError(f"cluster {c} out of range [0, {self.n_clusters})")
        if c not in self._maps:
            n = int(self.tokens[c])
            if n == 0:
                # np.memmap cannot map a zero-length file.
                self._maps[c] = np.empty(0, dtype=self.dtype)
            else:
                path = _cluster_file(self.path, c)
                if path.stat().st_size != n * self.dtype.itemsize:
                    raise ValueError(f"{path} size does not match index.json; re-run merge_token_stores")
                self._maps[c] = np.memmap(path, dtype=self.dtype, mode="r", shape=(n,))
        return self._maps[c]

    def reader(self, c: int) -> "ClusterReader":
        """Cluster c's token ids read window by window with pread: what a proxy reads is not mapped
        into it, so its memory does not grow with the pages it has touched (an mmap'ed store counts
        in a process's RSS)."""
        arr = self.array(c)  # checks the cluster and the file's size
        if not len(arr):
            return ClusterReader(None, 0, self.dtype)
        return ClusterReader(_cluster_file(self.path, c), len(arr), self.dtype)

    def doc_tokens(self, shard: str) -> np.ndarray:
        """Token count (EOS included) of each document the shard wrote, in the order given."""
        return np.load(self.path / "parts" / shard / "doc_tokens.npy")

    def token_shares(self) -> np.ndarray:
        """Fraction of all tokens in each cluster (the 'natural' mixture)."""
        total = self.tokens.sum()
        if total == 0:
            raise ValueError(f"token store {self.path} is empty")
        return self.tokens / total

    def __len__(self) -> int:
        return self.n_clusters

    def __repr__(self) -> str:
        return f"TokenStore({str(self.path)!r}, n_clusters={self.n_clusters}, tokens={int(self.tokens.sum())})"


class ClusterReader:
    """A cluster file's tokens as a sliceable sequence (`len`, `[a:b]`), each slice one pread."""

    def __init__(self, path: Path | None, n: int, dtype: np.dtype) -> None:
        self.path, self.n, self.dtype = path, int(n), np.dtype(dtype)
        self._fd: int | None = None

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, key: slice) -> np.ndarray:
        if not isinstance(key, slice) or key.step not in (None, 1):
            raise TypeError("ClusterReader takes contiguous slices only")
        a, b, _ = key.indices(self.n)
        if b <= a:
            return np.empty(0, dtype=self.dtype)
        if self._fd is None:
            self._fd = os.open(self.path, os.O_RDONLY)
        size = self.dtype.itemsize
        data = os.pread(self._fd, (b - a) * size, a * size)
        return np.frombuffer(data, dtype=self.dtype)

    def __getstate__(self):  # a file descriptor does not travel to another process
        return {**self.__dict__, "_fd": None}

    def __del__(self) -> None:
        if getattr(self, "_fd", None) is not None:
            try:
                os.close(self._fd)
            except OSError:
                pass
