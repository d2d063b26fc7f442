"""climb.stages.cluster.kmeans and the cluster stage, end to end on fake (hashed bag-of-words) embeddings."""
from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from sklearn.metrics import adjusted_rand_score

from climb.config import ClusterConfig, CorpusConfig, RunConfig
from climb.stages.cluster.kmeans import assign, train_kmeans
from climb.runtime.layout import RunPaths

SHARDS = 3
PER_VOCAB = 100


# --------------------------------------------------------------------------- kmeans

def _blobs(n_per: int = 100, d: int = 8, seed: int = 0):
    rng = np.random.default_rng(seed)
    centers = np.zeros((3, d))
    centers[0, 0] = centers[1, 1] = centers[2, 2] = 10.0
    truth = np.repeat(np.arange(3), n_per)
    x = centers[truth] + rng.normal(size=(len(truth), d))
    perm = rng.permutation(len(truth))
    return x[perm].astype(np.float32), truth[perm], centers


@pytest.mark.parametrize("which", ["faiss-cpu", "torch"])
def test_train_kmeans_finds_separated_blobs(which):
    x, truth, centers = _blobs()
    cents, stats = train_kmeans(x, k=3, niter=20, seed=0, which=which)
    assert cents.shape == (3, x.shape[1]) and cents.dtype == np.float32
    labels, _ = assign(x, cents)
    assert adjusted_rand_score(truth, labels) > 0.99
    # Each true centre has a learned centroid within the noise of the blob mean.
    err = np.linalg.norm(centers[:, None, :] - cents[None], axis=2).min(axis=1)
    assert err.max() < 0.5
    assert stats["backend"] == which and stats["sample"] == len(x)
    # Inertia is the sum of squared distances to the nearest centroid (~ d per point).
    assert 0.5 * x.shape[1] * len(x) < stats["inertia"] < 1.5 * x.shape[1] * len(x)


def test_train_kmeans_deterministic_for_seed():
    x, _, _ = _blobs(seed=1)
    a, _ = train_kmeans(x, 3, niter=10, seed=3, which="torch")
    b, _ = train_kmeans(x, 3, niter=10, seed=3, which="torch")
    np.testing.assert_array_equal(a, b)


def test_assign_equals_bruteforce_argmin():
    rng = np.random.default_rng(2)
    x = rng.normal(size=(1000, 16)).astype(np.float32)
    cents = rng.normal(size=(7, 16)).astype(np.float32)
    labels, dist = assign(x, cents, batch=128)  # several batches, the last one partial
    d2 = ((x.astype(np.float64)[:, None, :] - cents[None].astype(np.float64)) ** 2).sum(-1)
    np.testing.assert_array_equal(labels, d2.argmin(1))
    np.testing.assert_allclose(dist, d2.min(1), rtol=1e-4, atol=1e-4)
    assert labels.dtype == np.int64 and dist.dtype == np.float32
    # float64 input and a non-contiguous view work too.
    l2, _ = assign(x.astype(np.float64)[::2], cents)
    np.testing.assert_array_equal(l2, d2.argmin(1)[::2])


# --------------------------------------------------------------------------- cluster stage

@pytest.fixture
def corpus(tmp_path, make_docs, write_shards):
    """300 documents from 3 vocabularies in 3 Parquet shards, with a quality column."""
    docs = make_docs(PER_VOCAB, seed=0)
    for i, d in enumerate(docs):
        d["quality"] = (i % 4) / 4  # 0, .25, .5, .75
    files = write_shards(tmp_path / "corpus", docs, SHARDS, extra=("quality",))
    return {"docs": docs, "files": files, "pattern": str(tmp_path / "corpus" / "*.parquet")}


def _cfg(corpus, **cluster) -> RunConfig:
    cluster.setdefault("k", 3)
    return RunConfig(corpus=CorpusConfig(paths=(corpus["pattern"],), batch_rows=64),
                     cluster=ClusterConfig(**cluster))


