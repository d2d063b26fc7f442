"""climb.stages.export.plan: the export planned shard by shard gives exactly the rows of the
same rule applied to the whole corpus at once (a plain reference below), and its memory does
not grow with the number of shards."""
from __future__ import annotations

import tracemalloc

import numpy as np
import pyarrow as pa
import pytest

from climb import pipeline
from climb.stages.cluster import load_assignments
from climb.stages.export.plan import budget_for, doc_keys, plan_shards, select
from scripted_run import prepare


def reference(doc_cluster, doc_tokens, ids, weights, budget, cap, seed, long_docs):
    """The rule on the whole corpus, as plainly as it can be written: each cluster sorted by
    (key, position); whole epochs; then the longest prefix that fits, and the crossing document
    cut ("truncate") or the later ones that fit taken in order until nothing is left ("skip")."""
    keys = doc_keys(ids, seed)
    kept = doc_cluster >= 0
    have_all = np.bincount(doc_cluster[kept], weights=doc_tokens[kept], minlength=len(weights))
    budget = budget_for(np.asarray(weights), have_all, cap, budget)
    copies = np.zeros(len(doc_cluster), np.int64)
    cut = {}
    for c, w in enumerate(weights):
        members = np.flatnonzero(doc_cluster == c)
        have = int(doc_tokens[members].sum())
        goal = int(round(min(w * budget, cap * have)))
        if goal <= 0 or not have:
            continue
        order = members[np.lexsort((members, keys[members]))]
        full, rest = divmod(goal, have)
        copies[members] += full
        if rest == 0:
            continue
        cum = np.cumsum(doc_tokens[order])
        n = int(np.searchsorted(cum, rest, side="right"))
        copies[order[:n]] += 1
        left = rest - (int(cum[n - 1]) if n else 0)
        if long_docs == "truncate":
            if left >= 2:
                copies[order[n]] += 1
                cut[int(order[n])] = left
            continue
        for d in order[n + 1:]:
            if left == 0:
                break
            if doc_tokens[d] <= left:
                copies[d] += 1
                left -= int(doc_tokens[d])
    return copies, cut


def _corpus(seed: int, n: int = 600, k: int = 5):
    """Clusters of different sizes, pruned documents, sizes from 0 (an empty text in bytes) to
    huge, and repeated ids (equal keys: their order is their position)."""
    rng = np.random.default_rng(seed)
    doc_cluster = rng.choice(np.arange(-1, k), size=n, p=[0.05, 0.4, 0.25, 0.15, 0.1, 0.05][:k + 1])
    doc_tokens = rng.integers(0, 80, size=n) * (rng.random(n) < 0.97) + (rng.random(n) < 0.02) * 5000
    ids = [f"doc-{i}" for i in range(n)]
    for i in rng.choice(n, size=30, replace=False):  # the same id again, elsewhere in the corpus
        ids[i] = ids[int(rng.integers(n))]
    return doc_cluster.astype(np.int64), doc_tokens.astype(np.int64), ids


def _sharded(doc_cluster, doc_tokens, ids, cuts, weights, budget, cap, seed, long_docs, **kw):
    """The planner over the corpus cut at `cuts` (empty shards allowed), its rows put back together."""
    bounds = [0, *cuts, len(doc_cluster)]
    shards = [slice(a, b) for a, b in zip(bounds, bounds[1:])]
    keys = [doc_keys(pa.array(ids[s], pa.string()), seed) for s in shards]
    copies, cut = np.full(len(doc_cluster), -1, np.int64), {}
    reads = []

    def read(i):
        reads.append(i)
        return doc_cluster[shards[i]], doc_tokens[shards[i]], keys[i]

    def emit(i, clusters, c, t):
        np.testing.assert_array_equal(clusters, doc_cluster[shards[i]])
        copies[shards[i]] = c
        cut.update({shards[i].start + int(d): int(t[d]) for d in np.flatnonzero(t)})
    got = plan_shards(read, len(shards), weights, budget, cap, long_docs, emit, **kw)
    assert (copies >= 0).all()
    return copies, cut, got, reads


