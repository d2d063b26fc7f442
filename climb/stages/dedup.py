"""Duplicates in a clustered corpus: exact and near, found after the clusters are (`[dedup]`).

Web text repeats itself; counted as distinct tokens, a cluster of boilerplate looks
large, its epoch cap is loose, and a search is steered by how often a text was copied.
This finds, in corpus order (shard by shard, row by row; the first of each group stays):

- **exact** duplicates: the same text once lower-cased and stripped of punctuation and
  spacing (`text_hash`, 8 bytes of BLAKE2b, computed when the cluster stage reads the text);
- **near** duplicates (SemDeDup, Abbas et al. 2023): within each fine k-means cluster, the
  documents whose embeddings have a cosine of at least `dedup.threshold` with another's.
  Each document's `dedup.neighbors` nearest in its fine cluster are found with FAISS
  (inner product on the L2-normalised embeddings), the pairs over the threshold joined
  into groups (union-find), and each group's first document kept. One fine cluster's
  embeddings are in memory at a time, and each search holds n x neighbors results.

Writes, per shard, the `duplicate` (0 none, 1 exact, 2 near) and `duplicate_of` (the
kept document's id) columns of `cluster/assign/<shard>.parquet`; with `dedup.drop` the
duplicates' `cluster` becomes -1 (as a pruned document's: no proxy reads them, the export
skips them) and `duplicate_cluster` keeps theirs. Returns the counts per cluster for
clusters.json.

    from climb.stages.dedup import text_hash, near_groups
"""
from __future__ import annotations

import hashlib
import logging
import re
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from climb.config import DedupConfig
from climb.io.files import write_parquet

log = logging.getLogger(__name__)
_DROP = re.compile(r"[\W_]+", re.UNICODE)


def normalise(text: str) -> str:
    """The text an exact duplicate shares: lower-cased, every run of non-word characters gone."""
    return _DROP.sub("", text.lower())


def text_hash(text: str) -> int:
    """8 bytes of BLAKE2b of the normalised text, as a signed int64."""
    return int.from_bytes(hashlib.blake2b(normalise(text).encode("utf-8"), digest_size=8).digest(), "little",
                          signed=True)


def exact_firsts(hashes: np.ndarray, kept: np.ndarray) -> np.ndarray:
    """For each document (in corpus order), the index of the first kept document with its hash,
    or -1 where it is that first one (or not kept)."""
    out = np.full(len(hashes), -1, dtype=np.int64)
    idx = np.flatnonzero(kept)
    if not len(idx):
        return out
    h = hashes[idx]
    order = np.argsort(h, kind="stable")  # stable: within a hash, corpus order
    hs = h[order]
    starts = np.r_[True, hs[1:] != hs[:-1]]
    first = idx[order][np.maximum.accumulate(np.where(starts, np.arange(len(hs)), 0))]
    dup = ~starts
    out[idx[order][dup]] = first[dup]
    return out


def near_groups(emb: np.ndarray, threshold: float, neighbors: int) -> np.ndarray:
    """For each row of `emb` (L2-normalised, in corpus order), the first row of its group of
    near duplicates (cosine >= threshold with a neighbour, transitively), itself if none."""
    import faiss
    n = len(emb)
    parent = np.arange(n)

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i
    if n < 2:
        return parent
    x = np.ascontiguousarray(emb, dtype=np.float32)
    index = faiss.IndexFlatIP(x.shape[1])
    index.add(x)
    k = min(neighbors + 1, n)
    for a in range(0, n, 8192):  # queries in blocks: results stay block x k
        sims, nbrs = index.search(x[a:a + 8192], k)
        rows, cols = np.nonzero((sims >= threshold) & (nbrs >= 0))
        for r, c in zip(rows + a, nbrs[rows, cols]):
            if r != c:
                ra, rb = find(int(r)), find(int(c))
                if ra != rb:
                    parent[max(ra, rb)] = min(ra, rb)  # the earlier document is the group's
    return np.array([find(i) for i in range(n)])