def _run(root: Path, cfg: RunConfig) -> dict:
    import climb.stages.cluster
    import climb.stages.embed
    paths = RunPaths(root)
    climb.stages.embed.run(cfg, paths)
    return climb.stages.cluster.run(cfg, paths)


def _assignments(root: Path) -> dict[str, np.ndarray]:
    """All assign/*.parquet rows concatenated in shard order."""
    tabs = [pq.read_table(root / "cluster" / "assign" / f"part-{s:05d}.parquet") for s in range(SHARDS)]
    return {c: np.concatenate([t[c].to_numpy(zero_copy_only=False) for t in tabs]) for c in tabs[0].column_names}


def _embeddings(root: Path) -> np.ndarray:
    return np.concatenate([np.load(root / "embed" / f"part-{s:05d}.npy") for s in range(SHARDS)])


def _summary(root: Path) -> dict:
    return json.loads((root / "cluster" / "clusters.json").read_text())


def _corpus_order(corpus) -> list[dict]:
    """Documents in the order the stages read them: shard by shard."""
    return [d for s in range(SHARDS) for d in corpus["docs"][s::SHARDS]]


def test_cluster_stage_end_to_end(tmp_path, corpus, fake_model, vocabs):
    root = tmp_path / "run"
    cfg = _cfg(corpus, k=3)
    stats = _run(root, cfg)
    docs = _corpus_order(corpus)
    n = len(docs)
    a = _assignments(root)

    # Every document assigned exactly once, ids as in the corpus.
    assert a["id"].tolist() == [d["id"] for d in docs]
    assert len(set(a["id"])) == n
    assert (a["cluster"] >= 0).all() and (a["fine"] >= 0).all()

    # Fine assignment = nearest of the saved centroids (brute force).
    emb = _embeddings(root)
    cents = np.load(root / "cluster" / "centroids.npy")
    assert cents.shape == (3, fake_model.dim)
    d2 = ((emb[:, None, :] - cents[None]) ** 2).sum(-1)
    np.testing.assert_array_equal(a["fine"], d2.argmin(1))
    np.testing.assert_allclose(a["distance"], d2.min(1), atol=1e-4)

    # Three well separated vocabularies -> three pure clusters.
    labels = np.array([d["label"] for d in docs])
    assert adjusted_rand_score(labels, a["cluster"]) == 1.0

    summ = _summary(root)
    assert summ["n_clusters"] == 3 and summ["k"] == 3
    assert sum(c["docs"] for c in summ["clusters"]) == n
    assert [c["docs"] for c in summ["clusters"]] == np.bincount(a["cluster"], minlength=3).tolist()
    assert sum(c["bytes"] for c in summ["clusters"]) == sum(len(d["text"].encode()) for d in docs)
    assert sum(c["words"] for c in summ["clusters"]) == sum(len(d["text"].split()) for d in docs)
    owner = {}
    for c in summ["clusters"]:
        terms = set(c["top_terms"])
        assert len(terms) == cfg.cluster.top_terms
        matching = [v for v, words in vocabs.items() if terms <= set(words)]
        assert len(matching) == 1, (c["cluster"], terms)
        owner[c["cluster"]] = matching[0]
        # Exemplars: the closest documents of that cluster, nearest first.
        ex = c["exemplars"]
        assert len(ex) == cfg.cluster.exemplars
        assert [e["distance"] for e in ex] == sorted(e["distance"] for e in ex)
        members = set(a["id"][a["cluster"] == c["cluster"]])
        assert all(e["id"] in members for e in ex)
    assert sorted(owner.values()) == sorted(vocabs)
    # ... and the cluster each vocabulary got is the one its documents are in.
    for i, d in enumerate(docs):
        assert owner[int(a["cluster"][i])] == d["label"]

    assert stats["docs"] == n and stats["assigned"] == n and stats["pruned"] == 0
    assert stats["shards"] == [f"part-{s:05d}" for s in range(SHARDS)]
    assert Path(root / "cluster" / "manifest.json").exists()
    merged = np.load(root / "cluster" / "cluster_centroids.npy")
    np.testing.assert_allclose(np.linalg.norm(merged, axis=1), 1.0, rtol=1e-5)


