"""Per-cluster token stores: tokenize a corpus once, then memory-map it for proxy training.

Layout under ``out_dir``::

    parts/{shard}/cluster_00003.bin   raw token ids of the shard's docs in cluster 3 (until merged;
                                      with a cap, at most its first ``cap`` tokens)
    parts/{shard}/doc_tokens.npy      tokens (EOS included) of each of the shard's docs, in order
    parts/{shard}/done.json           shard stats; written last, so its presence means complete
    cluster_00003.bin                 the shards' parts concatenated in the given order (with a cap:
                                      each part's share of the cluster's first ``cap`` tokens)
    index.json                        {dtype, n_clusters, tokens, bytes, docs, cap, stored, shards, ...};
                                      written last

Once the merge is complete the parts' token files are dropped (``drop_merged_parts``):
they would hold every token a second time. A store merged again (a shard added) takes
each dropped part's tokens from the previous merged files, where ``index.json``'s
``shard_tokens`` (capped: ``shard_stored``) locates them; a part found neither way, or
holding less than its share of a capped cluster now (``PartsNeeded``), is tokenized again.

A store may be *capped* (``cap`` tokens per cluster; 0: none): a proxy reads a bounded number of
tokens per cluster, so the store keeps only those. The cluster's tokens are put in one
representative order (``apportion``: shard s's tokens spread evenly over it, shards taking
turns in proportion to their sizes), and a capped cluster file holds the first
min(cap, tokens) of that order: each shard's first ``apportion(...)[s]`` tokens, about
cap * T_sc / T_c of them, concatenated in shard order. The order's prefixes are nested, so
``TokenStore.head(c, n)`` (proxies.token_store, which reads stores) gives the same first n
tokens of a cluster from any store whose cap is at least n, capped or not. ``index.json``'s ``tokens``, ``bytes`` and ``docs`` (and
``doc_tokens.npy``) always count every document in full; ``stored`` is what the files hold.
An index written before caps existed reads as uncapped.

Every document is tokenized with EOS appended, so documents inside a cluster file
are separated by EOS exactly as in the proxies' training stream.  ``bytes`` counts
the UTF-8 bytes of the source text, so bits-per-byte style statistics are possible.

Usage::

    from proxies.tokens import write_shard_tokens, merge_token_stores, TokenStore
    write_shard_tokens(texts, cluster_ids, tok, "runs/x/tokens", "shard-000", cap=10**6)  # per shard
    merge_token_stores("runs/x/tokens", ["shard-000", "shard-001"], n_clusters=64, cap=10**6)
    drop_merged_parts("runs/x/tokens", ["shard-000", "shard-001"])                   # optional
    store = TokenStore("runs/x/tokens"); store.array(3)  # np.memmap of the stored tokens
    store.head(3, 500_000)  # the cluster's first 500,000 tokens of its representative order

Tested by ``pytest tests/test_proxies_data.py tests/test_capped_store.py``.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from .atomic import atomic_path
from .token_store import ClusterReader, Gathered, TokenStore, apportion  # noqa: F401 (re-exported)
from .token_store import cluster_file as _cluster_file
from .tokenizer import encode_arrays

logger = logging.getLogger(__name__)

_ENCODE_BATCH = 1024
# Buffered tokens before appending to the part files, bounding memory per shard.
_FLUSH_TOKENS = 1 << 24


def token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16) if vocab_size <= 65536 else np.dtype(np.uint32)


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
    for key in ("tokens_per_cluster", "bytes_per_cluster", "docs_per_cluster", "stored_per_cluster"):
        if key in stats or key != "stored_per_cluster":
            stats[key] = {int(k): int(v) for k, v in stats.get(key, {}).items()}
    return stats


def _stored(stats: dict) -> dict[int, int]:
    """A part's tokens per cluster in its files (a part written before caps: all of them)."""
    return stats.get("stored_per_cluster", stats["tokens_per_cluster"])


def _covers(stats: dict, cap: int) -> bool:
    """Whether a part holds what a store capped at ``cap`` (0: none) can take from it."""
    stored = _stored(stats)
    return all(stored.get(c, 0) >= (min(n, cap) if cap else n) for c, n in stats["tokens_per_cluster"].items())


