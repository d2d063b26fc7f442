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
  into groups (connected components), and each group's first document kept.

Writes, per shard, the `duplicate` (0 none, 1 exact, 2 near) and `duplicate_of` (the
kept document's id) columns of `cluster/assign/<shard>.parquet`; with `dedup.drop` the
duplicates' `cluster` becomes -1 (as a pruned document's: no proxy reads them, the export
skips them) and `duplicate_cluster` keeps theirs. Returns the counts per cluster for
clusters.json.

Built for 10^7 documents and more on one machine:

- memory: of the whole corpus only each document's fine cluster is held (int16 below
  32,767 fine clusters; -1 once pruned or found an exact duplicate) and, per duplicate
  found, its row, kind and kept row (9 bytes; rows int32 below 2^31 documents): at most
  11 bytes a document, no Python object per document. Exact duplicates are found a slice
  of the hash space at a time (EXACT_BUCKET documents a pass, the hashes read from each
  shard's memory-mapped file), near ones a few fine clusters at a time (NEAR_PASS
  documents), and the kept documents' ids looked up MARK_BATCH duplicates at a time (each
  shard's id column read once a batch). The one cost that grows with the corpus over k
  is the fine cluster being searched: its embeddings (a flat index: as float32, 4 x dim
  bytes a document, read BLOCK rows at a time from the mapped shards; inverted lists: as
  stored, 2 x dim bytes under embed.store_dtype = "float16"), with, for
  inverted lists, each document's lists (8 x IVF_PROBE bytes) and the pairs found (at most
  IVF_PROBE x neighbors a document).