def test_cluster_stage_skips_when_unchanged_and_reruns_on_change(tmp_path, corpus, fake_model):
    import climb.stages.cluster
    root = tmp_path / "run"
    cfg = _cfg(corpus, k=3)
    first = _run(root, cfg)
    assert "skipped_stage" not in first
    mtime = (root / "cluster" / "clusters.json").stat().st_mtime_ns
    again = climb.stages.cluster.run(cfg, RunPaths(root))
    assert again["skipped_stage"] is True and again["docs"] == first["docs"]
    assert (root / "cluster" / "clusters.json").stat().st_mtime_ns == mtime
    # Embed is skipped too (the fake model is not called again).
    import climb.stages.embed
    seen = fake_model.texts_seen
    assert climb.stages.embed.run(cfg, RunPaths(root))["skipped_stage"] is True
    assert fake_model.texts_seen == seen

    changed = dataclasses.replace(cfg, cluster=dataclasses.replace(cfg.cluster, top_terms=2, exemplars=1))
    third = climb.stages.cluster.run(changed, RunPaths(root))
    assert "skipped_stage" not in third
    summ = _summary(root)
    assert all(len(c["top_terms"]) == 2 and len(c["exemplars"]) == 1 for c in summ["clusters"])
    # A config section other stages own does not invalidate the cluster stage.
    other = dataclasses.replace(changed, export=dataclasses.replace(changed.export, seed=5))
    assert climb.stages.cluster.run(other, RunPaths(root))["skipped_stage"] is True


def test_cluster_rerun_with_new_k_reassigns(tmp_path, corpus, fake_model):
    import climb.stages.cluster
    root = tmp_path / "run"
    _run(root, _cfg(corpus, k=3))
    stats = climb.stages.cluster.run(_cfg(corpus, k=5), RunPaths(root))
    assert "skipped_stage" not in stats
    a = _assignments(root)
    cents = np.load(root / "cluster" / "centroids.npy")
    assert cents.shape[0] == 5
    d2 = ((_embeddings(root)[:, None, :] - cents[None]) ** 2).sum(-1)
    np.testing.assert_array_equal(a["fine"], d2.argmin(1))
    assert stats["clusters"] == len(np.unique(a["fine"]))


def test_embed_rerun_after_corpus_change_reembeds(tmp_path, corpus, fake_model, write_shards):
    import climb.stages.embed
    root = tmp_path / "run"
    cfg = _cfg(corpus)
    assert climb.stages.embed.run(cfg, RunPaths(root))["docs"] == 3 * PER_VOCAB
    stamps = {p: p.stat().st_mtime_ns for p in corpus["files"]}
    write_shards(tmp_path / "corpus", corpus["docs"][:150], SHARDS, extra=("quality",))
    for p, ns in stamps.items():  # a coarse clock may give the rewrite the same mtime: make it differ
        if p.stat().st_mtime_ns == ns:
            os.utime(p, ns=(ns + 1000, ns + 1000))
    stats = climb.stages.embed.run(cfg, RunPaths(root))
    assert "skipped_stage" not in stats
    assert stats["docs"] == 150