def write_shard_tokens(
    texts: Sequence[str],
    clusters: Sequence[int] | np.ndarray,
    tokenizer,
    out_dir: str | Path,
    shard_name: str,
    cap: int = 0,
) -> dict:
    """Tokenize one shard's docs (EOS appended) into per-cluster part files.

    ``cap`` > 0 keeps only the first ``cap`` tokens of each cluster in the part (a capped store
    takes no more from one shard); every document is still counted in full.

    Returns {docs, tokens, tokens_per_cluster, bytes_per_cluster, docs_per_cluster,
    stored_per_cluster, cap, dtype}. If the shard's done.json already exists and its part holds
    what ``cap`` asks, nothing is recomputed and its stats are returned.
    """
    cap = int(cap)
    if cap < 0:
        raise ValueError(f"cap must be >= 0 (0: no cap), got {cap}")
    part_dir = Path(out_dir) / "parts" / shard_name
    done = part_dir / "done.json"
    if done.exists():
        stats = _load_shard_stats(done)
        bad = _bad_parts(part_dir, stats)
        if not bad and _covers(stats, cap):
            logger.info("shard %s already tokenized (%s); skipping", shard_name, done)
            return stats
        # Parts written twice (two writers), cut short, dropped after a merge, or capped below
        # what is asked now: tokenize the shard again.
        logger.warning("shard %s: %s; tokenizing it again", shard_name,
                       f"{bad} is missing or does not match {done}" if bad else f"its part is capped below {cap}")
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
    kept: dict[int, int] = {}  # tokens written to the part: at most cap per cluster
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
            doc_tokens[start + j] = arr.size
            tokens[c] = tokens.get(c, 0) + arr.size
            nbytes[c] = nbytes.get(c, 0) + len(text.encode("utf-8"))
            ndocs[c] = ndocs.get(c, 0) + 1
            have = kept.get(c, 0)
            keep = arr if not cap else arr[: max(0, cap - have)]
            kept[c] = have + keep.size
            if keep.size:
                buffers.setdefault(c, []).append(keep)
                buffered += keep.size
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
        "stored_per_cluster": dict(sorted(kept.items())),
        "cap": cap,
        "dtype": dtype.name,
    }
    _write_json_atomic(done, stats)
    logger.info("shard %s: %d docs, %d tokens in %d clusters", shard_name, stats["docs"], stats["tokens"], len(tokens))
    return stats


def _bad_parts(part_dir: Path, stats: dict) -> str | None:
    """The first part file whose size disagrees with the shard's done.json (None: all agree)."""
    itemsize = np.dtype(stats["dtype"]).itemsize
    for c, n in _stored(stats).items():
        f = _cluster_file(part_dir, c)
        if not f.exists() or f.stat().st_size != n * itemsize:
            return str(f)
    if not (part_dir / "doc_tokens.npy").exists():
        return str(part_dir / "doc_tokens.npy")
    return None


