"""The export's plan: how many copies of each document to write, and which to cut,
planned one corpus shard at a time.

Documents are chosen per cluster in proportion to the final weights up to a token
budget, counted in `export.tokenizer`'s unit (climb.stages.export.units). A cluster's
quota is `round(min(weight * budget, search.epoch_cap * its tokens))`; with `full, rest =
divmod(quota, its tokens)`, every document of the cluster is taken `full` times (whole
epochs: without replacement until the cluster runs dry, then again, up to the cap) and a
last, partial epoch takes `rest` tokens more. The partial epoch visits the cluster's
documents in one seeded order, that of `doc_keys`: a hash of (`export.seed`, document id),
ties broken by corpus position. It takes the longest prefix of that order that fits in
`rest` whole; the document that would cross it (the *crossing* document) is cut to fit
(`export.long_docs = "truncate"`; a cut keeps at least one token besides its EOS), or
passed over ("skip"): then the documents after it are visited in the same order and each
is taken that fits in what is still left, until nothing is left. No cluster exceeds its
share whatever the document lengths, and repeats are even: no document is taken k+1 times
while another of its cluster is taken fewer than k times.

Each document's place in the order is its own (its key), so the rule is decided shard by
shard, in memory O(one shard + clusters x (bins + GATHER)) however large the corpus:

1. one pass sums each cluster's documents and tokens (its quota follows) and a histogram
   of its tokens over the top bits of the key (`CELLS` cells in all);
2. the crossing document lies in the bin where the cumulative tokens pass `rest`; further
   passes split that bin's key range (histograms again) until it holds at most `GATHER`
   documents, which one more pass gathers to find the crossing document exactly;
3. "skip" only: rounds of one pass each gather the next `GATHER` documents after it (in
   key order) no longer than what is left, and visit them; the documents taken are kept
   as runs (a key range and a size limit: at most one per document passed over);
4. a last pass decides each shard's rows from its own documents and that per-cluster
   state (`emit`), and counts what was taken.

`plan_shards` is the planner; `select` is it over arrays held in memory, as one shard
(tests, small corpora); `_plan` applies it to a run, writing each shard's part of the
plan to `export/plan/` (a document the token store left out, `target.decontaminate`, is
not kept). Three passes over the shards' sizes, ids and clusters, more for a cluster over
`GATHER` x bins documents (one per factor of bins) or for "skip".
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa

from climb.config import RunConfig, digest
from climb.io.files import InputError, read_json, write_npy
from climb.runtime.stage import upstream_key
from climb.runtime.layout import RunPaths
from climb.stages.export import units as export_units
from climb.stages.cluster import load_assignments

GATHER = 4096  # documents per cluster held at once: the crossing's key range, or a "skip" round
CELLS = 1 << 20  # histogram cells (clusters x bins) per pass: 16 bytes each, 16 MB at most
MAX_BITS = 12  # a histogram splits a key range into at most 2**12 bins
ORDER = "doc_keys: fnv1a64 + splitmix64 of (seed, id)"  # part of the export's key: another order, another plan

_HIST, _GATHER, _TAIL, _DONE = 1, 2, 3, 0
_U64 = np.uint64
_PRIME, _BASIS, _MASK = _U64(0x100000001B3), _U64(0xCBF29CE484222325), (1 << 64) - 1

Reader = Callable[[int], tuple[np.ndarray, np.ndarray, np.ndarray]]


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser: every bit of x moves every bit of the result."""
    x = x + _U64(0x9E3779B97F4A7C15)
    x = (x ^ (x >> _U64(30))) * _U64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> _U64(27))) * _U64(0x94D049BB133111EB)
    return x ^ (x >> _U64(31))