def test_prune_small_clusters(tmp_path, corpus, fake_model):
    base = tmp_path / "base"
    _run(base, _cfg(corpus, k=6))
    fine = _assignments(base)["fine"]
    counts = np.bincount(fine, minlength=6)
    small = counts.min()
    threshold = int(small) + 1
    drop = np.flatnonzero(counts < threshold)
    assert 0 < len(drop) < 6 and counts[drop].sum() < len(fine)

    root = tmp_path / "pruned"
    stats = _run(root, _cfg(corpus, k=6, min_cluster_size=threshold))
    a = _assignments(root)
    np.testing.assert_array_equal(a["fine"], fine)  # same seed -> same k-means
    gone = np.isin(a["fine"], drop)
    assert (a["cluster"][gone] == -1).all() and (a["cluster"][~gone] >= 0).all()
    n_drop = int(counts[drop].sum())
    assert stats["pruned"] == n_drop == stats["pruned_small_docs"]
    assert stats["pruned_small_clusters"] == int((counts[drop] > 0).sum())
    assert stats["assigned"] == len(fine) - n_drop
    summ = _summary(root)
    assert summ["n_clusters"] == 6 - len(drop)
    assert sum(c["docs"] for c in summ["clusters"]) == len(fine) - n_drop
    assert all(summ["fine_to_cluster"][f] == -1 for f in drop)
    listed = sorted(f for c in summ["clusters"] for f in c["fine"])
    assert listed == sorted(set(range(6)) - set(drop.tolist()))
    # Pruned documents leave the byte totals and the exemplars.
    docs = _corpus_order(corpus)
    assert sum(c["bytes"] for c in summ["clusters"]) == sum(
        len(d["text"].encode()) for d, g in zip(docs, gone) if not g)
    dropped_ids = set(a["id"][gone])
    assert not any(e["id"] in dropped_ids for c in summ["clusters"] for e in c["exemplars"])


def test_prune_small_clusters_all_too_small(tmp_path, corpus, fake_model):
    from climb.io.files import InputError
    with pytest.raises(InputError, match=r"cluster\.min_cluster_size=1000"):
        _run(tmp_path / "run", _cfg(corpus, k=3, min_cluster_size=1000))


def test_prune_by_quality_column(tmp_path, corpus, fake_model):
    root = tmp_path / "run"
    stats = _run(root, _cfg(corpus, k=3, quality_column="quality", min_quality=0.5))
    docs = _corpus_order(corpus)
    q = np.array([d["quality"] for d in docs])
    a = _assignments(root)
    assert a["id"].tolist() == [d["id"] for d in docs]
    low = q < 0.5
    assert (a["cluster"][low] == -1).all() and (a["cluster"][~low] >= 0).all()
    assert stats["pruned_quality"] == stats["pruned"] == int(low.sum()) == len(docs) // 2
    assert stats["assigned"] == int((~low).sum())
    summ = _summary(root)
    assert sum(c["docs"] for c in summ["clusters"]) == int((~low).sum())
    assert sum(c["words"] for c in summ["clusters"]) == sum(len(d["text"].split()) for d, lo in zip(docs, low)
                                                          if not lo)
    # Quality pruning does not change which fine cluster a document is nearest to.
    labels = np.array([d["label"] for d in docs])
    assert adjusted_rand_score(labels, a["fine"]) == 1.0


def test_merge_to_two(tmp_path, corpus, fake_model, vocabs):
    root = tmp_path / "run"
    stats = _run(root, _cfg(corpus, k=6, merge_to=2))
    summ = _summary(root)
    a = _assignments(root)
    fine_counts = np.bincount(a["fine"], minlength=6)
    assert summ["n_clusters"] == 2 == stats["clusters"]
    members = [set(c["fine"]) for c in summ["clusters"]]
    assert members[0].isdisjoint(members[1])
    assert members[0] | members[1] == set(np.flatnonzero(fine_counts))  # every non-empty fine cluster
    for c, m in zip(summ["clusters"], members):
        # Each merged cluster is the union of its fine clusters.
        in_c = a["cluster"] == c["cluster"]
        assert set(a["fine"][in_c]) == m
        assert c["docs"] == int(fine_counts[sorted(m)].sum()) == int(in_c.sum())
        assert all(summ["fine_to_cluster"][f] == c["cluster"] for f in m)
    # Merging never splits a vocabulary: each lies inside one merged cluster.
    labels = np.array([d["label"] for d in _corpus_order(corpus)])
    for v in vocabs:
        assert len(set(a["cluster"][labels == v])) == 1
    assert len(set(a["cluster"])) == 2
    assert np.load(root / "cluster" / "cluster_centroids.npy").shape == (2, fake_model.dim)


def test_merge_to_recovers_vocabularies(tmp_path, corpus, fake_model):
    root = tmp_path / "run"
    _run(root, _cfg(corpus, k=6, merge_to=3))
    a = _assignments(root)
    labels = np.array([d["label"] for d in _corpus_order(corpus)])
    assert adjusted_rand_score(labels, a["cluster"]) == 1.0
    assert _summary(root)["n_clusters"] == 3