def _bad_merged(out_dir: Path, index: dict) -> str | None:
    """The first merged cluster file whose size disagrees with index.json (None: all agree)."""
    itemsize = np.dtype(index["dtype"]).itemsize
    for c, n in enumerate(index.get("stored", index["tokens"])):
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
    shards' tokens (``shard_tokens``): where each shard's tokens lie in the cluster files (in a
    capped store, the shard's first tokens of the cluster, ``shard_stored``)."""
    out_dir = Path(out_dir)
    index_path = out_dir / "index.json"
    if not store_is_complete(out_dir):
        return {}
    with open(index_path) as f:
        index = json.load(f)
    per = index.get("shard_stored", index.get("shard_tokens"))
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


class PartsNeeded(ValueError):
    """A merge needs tokens that neither a shard's part nor the previous merged files hold (a part
    capped below the store's cap, or one whose share of a capped cluster grew since the last
    merge): tokenize ``shards`` again (write_shard_tokens), then merge."""

    def __init__(self, shards: list[str], detail: str) -> None:
        super().__init__(f"{detail}; re-run write_shard_tokens for shard(s) {shards} and merge again")
        self.shards = shards


def merge_token_stores(out_dir: str | Path, shard_names: Sequence[str], n_clusters: int, cap: int = 0) -> dict:
    """Concatenate shard parts (in ``shard_names`` order) into one file per cluster; a part whose
    token files were dropped is read from the previous merged files (``part_in_store``).

    ``cap`` > 0 keeps min(cap, T_c) tokens of cluster c: each shard's first ``apportion`` share
    of them (about cap * T_sc / T_c), so the file is a representative part of the cluster; the
    index still counts every token. Raises PartsNeeded, before changing anything, where a part
    holds fewer tokens than its share.

    Writes ``index.json`` last and atomically; returns its content. If an index for the
    same shard list, n_clusters and cap already exists, returns it without rewriting.
    """
    out_dir = Path(out_dir)
    shard_names = list(shard_names)
    cap = int(cap)
    if cap < 0:
        raise ValueError(f"cap must be >= 0 (0: no cap), got {cap}")
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
                and int(index.get("cap", 0)) == cap
                and _bad_merged(out_dir, index) is None and (recorded is None or recorded == now)):
            logger.info("token store %s already merged; skipping", out_dir)
            return index
        previous = {s: sl for s, sl in merged_slices(out_dir).items() if part_in_store(out_dir, s)}

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
    # What each shard gives each cluster file, and where it comes from; checked before anything is written.
    take: list[list[int]] = []
    short: dict[str, str] = {}
    for c in range(n_clusters):
        sizes = [st["tokens_per_cluster"].get(c, 0) for st in shard_stats]
        tokens[c] = sum(sizes)
        take.append(apportion(min(cap, tokens[c]) if cap else tokens[c], sizes))
        for name, stats, n in zip(shard_names, shard_stats, take[c]):
            nbytes[c] += stats["bytes_per_cluster"].get(c, 0)
            ndocs[c] += stats["docs_per_cluster"].get(c, 0)
            if n == 0:
                continue
            src = _cluster_file(out_dir / "parts" / name, c)
            have = _stored(stats).get(c, 0)
            if src.exists():
                if src.stat().st_size != have * dtype.itemsize:
                    raise ValueError(
                        f"{src} has {src.stat().st_size} bytes, expected {have * dtype.itemsize}; delete "
                        f"{src.parent} and re-run write_shard_tokens for shard {name}")
            else:
                have = previous.get(name, {}).get(c, (0, 0))[1]
            if have < n and name not in short:
                short[name] = f"shard {name} holds {have} tokens of cluster {c}, its share is {n}"
    if short:
        raise PartsNeeded(sorted(short), "; ".join(short.values()))

    if index_path.exists():
        if previous:  # the old index goes only once the new cluster files are in place
            index_path.replace(index_path.with_name("index.previous.json"))
        else:
            index_path.unlink()  # stale: remove first so a crash below leaves no valid-looking index
    for c in range(n_clusters):
        dst = _cluster_file(out_dir, c)
        old = open(dst, "rb") if dst.exists() and any(c in sl for sl in previous.values()) else None
        try:
            with atomic_path(dst) as tmp, open(tmp, "wb") as out:
                for name, n in zip(shard_names, take[c]):
                    if n == 0:
                        continue
                    src = _cluster_file(out_dir / "parts" / name, c)
                    if not src.exists():  # its tokens are in the previous merge
                        offset, _ = previous[name][c]
                        old.seek(offset * dtype.itemsize)
                        out.write(old.read(n * dtype.itemsize))
                    else:
                        with open(src, "rb") as f:
                            _copy_head(f, out, n * dtype.itemsize)
        finally:
            if old is not None:
                old.close()

    stored = [sum(t) for t in take]
    index = {
        "dtype": dtype.name,
        "n_clusters": n_clusters,
        # every document counted in full, capped or not: the clusters' sizes (shares, epoch caps)
        "tokens": tokens,
        "bytes": nbytes,
        "docs": ndocs,
        "cap": cap,
        "stored": stored,  # tokens in each cluster file: min(cap, tokens)
        "shards": shard_names,
        # each shard's tokens per cluster, in merge order: where they lie when merged again
        "shard_tokens": {name: {str(c): int(v) for c, v in st["tokens_per_cluster"].items() if v}
                         for name, st in zip(shard_names, shard_stats)},
        "shard_signatures": {name: _signature(st) for name, st in zip(shard_names, shard_stats)},
    }
    if cap:  # each shard's tokens in the capped files (uncapped: shard_tokens)
        index["shard_stored"] = {name: {str(c): take[c][i] for c in range(n_clusters) if take[c][i]}
                                 for i, name in enumerate(shard_names)}
    _write_json_atomic(index_path, index)
    index_path.with_name("index.previous.json").unlink(missing_ok=True)
    logger.info("merged %d shards into %s: %d tokens, %d stored%s", len(shard_names), out_dir, sum(tokens),
                sum(stored), f" (cap {cap} a cluster)" if cap else "")
    return index


def _copy_head(src, dst, nbytes: int) -> None:
    """Copy the first ``nbytes`` of ``src`` to ``dst``."""
    while nbytes > 0:
        chunk = src.read(min(nbytes, 1 << 22))
        if not chunk:
            raise ValueError(f"{src.name} ended {nbytes} bytes early")
        dst.write(chunk)
        nbytes -= len(chunk)


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