def doc_keys(ids, seed: int) -> np.ndarray:
    """Each document's place in its cluster's seeded order (uint64, smallest first): FNV-1a
    over the id's UTF-8 bytes from a seeded basis, then mixed. A function of (seed, id)
    alone, so the same on any machine, in any shard, whatever else the corpus holds.
    `ids`: strings (a pyarrow array, or any sequence)."""
    arr = ids if isinstance(ids, (pa.Array, pa.ChunkedArray)) else pa.array(list(ids), type=pa.large_string())
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    if arr.null_count:
        raise InputError("document ids must not be null: the export orders documents by a hash of their ids")
    arr = arr.cast(pa.large_string())
    n = len(arr)
    if n == 0:
        return np.zeros(0, np.uint64)
    _, offsets_buf, data_buf = arr.buffers()
    offsets = np.frombuffer(offsets_buf, np.int64)[arr.offset:arr.offset + n + 1]
    data = np.frombuffer(data_buf, np.uint8) if data_buf is not None else np.zeros(0, np.uint8)
    lengths = np.diff(offsets)
    order = np.argsort(-lengths, kind="stable")  # longest first: byte j is a prefix of the rows
    starts, desc = offsets[:-1][order], lengths[order]
    h = np.full(n, _mix(np.array([seed & _MASK], np.uint64))[0] ^ _BASIS, np.uint64)
    for j in range(int(desc[0])):
        m = int(np.searchsorted(-desc, -j, side="left"))  # the ids longer than j bytes
        h[:m] = (h[:m] ^ data[starts[:m] + j]) * _PRIME
    keys = np.empty(n, np.uint64)
    keys[order] = _mix(h ^ desc.astype(np.uint64))
    return keys


def budget_for(weights: np.ndarray, cluster_tokens: np.ndarray, cap: float, budget: int) -> int:
    if budget:
        return int(budget)
    pos = weights > 0
    return int(np.floor(np.min(cap * cluster_tokens[pos] / weights[pos])))


def _before(key, pos, k, p):
    """(key, pos) < (k, p), elementwise: the order the partial epoch visits documents in."""
    return (key < k) | ((key == k) & (pos < p))


def _by_cluster(c: np.ndarray, key: np.ndarray, pos: np.ndarray, tok: np.ndarray):
    """Documents sorted by cluster, then (key, position)."""
    o = np.lexsort((pos, key, c))
    return c[o], key[o], pos[o], tok[o]


def _smallest(c: np.ndarray, key: np.ndarray, pos: np.ndarray, tok: np.ndarray, n: int):
    """The first `n` of each cluster's documents in (key, position) order, sorted by cluster then that."""
    c, key, pos, tok = _by_cluster(c, key, pos, tok)
    first = np.r_[0, np.flatnonzero(np.diff(c)) + 1] if len(c) else np.zeros(0, np.int64)
    rank = np.arange(len(c)) - np.repeat(first, np.diff(np.r_[first, len(c)]))
    keep = rank < n
    return c[keep], key[keep], pos[keep], tok[keep]