def test_plan_clusters_prunes_then_merges_by_threshold():
    from climb.stages.cluster import plan_clusters
    # Two directions, two fine centroids near each, one tiny cluster.
    cents = np.array([[1, 0.05, 0], [1, -0.05, 0], [0, 1, 0.05], [0, 1, -0.05], [0, 0, 1]], np.float32)
    counts = np.array([50, 40, 30, 20, 2])
    fine_to, info = plan_clusters(ClusterConfig(k=5, min_cluster_size=5, merge_threshold=0.1), cents, counts)
    assert fine_to.tolist() == [0, 0, 1, 1, -1]
    assert info == {"pruned_small_clusters": 1, "pruned_small_docs": 2}
    fine_to, _ = plan_clusters(ClusterConfig(k=5, merge_to=3), cents, counts)
    assert fine_to.tolist() == [0, 0, 1, 1, 2]
    fine_to, _ = plan_clusters(ClusterConfig(k=5), cents, counts)  # no merging asked
    assert fine_to.tolist() == [0, 1, 2, 3, 4]


def test_plan_clusters_merge_to_above_survivors_with_threshold():
    from climb.stages.cluster import plan_clusters
    # merge_to above the number of clusters: the threshold decides. Orthogonal centroids
    # are all at cosine distance 1 > 0.5, so none merge.
    cents = np.eye(3, dtype=np.float32)
    fine_to, _ = plan_clusters(ClusterConfig(k=3, merge_to=5, merge_threshold=0.5), cents, np.array([10, 10, 10]))
    assert fine_to.tolist() == [0, 1, 2]
    # Well-separated groups of fine centroids (4 directions, 5 noisy centroids each, in a
    # shuffled order) are recovered exactly, numbered by their first fine member.
    rng = np.random.default_rng(0)
    truth = rng.permutation(np.repeat(np.arange(4), 5))
    cents = (np.eye(8)[truth] + 0.05 * rng.normal(size=(20, 8))).astype(np.float32)
    fine_to, _ = plan_clusters(ClusterConfig(k=20, merge_to=30, merge_threshold=0.3), cents, np.full(20, 10))
    assert adjusted_rand_score(truth, fine_to) == 1.0
    first_seen = {t: i for i, t in enumerate(dict.fromkeys(truth.tolist()))}
    assert fine_to.tolist() == [first_seen[t] for t in truth]


def test_prune_by_fasttext_model(tmp_path, corpus, fake_model):
    """A fastText classifier's __label__hq probability is the quality score."""
    fasttext = pytest.importorskip("fasttext")
    docs = _corpus_order(corpus)
    train = tmp_path / "quality.txt"
    # "food" documents are low quality, the others high.
    train.write_text("".join(f"__label__{'lq' if d['label'] == 'food' else 'hq'} {d['text']}\n" for d in docs))
    model = fasttext.train_supervised(input=str(train), epoch=10, lr=0.5, wordNgrams=1, verbose=0, thread=1, seed=0)
    model.save_model(str(tmp_path / "quality.bin"))
    root = tmp_path / "run"
    stats = _run(root, _cfg(corpus, k=3, quality_fasttext=str(tmp_path / "quality.bin"), min_quality=0.5))
    a = _assignments(root)
    food = np.array([d["label"] == "food" for d in docs])
    assert (a["cluster"][food] == -1).all() and (a["cluster"][~food] >= 0).all()
    assert stats["pruned_quality"] == int(food.sum())