- time: a fine cluster of up to NEAR_EXACT_MAX documents is searched exactly (a flat
  index, n^2 comparisons: results as before this bound existed, bit for bit); a larger
  one by inverted lists (`ivf_pairs`: lists of ~IVF_LIST documents from a seeded k-means
  on the cluster's own vectors, IVF_PROBE lists visited a document), so a document costs a
  bounded number of comparisons. The lists are searched one at a time, the documents that
  visit a list against those filed in it as one matrix product: the pairs FAISS's
  IndexIVFFlat search returns, 2.8-3.6x faster (synthetic 50,000 and 156,000). Every pair
  it returns is over the threshold (cosines are computed exactly); it misses some: on a
  69,785-document fine cluster of the scale corpus the same lists held 99.1% of the exact
  search's pairs; on a synthetic 50,000 with planted copies, all of them
  (benchmarks/dedup_near.py). Its output is the same run after run and with 1 or 2
  threads.
- a stop: the near pass keeps each fine cluster's groups as it finds them
  (`cluster/near_kept/`, NearKept) until every shard is marked, so a stage killed in it
  (about 6 minutes at 10^7 documents) searches again only the fine cluster in flight.

    from climb.stages.cluster.dedup import text_hash, near_groups
"""
from __future__ import annotations

import hashlib
import logging
import re
import shutil
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from climb.config import DedupConfig
from climb.io.files import atomic_path, write_parquet

log = logging.getLogger(__name__)
_DROP = re.compile(r"[\W_]+", re.UNICODE)

# A fine cluster up to this size is searched exactly: a flat index, n^2 comparisons at BLAS speed.
# Above it, inverted lists: a document is compared with ~IVF_PROBE x IVF_LIST others (more where
# the lists are uneven: ~3,000 on the scale corpus, ~8,000 on the synthetic cluster), list by
# list at BLAS speed. Searched query by query by FAISS, the lists cost as much as the exact
# search near 12,000 documents (scale corpus, 256-d) to 35,000 (synthetic, 384-d); list by list
# they are faster from about 10,000 (synthetic: 10,000 1.0 s against exact 1.1 s, 20,000 1.9 s
# against 4.4 s; 2 busy cores, benchmarks/dedup_near.py). 20,000 keeps most of the 1M run's
# fine clusters (15,600 on average) exact, as they were. At 156,000 (10^7 documents, k = 64)
# the lists take 17 s on the synthetic cluster, and grow linearly.
NEAR_EXACT_MAX = 20_000
IVF_LIST = 500  # documents an inverted list holds on average
IVF_PROBE = 4  # lists a query visits
IVF_TRAIN = 64  # documents a list that the lists' k-means is fitted on (FAISS warns below 39)
IVF_SEED = 1234  # the lists' k-means and its sample
EXACT_BUCKET = 1 << 20  # documents a pass over the hash space (~70 MB of sort temporaries)
NEAR_PASS = 1 << 21  # documents of the fine clusters one pass over the fine column gathers
NEAR_KEPT = "near_kept"  # cluster/<this>: the near pass, fine cluster by fine cluster, until marked
MARK_BATCH = 1 << 20  # duplicates whose kept documents' ids are looked up at once
BLOCK = 8192  # embeddings added to an index, and queries searched, at a time
QUERY_BLOCK = 4096  # an IVF list's visitors compared with it at a time (4096 x its size floats)


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


def _flat(emb):
    """A flat inner-product index holding `emb` (an array, or _Rows), added a block at a time."""
    import faiss
    first = np.ascontiguousarray(emb[:BLOCK], dtype=np.float32)
    index = faiss.IndexFlatIP(first.shape[1])
    index.add(first)
    for a in range(BLOCK, len(emb), BLOCK):
        index.add(np.ascontiguousarray(emb[a:a + BLOCK], dtype=np.float32))
    return index


def ivf_probes(x: np.ndarray) -> np.ndarray:
    """Each row's IVF_PROBE nearest inverted lists, nearest first (its own list, where it is
    filed, is the first): the centroids of a seeded k-means (FAISS's IVF training, one list per
    IVF_LIST rows) fitted on IVF_TRAIN rows a list."""
    import faiss
    n, d = x.shape
    nlist = max(1, n // IVF_LIST)
    ivf = faiss.IndexIVFFlat(faiss.IndexFlatIP(d), d, nlist, faiss.METRIC_INNER_PRODUCT)
    ivf.cp.seed = IVF_SEED
    sample = np.sort(np.random.default_rng(IVF_SEED).choice(n, min(n, IVF_TRAIN * nlist), replace=False))
    ivf.train(np.ascontiguousarray(x[sample], dtype=np.float32))
    k = min(IVF_PROBE, nlist)
    return np.concatenate([ivf.quantizer.search(np.ascontiguousarray(x[a:a + BLOCK], dtype=np.float32), k)[1]
                           for a in range(0, n, BLOCK)])


def _nearest(q: np.ndarray, o: np.ndarray, s: np.ndarray, neighbors: int):
    """The pairs (q, o, s) cut to each q's `neighbors` most similar o (ties: the smaller o)."""
    order = np.lexsort((o, -s, q))
    q, o, s = q[order], o[order], s[order]
    start = np.flatnonzero(np.r_[True, q[1:] != q[:-1]])
    rank = np.arange(len(q)) - np.repeat(start, np.diff(np.r_[start, len(q)]))
    keep = rank < neighbors
    return q[keep], o[keep], s[keep]


def ivf_pairs(x: np.ndarray, threshold: float, neighbors: int) -> tuple[np.ndarray, np.ndarray]:
    """`x`: the rows, L2-normalised, float32 or float16 (computed in float32 a block at a time).
    The pairs (a, b), a != b, with cosine >= threshold where b is among a's `neighbors` most
    similar rows of the IVF_PROBE lists a visits (what an IndexIVFFlat search returns), found
    list by list: the rows that visit a list against the rows filed in it, as one matrix
    product (BLAS) QUERY_BLOCK queries at a time. The same pairs as FAISS's per-query search at
    about a third of its time (benchmarks/dedup_near.py)."""
    n = len(x)
    probes = ivf_probes(x)
    nlist = int(probes.max()) + 1
    filed = np.argsort(probes[:, 0], kind="stable")
    filed_at = np.r_[0, np.cumsum(np.bincount(probes[:, 0], minlength=nlist))]
    visits = np.argsort(probes.ravel(), kind="stable") // probes.shape[1]  # rows, list by list
    visits_at = np.r_[0, np.cumsum(np.bincount(probes.ravel(), minlength=nlist))]
    rt = _row_type(n)
    qs, os_, ss = [np.zeros(0, rt)], [np.zeros(0, rt)], [np.zeros(0, np.float32)]
    for lst in range(nlist):
        held = filed[filed_at[lst]:filed_at[lst + 1]]
        queries = visits[visits_at[lst]:visits_at[lst + 1]]
        if not len(held) or not len(queries):
            continue
        xh = np.asarray(x[held], dtype=np.float32).T
        for a in range(0, len(queries), QUERY_BLOCK):
            q = queries[a:a + QUERY_BLOCK]
            sims = np.asarray(x[q], dtype=np.float32) @ xh
            r, c = np.nonzero(sims >= threshold)
            keep = q[r] != held[c]
            r, c = r[keep], c[keep]
            if len(r):
                found = _nearest(q[r].astype(rt), held[c].astype(rt), sims[r, c], neighbors)
                for acc, v in zip((qs, os_, ss), found):
                    acc.append(v)
    q, o, _ = _nearest(np.concatenate(qs), np.concatenate(os_), np.concatenate(ss), neighbors)
    return q, o