@pytest.mark.parametrize("long_docs", ["truncate", "skip"])
@pytest.mark.parametrize("weights, budget, cap", [
    ([0.3, 0.3, 0.2, 0.1, 0.1], 4000, 4.0),      # a partial first epoch everywhere
    ([0.4, 0.1, 0.2, 0.2, 0.1], 60000, 3.0),     # several epochs, capped clusters
    ([0.0, 0.5, 0.0, 0.25, 0.25], 0, 2.5),       # zero weights; the largest uncapped budget
])
@pytest.mark.parametrize("seed", [0, 1])
def test_shard_by_shard_is_the_rule_on_the_whole_corpus(long_docs, weights, budget, cap, seed):
    doc_cluster, doc_tokens, ids = _corpus(seed)
    want, want_cut = reference(doc_cluster, doc_tokens, ids, weights, budget, cap, seed, long_docs)
    whole, info = select(doc_cluster, doc_tokens, np.array(weights), budget, cap, seed, long_docs, ids=ids)
    np.testing.assert_array_equal(whole, want)
    assert info["cut"] == want_cut
    rng = np.random.default_rng(seed + 10)
    for cuts, kw in [([300], {}),
                     (sorted(rng.choice(600, size=9, replace=False).tolist()) + [599, 599], {}),
                     (list(range(37, 600, 37)), {"bits": 2, "gather": 3}),  # many narrowing passes, skip rounds
                     ([0, 0, 450], {"bits": 1, "gather": 1})]:
        copies, cut, got, reads = _sharded(doc_cluster, doc_tokens, ids, cuts, weights, budget, cap, seed, long_docs,
                                           **kw)
        np.testing.assert_array_equal(copies, want)  # ids and copies
        assert cut == want_cut  # cut documents and the tokens they keep
        assert got["clusters"] == info["clusters"]
        assert got["docs"] == int((want > 0).sum()) and got["truncated"] == len(want_cut)
        kept = doc_cluster >= 0
        assert got["rows"].tolist() == np.bincount(doc_cluster[kept], want[kept], len(weights)).astype(int).tolist()
        if kw:  # the small bins and gathers took more passes: all of them one shard at a time, in order
            n = len(cuts) + 1
            assert len(reads) > 3 * n and reads == list(range(n)) * (len(reads) // n)
    if long_docs == "truncate":  # every share reached, bar a remainder of one token
        assert all(p["shortfall"] <= 1 for p in info["clusters"])


def test_the_order_is_the_ids_own():
    ids = ["a", "a\x00", "b", "", "naïve-ünïcödé", "x" * 300]
    keys = doc_keys(ids, 0)
    # A function of (seed, id) alone: pinned, so that an export planned again anywhere is the same.
    assert keys[:4].tolist() == [18333067107861811135, 16588149931188052010, 4642636558012083732,
                                 6566800829925814604]
    assert len(set(keys.tolist())) == len(ids)
    # The same in any batch, from any kind of array, sliced or not.
    assert doc_keys(ids[::-1], 0).tolist() == keys[::-1].tolist()
    assert doc_keys(pa.chunked_array([ids[:2], ids[2:]]), 0).tolist() == keys.tolist()
    assert doc_keys(pa.array(["z", *ids])[1:], 0).tolist() == keys.tolist()
    assert doc_keys(ids, 1).tolist() != keys.tolist()
    many = doc_keys([str(i) for i in range(40_000)], 3)
    counts = np.bincount((many >> np.uint64(60)).astype(np.int64), minlength=16)
    assert counts.min() > 2200 and counts.max() < 2800  # uniform over the top bits the histograms use


def _synthetic(n_shards: int, docs: int, k: int):
    """Shards of `docs` documents each: clusters (-1: pruned), sizes, keys; made before the
    measurement, so that what it traces is the planner's own memory."""
    out = []
    for i in range(n_shards):
        rng = np.random.default_rng(i)
        ids = pa.array(np.char.add(f"s{i}-", np.arange(docs).astype(str)))
        out.append((rng.integers(-1, k, size=docs), rng.integers(1, 2000, size=docs), doc_keys(ids, 0)))
    return out


@pytest.mark.parametrize("long_docs", ["truncate", "skip"])
def test_memory_does_not_grow_with_the_corpus(long_docs):
    """The planner's peak memory (tracemalloc) over 8 shards and over 64 of the same size: the
    same, and below half an 8-byte number per document of the larger corpus, so that holding
    any array over the whole corpus (as the plan did: copies and cut) would fail it. Small
    histograms and gathers (`bits`, `gather`) keep the per-cluster state below one shard's."""
    docs, k = 5_000, 8
    w = np.full(k, 1 / k)
    peaks = {}
    for n in (8, 64):
        shards = _synthetic(n, docs, k)
        budget = int(1.5 * n * docs * 8 / 9 * 1000)  # about one and a half epochs of every cluster
        seen = []
        tracemalloc.start()
        got = plan_shards(lambda i: shards[i], n, w, budget, 2.0, long_docs,
                          lambda i, c, copies, cut: seen.append(int(copies.sum())), bits=8, gather=256)
        peaks[n] = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert len(seen) == n and sum(seen) == got["rows"].sum() > n * docs  # more than one epoch was planned
        assert all(p["shortfall"] <= 1 for p in got["clusters"]) or long_docs == "skip"
    assert peaks[64] < 1.25 * peaks[8], peaks
    assert peaks[64] < 4 * 64 * docs, peaks


def test_the_stage_writes_the_rule_on_the_whole_corpus(tmp_path, monkeypatch):
    """On the demo: the plan files the export writes, shard by shard, are `select` (the planner
    as one shard) on the whole corpus, and what the stats say they are."""
    cfg, paths, _, _ = prepare(tmp_path, monkeypatch, "export.token_budget=6000")
    stats = pipeline.run_stage("export", cfg, paths.root)
    from proxies.tokens import TokenStore
    store = TokenStore(paths.tokenize.store)
    clusters = [load_assignments(paths, s)["cluster"].to_numpy() for s in paths.shards()]
    ids = [i for s in paths.shards() for i in load_assignments(paths, s)["id"].to_pylist()]
    tokens = [np.zeros(len(c), np.int64) for c in clusters]
    for t, c, s in zip(tokens, clusters, paths.shards()):
        t[c >= 0] = store.doc_tokens(s)
    import json
    w = np.array(json.loads(paths.search.mixture.read_text())["weights"])
    copies, info = select(np.concatenate(clusters), np.concatenate(tokens), w, 6000, cfg.search.epoch_cap,
                          cfg.export.seed, cfg.export.long_docs, ids=ids)
    written = [np.load(paths.export.plan(s)[0]) for s in paths.shards()]
    cut = np.concatenate([np.load(paths.export.plan(s)[2]) for s in paths.shards()])
    np.testing.assert_array_equal(np.concatenate(written), copies)
    assert {int(d): int(cut[d]) for d in np.flatnonzero(cut)} == info["cut"]
    assert stats["rows"] == int(copies.sum()) and stats["docs"] == int((copies > 0).sum())
    assert stats["truncated_docs"] == len(info["cut"]) and stats["tokens"] == sum(p["tokens"] for p in info["clusters"])