def test_assign_is_exact_at_near_ties_and_the_same_whatever_the_threads():
    """The nearest centroid by float64 distance, also for points all but equidistant from two
    centroids, and the same labels and distances with 1 or 2 FAISS threads."""
    import faiss

    from climb.stages.cluster.kmeans import assign
    rng = np.random.default_rng(0)
    d, k = 64, 32
    cents = rng.standard_normal((k, d)).astype(np.float32)
    x = rng.standard_normal((5000, d)).astype(np.float32)
    # Midpoints of centroid pairs, nudged by far less than float32 resolves in a distance.
    a, b = rng.integers(0, k, 500), rng.integers(0, k, 500)
    mid = (cents[a] + cents[b]) / 2 + 1e-7 * rng.standard_normal((500, d)).astype(np.float32)
    x = np.vstack([x, mid]).astype(np.float32)
    full = ((x.astype(np.float64)[:, None, :] - cents.astype(np.float64)[None]) ** 2).sum(-1)
    want = np.argmin(full, axis=1)
    runs = []
    threads = faiss.omp_get_max_threads()
    try:
        for t in (1, 2):
            faiss.omp_set_num_threads(t)
            runs.append(assign(x, cents, batch=1024))
    finally:
        faiss.omp_set_num_threads(threads)
    (l1, d1), (l2, d2) = runs
    np.testing.assert_array_equal(l1, want)
    np.testing.assert_array_equal(l1, l2)
    np.testing.assert_array_equal(d1, d2)
    np.testing.assert_allclose(d1, full[np.arange(len(x)), want], rtol=1e-6)


# --------------------------------------------------------------------------- embed.store_dtype

def test_float16_embeddings_half_the_disk_same_clusters(tmp_path, corpus, fake_model):
    """embed.store_dtype="float16": half the bytes per embedding, and k-means (computed in float32)
    on them gives the float32 run's clusters. k=16 on three vocabularies splits each vocabulary
    along arbitrary boundaries, so a rounding that moved documents would show here."""
    import climb.stages.cluster
    import climb.stages.embed
    runs = {}
    for dt in ("float32", "float16"):
        base = _cfg(corpus, k=16, merge_to=3)
        cfg = dataclasses.replace(base, embed=dataclasses.replace(base.embed, store_dtype=dt))
        runs[dt] = (tmp_path / dt, cfg, _run(tmp_path / dt, cfg))
    (r32, _, _), (r16, cfg16, _) = runs["float32"], runs["float16"]
    e32, e16 = _embeddings(r32), _embeddings(r16)
    assert e32.dtype == np.float32 and e16.dtype == np.float16
    np.testing.assert_allclose(e16.astype(np.float32), e32, atol=5e-4)  # half precision of unit vectors
    for s in range(SHARDS):
        f32, f16 = (r / "embed" / f"part-{s:05d}.npy" for r in (r32, r16))
        assert np.load(f16).nbytes * 2 == np.load(f32).nbytes
        assert f16.stat().st_size <= f32.stat().st_size / 2 + 128  # .npy header: up to 128 bytes each
    a32, a16 = _assignments(r32), _assignments(r16)
    assert a32["id"].tolist() == a16["id"].tolist()
    fine_moved = int((a32["fine"] != a16["fine"]).sum())
    cluster_moved = int((a32["cluster"] != a16["cluster"]).sum())
    assert (fine_moved, cluster_moved) == (0, 0), f"{fine_moved} fine, {cluster_moved} cluster of {len(a32['id'])}"
    np.testing.assert_allclose(a16["distance"], a32["distance"], atol=2e-3)
    # The stage's key holds the setting: switching it in one run folder embeds every shard
    # again (no folder mixes float32 and float16 shards), and the cluster stage runs again.
    cfg32 = runs["float32"][1]
    assert climb.stages.embed.key(cfg32, RunPaths(r16)) != climb.stages.embed.key(cfg16, RunPaths(r16))
    seen = fake_model.texts_seen
    stats = climb.stages.embed.run(cfg32, RunPaths(r16))
    assert "skipped_stage" not in stats and stats["store_dtype"] == "float32"
    assert fake_model.texts_seen - seen == 3 * PER_VOCAB
    assert {np.load(p, mmap_mode="r").dtype for p in (r16 / "embed").glob("*.npy")} == {np.dtype(np.float32)}
    assert "skipped_stage" not in climb.stages.cluster.run(cfg32, RunPaths(r16))


