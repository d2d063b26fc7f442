"""Dedup in bounded memory (climb.stages.cluster.dedup) finds what the whole-corpus algorithm found: on a
five-shard corpus with exact and near copies across shards (and some documents pruned), the
assignment files' duplicate columns and the counts equal those of a reference kept here (the
algorithm as it was: every id and array of the corpus at once, a flat index per fine cluster,
union-find), with the hash space, the fine clusters and the id look-ups cut into many passes
too. Above NEAR_EXACT_MAX the IVF search finds the planted pairs, the same way every time."""
from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from climb.stages.cluster import dedup
from conftest import FakeModel, write_parquet_shards


def _corpus(seed: int = 3) -> list[dict]:
    """500 documents of 60 words, then copies of earlier ones under new ids: exact (recased,
    repunctuated), near (two words replaced; reordered: the same fake embedding), copies of
    copies (chains), shuffled and dealt round-robin into the shards."""
    rng = np.random.default_rng(seed)
    vocab = sorted({"".join(rng.choice(list("abcdefghijklmnopqrstuvwxyz"), 6)) for _ in range(1500)})
    docs = [{"id": f"doc-{i:03d}", "text": " ".join(rng.choice(vocab, 60))} for i in range(500)]
    for j in range(150):
        src = docs[int(rng.integers(len(docs)))]["text"]
        words = src.split()
        if j % 3 == 0:
            text = src.upper().replace(" ", " ,  ") + "!"
        elif j % 3 == 1:
            for w in rng.choice(len(words), 2, replace=False):
                words[w] = str(rng.choice(vocab))
            text = " ".join(words)
        else:
            text = " ".join(words[i] for i in rng.permutation(len(words)))
        docs.append({"id": f"copy-{j:03d}", "text": text})
    return [docs[i] for i in rng.permutation(len(docs))]


def _reference(d, paths, names: list[str], n_clusters: int):
    """The duplicates as the whole-corpus algorithm (before bounded memory) found them: per shard
    (duplicate, duplicate_of ids), and the counts per cluster."""
    import faiss
    out = paths.cluster
    clusters, fines, hashes, ids, nbytes = [], [], [], [], []
    for s in names:
        t = pq.read_table(out.assignments(s))
        c = t["cluster"].to_numpy()
        if "duplicate_cluster" in t.column_names:
            before = t["duplicate_cluster"].to_numpy()
            c = np.where(before >= 0, before, c)
        clusters.append(c)
        fines.append(t["fine"].to_numpy())
        ids += t["id"].to_pylist()
        hashes.append(np.load(out.text_hashes(s)))
        nbytes.append(pq.read_table(paths.embed.ids(s))["bytes"].to_numpy())
    cl = np.concatenate(clusters)
    kept, h, fine = cl >= 0, np.concatenate(hashes), np.concatenate(fines)
    kind, of = np.zeros(len(cl), np.int8), np.full(len(cl), -1)
    if d.exact:
        for j in np.flatnonzero(kept):  # the first kept document with its hash, in corpus order
            first = np.flatnonzero(kept & (h == h[j]))[0]
            if first != j:
                kind[j], of[j] = 1, first
    emb = np.concatenate([np.load(paths.embed.vectors(s)) for s in names]).astype(np.float32)
    for f in np.unique(fine[kept & (kind == 0)]):
        rows = np.flatnonzero(kept & (kind == 0) & (fine == f))
        parent = list(range(len(rows)))

        def find(i):
            while parent[i] != i:
                i = parent[i]
            return i
        index = faiss.IndexFlatIP(emb.shape[1])
        index.add(emb[rows])
        sims, nbrs = index.search(emb[rows], min(d.neighbors + 1, len(rows)))
        for r, c in zip(*np.nonzero(sims >= d.threshold)):
            a, b = find(r), find(int(nbrs[r, c]))
            parent[max(a, b)] = min(a, b)
        for i, row in enumerate(rows):
            if find(i) != i:
                kind[row], of[row] = 2, rows[find(i)]
    live = cl >= 0
    b = np.concatenate(nbytes)
    counts = {"docs": np.bincount(cl[live], minlength=n_clusters),
              "exact": np.bincount(cl[live & (kind == 1)], minlength=n_clusters),
              "near": np.bincount(cl[live & (kind == 2)], minlength=n_clusters),
              "bytes": np.bincount(cl[live], weights=b[live], minlength=n_clusters),
              "bytes_distinct": np.bincount(cl[live & (kind == 0)], weights=b[live & (kind == 0)],
                                            minlength=n_clusters)}
    sizes = np.cumsum([0] + [len(c) for c in clusters])
    shards = [(kind[a:z].tolist(), [ids[j] if j >= 0 else "" for j in of[a:z]]) for a, z in zip(sizes, sizes[1:])]
    return shards, {k: v.astype(np.int64).tolist() for k, v in counts.items()}