def near_groups(emb, threshold: float, neighbors: int, exact_max: int = NEAR_EXACT_MAX) -> np.ndarray:
    """For each row of `emb` (L2-normalised, in corpus order; an array or _Rows), the first row
    of its group of near duplicates (cosine >= threshold with a neighbour, transitively),
    itself if none. Exact up to `exact_max` rows, approximate (IVF, `ivf_pairs`) above."""
    n = len(emb)
    if n < 2:
        return np.arange(n)
    if n > exact_max:
        a, b = ivf_pairs(emb.stored() if isinstance(emb, _Rows) else np.asarray(emb), threshold, neighbors)
        return _firsts(n, a, b)
    index = _flat(emb)
    k = min(neighbors + 1, n)
    a_, b_ = [], []
    for a in range(0, n, BLOCK):  # queries in blocks: results stay block x k
        sims, nbrs = index.search(np.ascontiguousarray(emb[a:a + BLOCK], dtype=np.float32), k)
        rows, cols = np.nonzero((sims >= threshold) & (nbrs >= 0))
        other = nbrs[rows, cols]
        keep = other != rows + a
        a_.append(rows[keep] + a)
        b_.append(other[keep])
    return _firsts(n, np.concatenate(a_), np.concatenate(b_))


def _firsts(n: int, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Each row's group's first row, the pairs (a, b) joining rows: the smallest row of its
    connected component (what union-find keeping the earlier row as the root gives)."""
    if not len(a):
        return np.arange(n)
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components
    _, label = connected_components(coo_matrix((np.ones(len(a), np.int8), (a, b)), shape=(n, n)), directed=False)
    _, first = np.unique(label, return_index=True)  # a component's first occurrence: its smallest row
    return first[label]


def _row_type(n: int):
    return np.int32 if n < 2**31 else np.int64


def _exact(fine: np.ndarray, offsets: np.ndarray, hashes):
    """(rows, their first's rows) of the exact duplicates among the rows whose fine >= 0, one
    slice of the hash space (its top bits) at a time: a duplicate shares its first's hash."""
    n = int(offsets[-1])
    bits = int(np.ceil(np.log2(n / EXACT_BUCKET))) if n > EXACT_BUCKET else 0
    for bucket in range(1 << bits):
        rows, hs = [], []
        for s in range(len(offsets) - 1):
            h = hashes(s)
            sel = fine[offsets[s]:offsets[s + 1]] >= 0
            if bits:
                sel &= (h.view(np.uint64) >> np.uint64(64 - bits)) == bucket
            local = np.flatnonzero(sel)
            rows.append(local + offsets[s])
            hs.append(np.asarray(h[local]))
        rows = np.concatenate(rows)
        first = exact_firsts(np.concatenate(hs), np.ones(len(rows), bool))
        dup = first >= 0
        yield rows[dup], rows[first[dup]]


def _fine_clusters(fine: np.ndarray, offsets: np.ndarray):
    """Each fine cluster's rows (fine >= 0) in corpus order, gathered NEAR_PASS documents of
    consecutive fine clusters a pass over `fine`, shard by shard."""
    spans = list(zip(offsets[:-1], offsets[1:]))
    k = int(fine.max()) + 1 if len(fine) else 0
    size = np.zeros(k, np.int64)
    for a, b in spans:
        f = fine[a:b]
        size += np.bincount(f[f >= 0], minlength=k)
    ends = np.r_[0, np.cumsum(size)]
    f0 = 0
    while f0 < k:
        f1 = max(f0 + 1, int(np.searchsorted(ends, ends[f0] + NEAR_PASS, "right")) - 1)
        rows = np.concatenate([np.flatnonzero((fine[a:b] >= f0) & (fine[a:b] < f1)) + a for a, b in spans])
        if not len(rows):
            f0 = f1
            continue
        sub = fine[rows]
        order = np.argsort(sub, kind="stable")  # by fine cluster, then corpus order
        rows, sub = rows[order], sub[order]
        bounds = np.flatnonzero(np.r_[True, sub[1:] != sub[:-1], True])
        for a, b in zip(bounds[:-1], bounds[1:]):
            yield rows[a:b]
        f0 = f1


def _gather(rows: np.ndarray, offsets: np.ndarray, embeddings, stored: bool = False) -> np.ndarray:
    """The embeddings of these (sorted) rows as float32 (or as stored: float16 or float32),
    read shard by shard."""
    cut = np.searchsorted(rows, offsets)
    out = None
    for s in np.flatnonzero(cut[1:] > cut[:-1]):
        e = embeddings(s)
        if out is None:
            out = np.empty((len(rows), e.shape[1]), e.dtype if stored and e.dtype == np.float16 else np.float32)
        out[cut[s]:cut[s + 1]] = e[rows[cut[s]:cut[s + 1]] - offsets[s]]
    return out


class _Rows:
    """A fine cluster's embeddings, read from the shards' mapped files a block (or a sample)
    at a time: its index holds the one copy of them in memory."""

    def __init__(self, rows: np.ndarray, offsets: np.ndarray, embeddings):
        self.rows, self.offsets, self.embeddings = rows, offsets, embeddings

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, which) -> np.ndarray:  # a slice or sorted positions
        return _gather(self.rows[which], self.offsets, self.embeddings)

    def stored(self) -> np.ndarray:
        """All of them in the shards' dtype (half the memory where they are stored as float16)."""
        return _gather(self.rows, self.offsets, self.embeddings, stored=True)


class NearKept:
    """The near pass's groups kept fine cluster by fine cluster in `folder`, so that a pass
    stopped part-way (at 10^7 documents it is minutes) resumes at the fine cluster in flight.
    Each file holds a fine cluster's duplicates (their positions in it and their kept rows)
    under a key of its rows and `base` (the settings and the embeddings' digests): a file
    whose key does not match is computed again, never reused."""

    def __init__(self, folder, base: str):
        self.folder, self.base = Path(folder), base

    def _key(self, rows: np.ndarray) -> str:
        return hashlib.blake2b(self.base.encode() + rows.tobytes(), digest_size=12).hexdigest()

    def _path(self, rows: np.ndarray):
        return self.folder / f"{int(rows[0]):012d}.npz"  # a fine cluster's first row names it

    def get(self, rows: np.ndarray) -> np.ndarray | None:
        """The kept row of each of `rows` (its own where it is kept), if this pass found it before."""
        path = self._path(rows)
        if not path.exists():
            return None
        try:
            with np.load(path) as z:
                if str(z["key"]) != self._key(rows):
                    return None
                first = rows.copy()
                first[z["at"]] = z["first"]
                return first
        except (OSError, ValueError, KeyError):
            return None

    def put(self, rows: np.ndarray, first: np.ndarray) -> None:
        at = np.flatnonzero(first != rows)
        with atomic_path(self._path(rows)) as tmp, open(tmp, "wb") as fh:
            np.savez(fh, key=np.array(self._key(rows)), at=at.astype(np.int32), first=first[at])


def find_duplicates(dcfg: DedupConfig, fine: np.ndarray, offsets: np.ndarray, hashes,
                    embeddings, kept: NearKept | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The duplicates, sorted by row: (rows, kind: 1 exact / 2 near, of: the kept one's row),
    rows counted over the whole corpus in order (shard s's rows start at offsets[s]).

    `fine` is each row's fine cluster, -1 where pruned (never a duplicate nor kept for one);
    exact duplicates become -1 in it (the near search leaves them out). `hashes(s)` and
    `embeddings(s)` map shard s's text hashes and embeddings. With `kept`, each fine cluster's
    near groups are kept as found and read back, not searched again, by a later call."""
    rt = _row_type(int(offsets[-1]))
    rows, kinds, ofs = [np.zeros(0, rt)], [np.zeros(0, np.int8)], [np.zeros(0, rt)]

    def found(r, o, kind):
        rows.append(r.astype(rt))
        ofs.append(o.astype(rt))
        kinds.append(np.full(len(r), kind, np.int8))
    if dcfg.exact:
        for r, o in _exact(fine, offsets, hashes):
            found(r, o, 1)
            fine[r] = -1
    if dcfg.threshold > 0:
        t0, clusters, resumed = time.time(), 0, 0
        for f_rows in _fine_clusters(fine, offsets):
            clusters += 1
            if len(f_rows) < 2:
                continue
            first = kept.get(f_rows) if kept is not None else None
            if first is None:
                first = f_rows[near_groups(_Rows(f_rows, offsets, embeddings), dcfg.threshold, dcfg.neighbors)]
                if kept is not None:
                    kept.put(f_rows, first)
            else:
                resumed += 1
            dup = first != f_rows
            found(f_rows[dup], first[dup], 2)
        log.info("dedup: near duplicates over %d fine clusters in %.1fs%s", clusters, time.time() - t0,
                 f" ({resumed} found before the stage stopped, read back)" if resumed else "")
    r = np.concatenate(rows)
    order = np.argsort(r, kind="stable")
    return r[order], np.concatenate(kinds)[order], np.concatenate(ofs)[order]


def ids_of(of: np.ndarray, offsets: np.ndarray, ids) -> pa.Array:
    """The ids of rows `of` (global), each shard's id column (`ids(s)`) read once."""
    src = np.searchsorted(offsets, of, side="right") - 1
    order = np.argsort(src, kind="stable")
    by = src[order]
    parts = [pa.array([], pa.string())]
    for s in np.unique(by):
        a, b = np.searchsorted(by, [s, s + 1])
        parts.append(ids(s).take(pa.array(of[order[a:b]] - offsets[s])))
    back = np.empty(len(order), np.int64)
    back[order] = np.arange(len(order))
    return pa.concat_arrays(parts).take(pa.array(back))


def restored_cluster(t: pa.Table) -> np.ndarray:
    """A shard's clusters as they were before any drop (a dropped one's is in `duplicate_cluster`)."""
    cluster = t["cluster"].to_numpy()
    if "duplicate_cluster" in t.column_names:
        before = t["duplicate_cluster"].to_numpy()
        cluster = np.where(before >= 0, before, cluster)
    return cluster


def mark(path, kind: np.ndarray, dup_of: pa.Array, drop: bool) -> np.ndarray:
    """Add the duplicate columns to a shard's assignment file (and with `drop` take the
    duplicates out of their cluster), rewriting it only where that changes it; `dup_of`: the
    kept document's id per row ("" where none). Returns the shard's clusters before the drop."""
    t = pq.read_table(path)
    cluster = restored_cluster(t)
    base = t.drop_columns([c for c in ("duplicate", "duplicate_of", "duplicate_cluster") if c in t.column_names])
    cols = {name: base[name] for name in base.column_names}
    cols["cluster"] = pa.array(np.where(drop & (kind > 0), -1, cluster).astype(np.int32), pa.int32())
    cols["duplicate"] = pa.array(kind, pa.int8())
    cols["duplicate_of"] = dup_of.cast(pa.string())
    cols["duplicate_cluster"] = pa.array(np.where(kind > 0, cluster, -1).astype(np.int32), pa.int32())
    new = pa.table(cols)
    if not new.equals(t):
        write_parquet(path, new)
    return cluster


def counts(kind: np.ndarray, cluster: np.ndarray, nbytes: np.ndarray, n_clusters: int) -> dict:
    """Per cluster (one shard's): documents, exact and near duplicates, bytes before and after."""
    live = cluster >= 0
    c, k, b = cluster[live], kind[live], nbytes[live].astype(np.int64)
    out = {"docs": np.bincount(c, minlength=n_clusters),
           "exact": np.bincount(c[k == 1], minlength=n_clusters),
           "near": np.bincount(c[k == 2], minlength=n_clusters),
           "bytes": np.bincount(c, weights=b, minlength=n_clusters),
           "bytes_distinct": np.bincount(c[k == 0], weights=b[k == 0], minlength=n_clusters)}
    return {name: v.astype(np.int64) for name, v in out.items()}


def dedup(dcfg: DedupConfig, paths, names: list[str], k: int, n_clusters: int) -> dict:
    """Find the duplicates of a run's clustered corpus (`k` fine clusters), mark them in its
    assignment files; their counts per cluster (lists, for clusters.json)."""
    from climb.stages.embed import load_embeddings, load_ids
    out = paths.cluster
    sizes = [pq.read_metadata(out.assignments(s)).num_rows for s in names]
    offsets = np.r_[0, np.cumsum(sizes)].astype(np.int64)
    fine = np.empty(int(offsets[-1]), np.int16 if k < 2**15 - 1 else np.int32)
    for s, name in enumerate(names):
        path = out.assignments(name)
        have = pq.read_schema(path).names
        t = pq.read_table(path, columns=[c for c in ("fine", "cluster", "duplicate_cluster") if c in have])
        fine[offsets[s]:offsets[s + 1]] = np.where(restored_cluster(t) >= 0, t["fine"].to_numpy(), -1)
    # The near pass is kept as it goes (NearKept) until every shard is marked: the embeddings
    # (their digests) and the settings key it, the rows of each fine cluster key each file.
    from climb.runtime.stage import output_digest
    base = repr((dcfg.threshold, dcfg.neighbors, NEAR_EXACT_MAX,
                 [output_digest(paths, "embed", f"{s}.npy") for s in names]))
    near = NearKept(out.dir / NEAR_KEPT, base)
    found = find_duplicates(dcfg, fine, offsets, lambda s: np.load(out.text_hashes(names[s]), mmap_mode="r"),
                            lambda s: load_embeddings(paths, [names[s]])[0], near)
    del fine
    rows, kind, of = found
    cut = np.searchsorted(rows, offsets)  # shard s's duplicates: cut[s]:cut[s + 1]
    total: dict = {}
    s = 0
    while s < len(names):
        e = s + 1  # shards s..e-1: at most MARK_BATCH duplicates (or one shard)
        while e < len(names) and cut[e + 1] - cut[s] <= MARK_BATCH:
            e += 1
        ids = ids_of(of[cut[s]:cut[e]], offsets,
                     lambda t: pq.read_table(out.assignments(names[t]), columns=["id"])["id"].combine_chunks())
        for i in range(s, e):
            local = rows[cut[i]:cut[i + 1]] - offsets[i]
            shard_kind = np.zeros(sizes[i], np.int8)
            shard_kind[local] = kind[cut[i]:cut[i + 1]]
            where = np.full(sizes[i], cut[i + 1] - cut[i], np.int64)  # past the end: ""
            where[local] = np.arange(len(local))
            dup_of = pa.concat_arrays([ids.slice(cut[i] - cut[s], cut[i + 1] - cut[i]), pa.array([""], pa.string())])
            cluster = mark(out.assignments(names[i]), shard_kind, dup_of.take(pa.array(where)), dcfg.drop)
            part = counts(shard_kind, cluster, load_ids(paths, names[i])["bytes"].to_numpy(), n_clusters)
            total = {name: total.get(name, 0) + v for name, v in part.items()}
        s = e
    shutil.rmtree(near.folder, ignore_errors=True)  # every shard marked: the pass is in the files
    return {name: v.tolist() for name, v in total.items()}