def find_duplicates(dcfg: DedupConfig, shards: list[str], clusters: list[np.ndarray], fines: list[np.ndarray],
                    hashes: list[np.ndarray], embeddings) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per shard: (kind: 0/1/2 per row, duplicate_of: the global row of the kept one or -1).

    `clusters` and `fines` give each row's cluster (-1: pruned, never a duplicate nor kept
    for one) and fine cluster; `embeddings(shard)` maps a shard's embedding array."""
    sizes = [len(c) for c in clusters]
    offsets = np.r_[0, np.cumsum(sizes)]
    kept = np.concatenate(clusters) >= 0
    kind = np.zeros(len(kept), dtype=np.int8)
    of = np.full(len(kept), -1, dtype=np.int64)
    if dcfg.exact:
        firsts = exact_firsts(np.concatenate(hashes), kept)
        kind[firsts >= 0], of[firsts >= 0] = 1, firsts[firsts >= 0]
    if dcfg.threshold > 0:
        t0 = time.time()
        fine = np.concatenate(fines)
        live = np.flatnonzero(kept & (kind == 0))
        order = live[np.argsort(fine[live], kind="stable")]  # by fine cluster, then corpus order
        f = fine[order]
        bounds = np.flatnonzero(np.r_[True, f[1:] != f[:-1], True]) if len(order) else np.array([0])
        for a, b in zip(bounds[:-1], bounds[1:]):
            rows = order[a:b]
            if len(rows) < 2:
                continue
            cut = np.searchsorted(rows, offsets)
            emb = np.concatenate([np.asarray(embeddings(shards[s])[rows[cut[s]:cut[s + 1]] - offsets[s]], np.float32)
                                  for s in range(len(shards)) if cut[s + 1] > cut[s]])
            first = rows[near_groups(emb, dcfg.threshold, dcfg.neighbors)]
            dup = first != rows
            kind[rows[dup]], of[rows[dup]] = 2, first[dup]
        log.info("dedup: near duplicates over %d fine clusters in %.1fs", len(bounds) - 1, time.time() - t0)
    return [(kind[offsets[s]:offsets[s + 1]], of[offsets[s]:offsets[s + 1]]) for s in range(len(shards))]


def mark(path, kind: np.ndarray, dup_of_ids: list[str], drop: bool) -> None:
    """Add the duplicate columns to a shard's assignment file (and with `drop` take the
    duplicates out of their cluster), rewriting it only where that changes it."""
    t = pq.read_table(path)
    base = t.drop_columns([c for c in ("duplicate", "duplicate_of", "duplicate_cluster") if c in t.column_names])
    cluster = base["cluster"].to_numpy()
    if "duplicate_cluster" in t.column_names:  # a drop done before: the cluster it took them from
        before = t["duplicate_cluster"].to_numpy()
        cluster = np.where(before >= 0, before, cluster)
    cols = {name: base[name] for name in base.column_names}
    cols["cluster"] = pa.array(np.where(drop & (kind > 0), -1, cluster).astype(np.int32), pa.int32())
    cols["duplicate"] = pa.array(kind, pa.int8())
    cols["duplicate_of"] = pa.array(dup_of_ids, pa.string())
    cols["duplicate_cluster"] = pa.array(np.where(kind > 0, cluster, -1).astype(np.int32), pa.int32())
    new = pa.table(cols)
    if new.equals(t):
        return
    write_parquet(path, new)


def counts(kind: list[np.ndarray], cluster: list[np.ndarray], nbytes: list[np.ndarray], n_clusters: int) -> dict:
    """Per cluster: documents, exact and near duplicates, bytes before and after."""
    k = np.concatenate(kind)
    c = np.concatenate(cluster)
    b = np.concatenate(nbytes).astype(np.int64)
    live = c >= 0
    out = {"docs": np.bincount(c[live], minlength=n_clusters),
           "exact": np.bincount(c[live & (k == 1)], minlength=n_clusters),
           "near": np.bincount(c[live & (k == 2)], minlength=n_clusters),
           "bytes": np.bincount(c[live], weights=b[live], minlength=n_clusters),
           "bytes_distinct": np.bincount(c[live & (k == 0)], weights=b[live & (k == 0)], minlength=n_clusters)}
    return {name: v.astype(np.int64).tolist() for name, v in out.items()}