@pytest.fixture(scope="module")
def clustered(tmp_path_factory):
    """A five-shard corpus embedded and clustered (dedup off), a tenth of one shard pruned."""
    import climb.stages.embed
    from climb import pipeline
    from climb.config import load_config
    from climb.runtime.layout import RunPaths
    root = tmp_path_factory.mktemp("dedup_bounded")
    write_parquet_shards(root / "corpus", _corpus(), 5)
    cfg = load_config(None, [f'corpus.paths=["{root}/corpus/*.parquet"]', "cluster.k=6", "cluster.niter=10",
                             "cluster.merge_to=4", "dedup.threshold=0.0", "dedup.exact=true"])
    mp = pytest.MonkeyPatch()
    mp.setattr(climb.stages.embed, "load_model", lambda c: FakeModel())
    paths = RunPaths(root / "run")
    pipeline.run_stage("cluster", cfg, paths.root)
    mp.undo()
    names = paths.shards()
    path = paths.cluster.assignments(names[2])  # pruned, as a quality score would: cluster -1, hash 0
    t = pq.read_table(path).drop_columns(["duplicate", "duplicate_of", "duplicate_cluster"])
    gone = np.arange(t.num_rows) % 10 == 3
    t = t.set_column(t.column_names.index("cluster"), "cluster",
                     pa.array(np.where(gone, -1, t["cluster"].to_numpy()).astype(np.int32), pa.int32()))
    pq.write_table(t, path)
    np.save(paths.cluster.text_hashes(names[2]), np.where(gone, 0, np.load(paths.cluster.text_hashes(names[2]))))
    return cfg, paths, names


def _marked(paths, names):
    return [(t["duplicate"].to_pylist(), t["duplicate_of"].to_pylist())
            for t in (pq.read_table(paths.cluster.assignments(s)) for s in names)]


@pytest.mark.parametrize("small_passes", [False, True])
@pytest.mark.parametrize("drop", [False, True])
def test_bounded_dedup_equals_the_whole_corpus_algorithm(clustered, monkeypatch, small_passes, drop):
    import dataclasses
    from climb.stages.cluster import _dedup
    cfg, paths, names = clustered
    cfg = dataclasses.replace(cfg, dedup=dataclasses.replace(cfg.dedup, threshold=0.9, drop=drop))
    if small_passes:  # 8 slices of the hash space, a fine cluster a pass, ids 7 duplicates at a time
        monkeypatch.setattr(dedup, "EXACT_BUCKET", 90)
        monkeypatch.setattr(dedup, "NEAR_PASS", 1)
        monkeypatch.setattr(dedup, "MARK_BATCH", 7)
    c = int(json.loads(paths.cluster.summary.read_text())["n_clusters"])
    got_counts = _dedup(cfg, paths, names, c)
    want, want_counts = _reference(cfg.dedup, paths, names, c)
    assert _marked(paths, names) == want
    assert got_counts == want_counts
    kinds = np.concatenate([k for k, _ in want])
    assert (kinds == 1).sum() >= 40 and (kinds == 2).sum() >= 60  # both kinds, across shards
    for s in names:
        t = pq.read_table(paths.cluster.assignments(s))
        dup = t["duplicate"].to_numpy() > 0
        assert (t["cluster"].to_numpy()[dup] == -1).all() == drop or not dup.any()


def _planted(n: int, d: int, seed: int):
    """n unit vectors in 40 loose topics; 300 of them copied with a little noise (cosine
    0.95-0.99 with their source), some copies copied again."""
    rng = np.random.default_rng(seed)
    topics = rng.standard_normal((40, d))
    x = topics[rng.integers(40, size=n)] + 1.2 * rng.standard_normal((n, d))
    for i, j in enumerate(rng.choice(np.arange(1, n), 300, replace=False)):
        src = x[rng.integers(j)] if i % 5 else x[j - 1]  # an earlier row: every fifth a row just before
        x[j] = src / np.linalg.norm(src) + 0.04 * rng.standard_normal(d)
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def test_ivf_above_the_exact_size_finds_the_pairs_the_same_way_every_time(monkeypatch):
    import faiss
    from threadpoolctl import threadpool_limits
    x = _planted(4000, 32, seed=5)
    exact = dedup.near_groups(x, 0.95, 16)
    monkeypatch.setattr(dedup, "IVF_LIST", 100)  # 40 lists, 4 visited
    approx = dedup.near_groups(x, 0.95, 16, exact_max=1000)
    flagged = exact != np.arange(len(x))
    assert flagged.sum() > 250
    found = (approx == exact) & flagged
    assert found.sum() >= 0.95 * flagged.sum()  # the exact search's duplicates, with the same first
    assert not (approx != np.arange(len(x)))[~flagged].any()  # and nothing the exact search did not flag
    threads = faiss.omp_get_max_threads()
    try:
        faiss.omp_set_num_threads(1)
        with threadpool_limits(1):
            one = dedup.near_groups(x, 0.95, 16, exact_max=1000)
    finally:
        faiss.omp_set_num_threads(threads)
    assert np.array_equal(one, approx) and np.array_equal(dedup.near_groups(x, 0.95, 16, exact_max=1000), approx)