class _Planner:
    """The per-cluster state of one plan, and the passes that fill it (see the module's docstring)."""

    def __init__(self, read: Reader, n_shards: int, weights: np.ndarray, budget: int, cap: float, long_docs: str,
                 bits: int, gather: int) -> None:
        if long_docs not in ("truncate", "skip"):
            raise ValueError(f"long_docs must be 'truncate' or 'skip', not {long_docs!r}")
        self.read, self.n, self.w, self.cap, self.long_docs = read, n_shards, weights, cap, long_docs
        self.budget = budget  # 0 until the first pass has the clusters' tokens: see _quotas
        k = self.k = len(weights)
        self.bits = bits or max(1, min(MAX_BITS, (CELLS // max(k, 1)).bit_length() - 1))
        self.gather = gather
        self.offsets = np.zeros(n_shards + 1, np.int64)  # corpus position of each shard's first row
        self.sized = False  # the offsets are known (after the first pass)
        self.have, self.count = np.zeros(k, np.int64), np.zeros(k, np.int64)
        self.full, self.rest, self.goal = np.zeros(k, np.int64), np.zeros(k, np.int64), np.zeros(k, np.int64)
        self.phase = np.full(k, _HIST, np.int8)
        # The key range [lo, lo + 2**width) the crossing document lies in, and the tokens before it.
        self.lo, self.width, self.before = np.zeros(k, np.uint64), np.full(k, 64, np.int64), np.zeros(k, np.int64)
        # The crossing document (has_thr: the cluster has a partial epoch) and what a cut of it keeps.
        self.has_thr = np.zeros(k, bool)
        self.thr_key, self.thr_pos, self.cut_keep = np.zeros(k, np.uint64), np.zeros(k, np.int64), np.zeros(k, np.int64)
        # "skip": where the next round starts (after), what is left, and the runs taken so far.
        self.tail_key, self.tail_pos, self.left = np.zeros(k, np.uint64), np.zeros(k, np.int64), np.zeros(k, np.int64)
        self.runs: dict[int, list[tuple]] = {}

    def _shard(self, i: int):
        c, t, key = self.read(i)
        c, t, key = np.asarray(c, np.int64), np.asarray(t, np.int64), np.asarray(key, np.uint64)
        if not len(c) == len(t) == len(key):
            raise ValueError(f"shard {i}: {len(c)} clusters, {len(t)} sizes and {len(key)} keys")
        if self.sized and self.offsets[i + 1] - self.offsets[i] != len(c):
            raise ValueError(f"shard {i} has {len(c)} documents, {self.offsets[i + 1] - self.offsets[i]} in the "
                             "plan's first pass: its inputs changed while the export was planned")
        kept = (c >= 0) & (c < self.k)
        return c, t, key, kept, np.where(kept, c, 0), self.offsets[i] + np.arange(len(c))

    def search_pass(self, first: bool = False) -> None:
        """One pass over the shards for every cluster still searching; then each takes its next step."""
        k, B = self.k, 1 << self.bits
        hist_tok, hist_n = np.zeros(k * B), np.zeros(k * B)
        got: list[tuple] = []
        tail = (np.zeros(0, np.int64), np.zeros(0, np.uint64), np.zeros(0, np.int64), np.zeros(0, np.int64))
        bound = np.full(k, _MASK, np.uint64)  # a round's cluster that has `gather` candidates: the last one's key
        pieces: list[tuple] = []
        held, room = 0, self.gather * int((self.phase == _TAIL).sum())
        for i in range(self.n):
            c, t, key, kept, cc, pos = self._shard(i)
            if first:
                self.offsets[i + 1] = self.offsets[i] + len(c)
                self.have += np.rint(np.bincount(c[kept], t[kept], k)).astype(np.int64)
                self.count += np.bincount(c[kept], minlength=k)
            ph, width = self.phase[cc], self.width[cc]
            shift = np.minimum(width, 63).astype(np.uint64)
            inside = kept & ((width == 64) | ((key >> shift) == (self.lo[cc] >> shift)))
            m = inside & (ph == _HIST)
            if m.any():
                w = width[m]
                step = (w - np.minimum(self.bits, w)).astype(np.uint64)
                cell = c[m] * B + ((key[m] - self.lo[c[m]]) >> step).astype(np.int64)
                hist_tok += np.bincount(cell, t[m], k * B)
                hist_n += np.bincount(cell, minlength=k * B)
            m = inside & (ph == _GATHER)
            if m.any():
                got.append((c[m], key[m], pos[m], t[m]))
            m = kept & (ph == _TAIL) & ~_before(key, pos, self.tail_key[cc], self.tail_pos[cc]) \
                & ~((key == self.tail_key[cc]) & (pos == self.tail_pos[cc])) & (t <= self.left[cc]) \
                & (key <= bound[cc])
            if m.any():
                pieces.append((c[m], key[m], pos[m], t[m]))
                held += int(m.sum())
            if held > 2 * room or (i == self.n - 1 and pieces):  # trimmed now and then: O(room + shard)
                tail = _smallest(*(np.concatenate(a) for a in zip(tail, *pieces)), self.gather)
                pieces, held = [], len(tail[0])
                ends = np.searchsorted(tail[0], np.arange(1, k + 1)) - 1
                full = np.bincount(tail[0], minlength=k) >= self.gather
                bound[full] = tail[1][ends[full]]
        if first:
            self.sized = True
            self._quotas()
        hist_tok, hist_n = np.rint(hist_tok).astype(np.int64).reshape(k, B), hist_n.astype(np.int64).reshape(k, B)
        gathered = _by_cluster(*(np.concatenate(a) for a in zip(*got))) if got else tail
        gathered_at, tail_at = (np.searchsorted(g[0], np.arange(k + 1)) for g in (gathered, tail))
        for cl in np.flatnonzero(self.phase != _DONE).tolist():
            if self.phase[cl] == _HIST:
                self._narrow(cl, hist_tok[cl], hist_n[cl])
            elif self.phase[cl] == _GATHER:
                s = slice(gathered_at[cl], gathered_at[cl + 1])
                self._cross(cl, gathered[1][s], gathered[2][s], gathered[3][s])
            else:
                s = slice(tail_at[cl], tail_at[cl + 1])
                self._visit(cl, tail[1][s], tail[2][s], tail[3][s])

    def _quotas(self) -> None:
        """The budget, and each cluster's whole epochs and partial-epoch tokens."""
        self.budget = budget_for(self.w, self.have, self.cap, self.budget)
        for c in range(self.k):
            goal = int(round(min(self.w[c] * self.budget, self.cap * int(self.have[c]))))
            self.goal[c] = goal
            if goal > 0 and self.count[c] and self.have[c]:
                self.full[c], self.rest[c] = divmod(goal, int(self.have[c]))
        self.phase[self.rest <= 0] = _DONE

    def _narrow(self, c: int, tok: np.ndarray, n: np.ndarray) -> None:
        """Keep the bin of the key range where the cluster's cumulative tokens pass `rest`."""
        bits = min(self.bits, int(self.width[c]))
        cum = np.cumsum(tok[:1 << bits])
        j = int(np.searchsorted(cum, self.rest[c] - self.before[c], side="right"))
        self.before[c] += int(cum[j - 1]) if j else 0
        self.width[c] -= bits
        self.lo[c] = _U64(int(self.lo[c]) + (j << int(self.width[c])))
        self.phase[c] = _GATHER if n[j] <= self.gather or self.width[c] == 0 else _HIST

    def _cross(self, c: int, key: np.ndarray, pos: np.ndarray, tok: np.ndarray) -> None:
        """The crossing document among the documents of its key range: the first whose cumulative
        tokens pass `rest`; and what is left of `rest` before it."""
        cum = self.before[c] + np.cumsum(tok)  # the documents come in (key, position) order
        j = int(np.searchsorted(cum, self.rest[c], side="right"))
        left = int(self.rest[c] - (cum[j - 1] if j else self.before[c]))
        self.has_thr[c], self.thr_key[c], self.thr_pos[c] = True, key[j], pos[j]
        self.phase[c] = _DONE
        if self.long_docs == "truncate":
            self.cut_keep[c] = left if left >= 2 else 0
        elif left > 0:
            self.phase[c], self.tail_key[c], self.tail_pos[c], self.left[c] = _TAIL, key[j], pos[j], left

    def _visit(self, c: int, key: np.ndarray, pos: np.ndarray, tok: np.ndarray) -> None:
        """One "skip" round: take, in order, each gathered document that fits in what is left."""
        left = limit = int(self.left[c])
        runs = self.runs.setdefault(c, [])
        run = None
        least = np.minimum.accumulate(tok[::-1])[::-1].tolist()  # the shortest from here to the round's end
        for kk, pp, tt, lo in zip(key.tolist(), pos.tolist(), tok.tolist(), least):
            if lo > left:  # nothing more of this round fits
                break
            if tt <= left:
                left -= tt
                run = [kk, pp, kk, pp] if run is None else [run[0], run[1], kk, pp]
            elif run is not None:
                runs.append((*run, limit))
                run = None
            if left == 0:
                break
        if run is not None:
            runs.append((*run, limit))
        if left == 0 or len(key) < self.gather:
            self.phase[c] = _DONE
        else:
            self.tail_key[c], self.tail_pos[c], self.left[c] = key[-1], pos[-1], left

    def write(self, emit: Callable[[int, np.ndarray, np.ndarray, np.ndarray], None]) -> dict:
        """Decide every shard's rows, hand each shard's to `emit(i, clusters, copies, cut)`; the totals."""
        k = self.k
        rows, tokens = np.zeros(k, np.int64), np.zeros(k)
        docs = truncated = 0
        for i in range(self.n):
            c, t, key, kept, cc, pos = self._shard(i)
            copies, cut = np.where(kept, self.full[cc], 0), np.zeros(len(c), np.int64)
            part = kept & self.has_thr[cc]
            copies[part & _before(key, pos, self.thr_key[cc], self.thr_pos[cc])] += 1
            at = part & (self.cut_keep[cc] > 0) & (key == self.thr_key[cc]) & (pos == self.thr_pos[cc])
            copies[at] += 1
            cut[at] = self.cut_keep[cc[at]]
            if self.runs:  # each cluster's documents of the shard at once: O(shard + runs x cluster's part)
                idx = np.flatnonzero(kept & np.isin(c, list(self.runs)))
                idx = idx[np.argsort(c[idx], kind="stable")]
                at_c = np.searchsorted(c[idx], np.arange(k + 1))
                for cl, runs in self.runs.items():
                    sub = idx[at_c[cl]:at_c[cl + 1]]
                    kk, pp, tt = key[sub], pos[sub], t[sub]
                    for k1, p1, k2, p2, limit in runs:
                        inside = ~_before(kk, pp, _U64(k1), p1) & ~_before(_U64(k2), p2, kk, pp) & (tt <= limit)
                        copies[sub[inside]] += 1
            emit(i, c, copies, cut)
            rows += np.bincount(c[kept], copies[kept], k).astype(np.int64)
            tokens += np.bincount(c[kept], copies[kept] * t[kept], k) - np.bincount(c[at], t[at] - cut[at], k)
            docs += int((copies > 0).sum())
            truncated += int(at.sum())
        per = []
        for c in range(k):
            have, want, taken = int(self.have[c]), self.w[c] * self.budget, int(round(tokens[c]))
            per.append({"cluster": c, "weight": float(self.w[c]), "tokens_wanted": int(round(want)), "tokens": taken,
                        "tokens_available": have, "capped": bool(want > self.cap * have + 0.5),
                        "shortfall": max(0, int(self.goal[c]) - taken),
                        "epochs": round(taken / have, 4) if have else 0.0})
        return {"budget": self.budget, "clusters": per, "rows": rows, "docs": docs, "truncated": truncated}


def plan_shards(read: Reader, n_shards: int, weights, budget: int, cap: float, long_docs: str,
                emit: Callable[[int, np.ndarray, np.ndarray, np.ndarray], None], *, bits: int = 0,
                gather: int = GATHER) -> dict:
    """Plan an export shard by shard (see the module's docstring).

    `read(i)` gives shard i's documents: cluster (-1: not kept), size in the budget's unit,
    and `doc_keys` key; it is called a few times per shard, one shard at a time. `emit(i,
    clusters, copies, cut)` receives shard i's plan: each row's copies (0, 1, 2, ...) and,
    for a document cut to fit, the tokens (EOS included) its last copy keeps (else 0).
    `budget` 0: the largest at which no cluster exceeds `cap` (budget_for). `bits` and
    `gather`: the histograms' bins (2**bits; by default as many as CELLS allows, up to
    2**MAX_BITS) and the documents gathered at once. Returns the budget, each cluster's
    stats, rows per cluster, distinct documents and documents cut.
    """
    p = _Planner(read, n_shards, np.asarray(weights, np.float64), budget, cap, long_docs, bits, gather)
    p.search_pass(first=True)
    while (p.phase != _DONE).any():
        p.search_pass()
    return p.write(emit)


def select(doc_cluster: np.ndarray, doc_tokens: np.ndarray, weights: np.ndarray, budget: int,
           cap: float, seed: int, long_docs: str = "truncate", ids: Sequence[str] | None = None,
           ) -> tuple[np.ndarray, dict]:
    """How many times each document is exported (0, 1, 2, ...) and per-cluster stats: the
    planner over arrays in memory, as one shard. Documents are ordered by `doc_keys(ids,
    seed)`, `ids` by default the positions ("0", "1", ...); `info["cut"]` maps a document
    cut to fit to the tokens (EOS included) its last copy keeps."""
    doc_cluster, doc_tokens = np.asarray(doc_cluster), np.asarray(doc_tokens)
    keys = doc_keys(pa.array(np.arange(len(doc_cluster)).astype(str)) if ids is None else ids, seed)
    out: dict = {}

    def emit(i: int, clusters: np.ndarray, copies: np.ndarray, cut: np.ndarray) -> None:
        out["copies"], out["cut"] = copies, {int(d): int(cut[d]) for d in np.flatnonzero(cut)}
    got = plan_shards(lambda i: (doc_cluster, doc_tokens, keys), 1, weights, budget, cap, long_docs, emit)
    return out["copies"], {"clusters": got["clusters"], "cut": out["cut"]}


def _shard_docs(paths: RunPaths, store, shard: str, units: str) -> tuple[np.ndarray, np.ndarray, pa.ChunkedArray]:
    """Cluster, size (in export.tokenizer's unit) and id of each document of a shard, in corpus order;
    a document the token store left out (target.decontaminate) is not kept (cluster -1)."""
    table = load_assignments(paths, shard)
    clusters = table["cluster"].to_numpy().copy()
    done = paths.tokenize.store / "parts" / shard / "done.json"
    if done.exists():
        gone = read_json(done).get("decontaminated", [])
        clusters[np.asarray(gone, dtype=np.int64)] = -1
    kept = clusters >= 0
    tokens = np.zeros(len(clusters), dtype=np.int64)
    if units != export_units.PROXY:
        tokens[kept] = np.load(counts_file(paths, shard, units))[kept]
        return clusters, tokens, table["id"]
    try:
        tokens[kept] = store.doc_tokens(shard)
    except (OSError, ValueError) as e:
        raise InputError(f"{store.path}: cannot read the document token counts of shard {shard} ({e}); run "
                         "`climb tokenize` (same --config and --run) to re-create them") from None
    return clusters, tokens, table["id"]


def counts_file(paths: RunPaths, shard: str, units: str) -> Path:
    """A shard's document sizes in `units` (export.tokenizer), under a folder keyed by the unit
    and the clusters they were counted for."""
    return paths.export.dir / "counts" / digest(export_units.key(units), units, upstream_key(paths, "cluster"))[:16] \
        / f"{shard}.npy"


def _plan(cfg: RunConfig, paths: RunPaths, w: np.ndarray) -> dict:
    """Plan the run's export shard by shard, each shard's part saved under export/plan/ (copies,
    clusters, cut: `ExportOutputs.plan`); the budget, per-cluster stats and totals."""
    from proxies.tokens import TokenStore
    store = TokenStore(paths.tokenize.store)
    names = paths.shards()

    def read(i: int):
        clusters, tokens, ids = _shard_docs(paths, store, names[i], cfg.export.tokenizer)
        return clusters, tokens, doc_keys(ids, cfg.export.seed)

    def emit(i: int, clusters: np.ndarray, copies: np.ndarray, cut: np.ndarray) -> None:
        files = paths.export.plan(names[i])
        files[0].parent.mkdir(parents=True, exist_ok=True)
        for f, a in zip(files, (copies, clusters, cut)):
            write_npy(f, a)
    got = plan_shards(read, len(names), w, cfg.export.token_budget, cfg.search.epoch_cap, cfg.export.long_docs,
                      emit)
    return {"shards": names, "budget": got["budget"], "selection": {"clusters": got["clusters"]},
            "rows": got["rows"], "docs": got["docs"], "truncated": got["truncated"], "unit": cfg.export.tokenizer}


def cluster_rows(plan: dict) -> np.ndarray:
    """Rows the export writes per cluster (every copy of a document is a row)."""
    return np.asarray(plan["rows"], dtype=np.int64)


def row_probabilities(plan: dict, clusters: list[int]) -> list[float]:
    """`datasets.interleave_datasets` probabilities for these clusters' files: each cluster's
    share of the rows. Interleaving draws rows, not tokens; drawn by these, every cluster
    runs out at about the same time, so that reading every row once (the stopping strategy
    "all_exhausted_without_replacement") yields the realised token weights, with the
    clusters mixed evenly along the way (a cluster of long documents is not over-weighted,
    nor one of short ones left half unread)."""
    rows = cluster_rows(plan)[clusters].astype(np.float64)
    return (rows / rows.sum()).tolist()