def test_float16_shard_left_by_another_setting_is_embedded_again(tmp_path, corpus, fake_model):
    """Even where a stage's folder kept a shard of the other element type, the shard is not resumed."""
    from climb.stages.embed import EmbedTask, embed_shard
    cfg = _cfg(corpus)
    out = tmp_path / "embed"
    out.mkdir()
    f16 = dataclasses.replace(cfg.embed, store_dtype="float16")
    task = EmbedTask(path=str(corpus["files"][0]), out_dir=str(out), corpus=cfg.corpus, embed=f16)
    assert embed_shard(task)["resumed"] is False
    assert embed_shard(task)["resumed"] is True
    again = embed_shard(dataclasses.replace(task, embed=cfg.embed))
    assert again["resumed"] is False
    assert np.load(out / "part-00000.npy").dtype == np.float32


def test_store_dtype_is_checked():
    from climb.config import ConfigError, load_config
    assert load_config(None, ['embed.store_dtype="float16"']).embed.store_dtype == "float16"
    with pytest.raises(ConfigError, match="store_dtype"):
        load_config(None, ['embed.store_dtype="bf16"'])


def _cluster_files(root: Path) -> dict[str, bytes]:
    d = root / "cluster"
    return {str(f.relative_to(d)): f.read_bytes() for f in sorted(d.rglob("*"))
            if f.is_file() and f.name not in ("manifest.json", "kmeans.json") and not f.name.startswith(".")}


def test_a_cluster_stage_stopped_after_kmeans_keeps_its_centroids(tmp_path, corpus, fake_model, monkeypatch):
    """Killed while assigning (after k-means, before the plan): the rerun fits nothing again,
    keeps the shard already assigned, and writes what an undisturbed run writes."""
    import climb.stages.cluster as cluster
    root = tmp_path / "run"
    cfg = _cfg(corpus, k=3)
    first = _run(root, cfg)
    undisturbed = _cluster_files(root)
    fit = json.loads((root / "cluster" / cluster.KMEANS_FIT).read_text())
    assert fit["kmeans"]["backend"] == first["kmeans"]["backend"] and len(fit["sources"]) == SHARDS
    # The state a kill during shard 1's assignment leaves: no manifest, plan or summary, shard 0
    # assigned, the rest not.
    for rel in ("manifest.json", "fitted.json", "clusters.json", "cluster_centroids.npy"):
        (root / "cluster" / rel).unlink()
    for s in (1, 2):
        for sub in ("fine", "assign"):
            (root / "cluster" / sub / f"part-{s:05d}.parquet").unlink()
    for f in (root / "cluster" / "summary_parts").glob("part-0000[12]*"):
        f.unlink()
    monkeypatch.setattr(cluster, "train_kmeans", lambda *a, **k: pytest.fail("k-means fitted again"))
    again = cluster.run(cfg, RunPaths(root))
    assert again["assigned_now"] == ["part-00001", "part-00002"]
    assert again["kmeans"] == first["kmeans"]  # the fit's stats, as the undisturbed run has them
    assert _cluster_files(root) == undisturbed

    # Stopped later (after the plan, while summarising): the plan kept, the fit's stats reported.
    (root / "cluster" / "manifest.json").unlink()
    (root / "cluster" / "clusters.json").unlink()
    later = cluster.run(cfg, RunPaths(root))
    assert later["kmeans"] == first["kmeans"] and _cluster_files(root) == undisturbed

    # A fit on other embeddings (a shard's vectors changed since) is not kept: k-means runs.
    for rel in ("manifest.json", "fitted.json"):
        (root / "cluster" / rel).unlink()
    fit["sources"]["part-00000"] = "another"
    (root / "cluster" / cluster.KMEANS_FIT).write_text(json.dumps(fit))
    fitted = []
    monkeypatch.setattr(cluster, "train_kmeans", lambda *a, **k: fitted.append(1) or train_kmeans(*a, **k))
    cluster.run(cfg, RunPaths(root))
    assert fitted == [1] and _cluster_files(root) == undisturbed