def _pair_set(a, b):
    return set(zip(np.minimum(a, b).tolist(), np.maximum(a, b).tolist()))


def test_ivf_list_by_list_returns_what_faiss_searching_each_query_returns(monkeypatch):
    """ivf_pairs (each list against the rows that visit it, one matrix product) gives the
    pairs of FAISS's IndexIVFFlat search over the same lists, cut to `neighbors` a row."""
    import faiss
    monkeypatch.setattr(dedup, "IVF_LIST", 100)
    x = _planted(3000, 32, seed=7)
    x[100:160] = x[99] + 0.01 * np.random.default_rng(0).standard_normal((60, 32)).astype(np.float32)  # a group of 61
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    for neighbors in (4, 16):
        n, d = x.shape
        index = faiss.IndexIVFFlat(faiss.IndexFlatIP(d), d, n // 100, faiss.METRIC_INNER_PRODUCT)
        index.cp.seed = dedup.IVF_SEED
        index.nprobe = dedup.IVF_PROBE
        index.train(x[np.sort(np.random.default_rng(dedup.IVF_SEED).choice(n, dedup.IVF_TRAIN * (n // 100),
                                                                              replace=False))])
        index.add(x)
        sims, nbrs = index.search(x, neighbors + 1)
        r, c = np.nonzero((sims >= 0.95) & (nbrs >= 0) & (nbrs != np.arange(n)[:, None]))
        a, b = dedup.ivf_pairs(x, 0.95, neighbors)
        assert np.bincount(a, minlength=n).max() == neighbors  # the group of 61: cut to `neighbors` a row
        assert _pair_set(a, b) == _pair_set(r, nbrs[r, c])


def test_ivf_reads_half_precision_shards_as_stored_with_the_same_result(monkeypatch):
    """Above the exact size the fine cluster is held as the shards store it (float16: half the
    memory), each block computed in float32: the groups of the float32 copy of the same values."""
    monkeypatch.setattr(dedup, "IVF_LIST", 100)
    x = _planted(3000, 32, seed=9).astype(np.float16)
    shards = [x[:1100], x[1100:2000], x[2000:]]
    offsets = np.array([0, 1100, 2000, 3000])
    rows = np.arange(3000)
    held = dedup._Rows(rows, offsets, lambda s: shards[s])
    assert held.stored().dtype == np.float16 and held[:5].dtype == np.float32
    got = dedup.near_groups(held, 0.95, 16, exact_max=1000)
    want = dedup.near_groups(x.astype(np.float32), 0.95, 16, exact_max=1000)
    assert (want != rows).sum() > 200 and np.array_equal(got, want)


def test_a_near_pass_stopped_part_way_resumes_at_the_fine_cluster_in_flight(clustered, monkeypatch):
    """A stage killed in the near pass (minutes at 10^7 documents) keeps the fine clusters it had
    searched: the rerun searches only the others, marks what an unbroken pass marks, and leaves
    no kept pass behind. Kept groups under other settings are not reused."""
    import dataclasses
    from climb.stages.cluster import _dedup
    cfg, paths, names = clustered
    cfg = dataclasses.replace(cfg, dedup=dataclasses.replace(cfg.dedup, threshold=0.9))
    c = int(json.loads(paths.cluster.summary.read_text())["n_clusters"])
    real, calls = dedup.near_groups, []

    def counted(*a, **k):
        calls.append(1)
        return real(*a, **k)
    monkeypatch.setattr(dedup, "near_groups", counted)
    want_counts = _dedup(cfg, paths, names, c)
    want, searched = _marked(paths, names), len(calls)
    assert searched >= 4 and not (paths.cluster.dir / dedup.NEAR_KEPT).exists()

    class Killed(Exception):
        pass

    def dies_after_two(*a, **k):
        if len(calls) == searched + 2:
            raise Killed
        return counted(*a, **k)
    monkeypatch.setattr(dedup, "near_groups", dies_after_two)
    with pytest.raises(Killed):
        _dedup(cfg, paths, names, c)
    assert len(list((paths.cluster.dir / dedup.NEAR_KEPT).glob("*.npz"))) == 2
    monkeypatch.setattr(dedup, "near_groups", counted)
    calls.clear()
    assert _dedup(cfg, paths, names, c) == want_counts
    assert _marked(paths, names) == want and len(calls) == searched - 2
    assert not (paths.cluster.dir / dedup.NEAR_KEPT).exists()

    monkeypatch.setattr(dedup, "near_groups", dies_after_two)  # killed again, then other settings
    calls[:] = [1] * searched
    with pytest.raises(Killed):
        _dedup(cfg, paths, names, c)
    other = dataclasses.replace(cfg, dedup=dataclasses.replace(cfg.dedup, threshold=0.95))
    monkeypatch.setattr(dedup, "near_groups", counted)
    calls.clear()
    _dedup(other, paths, names, c)
    assert len(calls) == searched
    _dedup(cfg, paths, names, c)  # the module's fixture as the other tests expect it
