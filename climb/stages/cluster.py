"""Stage 2, cluster: k-means on a sample, assign everything, prune, merge, summarise.

1. Train k-means (FAISS; on GPU where faiss has one, else a torch path on CUDA,
   else FAISS on CPU) on `cluster.sample_size` embeddings drawn across shards.
2. Assign every document to its nearest centroid, per shard (`fine/<shard>.parquet`).
3. Prune fine clusters: documents below a quality score (a corpus column or a
   fastText model) and clusters smaller than `min_cluster_size`. Pruned documents
   get cluster -1 and are counted.
4. Merge the surviving centroids agglomeratively (cosine, average linkage) to
   `merge_to` clusters or by `merge_threshold`.
5. Write `assign/<shard>.parquet` (id, fine, cluster, distance), `centroids.npy`,
   and `clusters.json`: per cluster its documents, bytes, words, top TF-IDF terms
   and exemplar snippets.

    climb cluster --config pipelines/demo.toml --run runs/demo
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from climb.config import ClusterConfig, CorpusConfig, RunConfig, digest
from climb.io.files import InputError, read_aligned, write_json, write_parquet
from climb.runtime.stage import RunPaths, execute, upstream_key
from climb.stages.embed import load_embeddings, load_ids
from climb.stages.kmeans import assign, train_kmeans

log = logging.getLogger(__name__)
SNIPPET = 240


def _sample(paths: RunPaths, names: list[str], sizes: list[int], n: int, seed: int) -> np.ndarray:
    """A seeded uniform sample of n embeddings over all shards, read one shard at a time:
    each shard is mapped only while its rows are copied, so the pages it touches leave
    this process with it (mapping every shard at once held about the whole corpus's
    embeddings resident: 1.75 GB at a million documents)."""
    total = int(sum(sizes))
    rng = np.random.default_rng(seed)
    idx = np.sort(rng.choice(total, size=min(n, total), replace=False))
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    parts = []
    for s, name in enumerate(names):
        sel = idx[(idx >= offsets[s]) & (idx < offsets[s + 1])] - offsets[s]
        if len(sel):
            e = load_embeddings(paths, [name])[0]
            parts.append(np.asarray(e[sel], dtype=np.float32))
            del e
    return np.concatenate(parts)


def _hq_probability(model, text: str) -> float:
    # The low-level call: fastText's Python wrapper mangles the probability arrays under numpy 2.
    pairs = model.f.predict(text.replace("\n", " ") + "\n", -1, 0.0, "strict")
    return float(dict((label, p) for p, label in pairs).get("__label__hq", 0.0))


@dataclass(frozen=True)
class AssignTask:
    """One shard's documents to assign to their nearest fine centroid (and to score for quality)."""
    shard: str
    path: str
    run_dir: str
    corpus: CorpusConfig
    cluster: ClusterConfig
    centroids: str
    out: str


def _quality(task: AssignTask, ids: list[str]) -> np.ndarray | None:
    corpus, settings = task.corpus, task.cluster
    if not (settings.quality_column or settings.quality_fasttext):
        return None
    extra = [settings.quality_column] if settings.quality_column else []
    scores = []
    model = None
    if settings.quality_fasttext:
        import fasttext
        model = fasttext.load_model(settings.quality_fasttext)
    for _, b in read_aligned(task.path, corpus, len(ids), ids, extra):
        if settings.quality_column:
            scores += [float(x) if x is not None else float("nan") for x in b.extra[settings.quality_column]]
        else:
            scores += [_hq_probability(model, t) for t in b.texts]
    return np.asarray(scores, dtype=np.float32)


def assign_shard(task: AssignTask) -> dict:
    """Nearest fine centroid (and quality score) for every document of one shard."""
    out, k = Path(task.out), task.cluster.k
    if out.exists():
        t = pq.read_table(out, columns=["fine"])
        return {"shard": task.shard, "counts": np.bincount(t["fine"].to_numpy(), minlength=k).tolist()}
    paths = RunPaths(Path(task.run_dir))
    emb = load_embeddings(paths, [task.shard])[0]
    ids = load_ids(paths, task.shard)["id"].to_pylist()
    cents = np.load(task.centroids)
    fine, dist = assign(np.asarray(emb, dtype=np.float32), cents)
    cols = {"id": pa.array(ids, pa.string()), "fine": pa.array(fine, pa.int32()),
            "distance": pa.array(dist, pa.float32())}
    q = _quality(task, ids)
    if q is not None:
        cols["quality"] = pa.array(q, pa.float32())
    write_parquet(out, pa.table(cols))
    return {"shard": task.shard, "counts": np.bincount(fine, minlength=k).tolist()}


def plan_clusters(cfg: ClusterConfig, centroids: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, dict]:
    """Map fine cluster -> final cluster (-1 = pruned) by size pruning then merging."""
    k = len(centroids)
    keep = counts >= max(cfg.min_cluster_size, 1)
    fine_to = np.full(k, -1, dtype=np.int64)
    kept = np.flatnonzero(keep)
    if len(kept) == 0:
        raise InputError(f"every cluster is smaller than cluster.min_cluster_size={cfg.min_cluster_size}; lower it")
    by_count = bool(cfg.merge_to) and cfg.merge_to < len(kept)
    if by_count or cfg.merge_threshold > 0:
        from sklearn.cluster import AgglomerativeClustering
        agg = AgglomerativeClustering(
            n_clusters=cfg.merge_to if by_count else None,
            distance_threshold=None if by_count else cfg.merge_threshold,
            metric="cosine", linkage="average")
        labels = agg.fit_predict(centroids[kept]) if len(kept) > 1 else np.zeros(1, int)
    else:
        labels = np.arange(len(kept))
    # Number merged clusters by their first fine member so ids are stable for a seed.
    order = {lab: i for i, lab in enumerate(dict.fromkeys(labels.tolist()))}
    fine_to[kept] = [order[lab] for lab in labels]
    return fine_to, {"pruned_small_clusters": int((~keep & (counts > 0)).sum()),
                     "pruned_small_docs": int(counts[~keep].sum())}


@dataclass(frozen=True)
class SummariseTask:
    """One shard's final clusters to write, and its part of the cluster summary to gather."""
    path: str
    corpus: CorpusConfig
    fine: str  # the shard's fine assignments (AssignTask.out)
    out: str
    fine_to: tuple[int, ...]  # fine cluster -> final cluster (-1: pruned)
    min_quality: float
    n_clusters: int
    seed: int
    sample_p: float  # chance that a document is sampled for the top terms
    exemplars: int


def finalise_shard(task: SummariseTask) -> dict:
    """Write the final cluster column and gather this shard's part of the summary."""
    fine_tab = pq.read_table(task.fine)
    fine_to = np.asarray(task.fine_to)
    fine = fine_tab["fine"].to_numpy()
    cluster = fine_to[fine]
    pruned_quality = 0
    if "quality" in fine_tab.column_names:
        bad = ~(fine_tab["quality"].to_numpy() >= task.min_quality)
        pruned_quality = int((bad & (cluster >= 0)).sum())
        cluster = np.where(bad, -1, cluster)
    dist = fine_tab["distance"].to_numpy()
    table = pa.table({"id": fine_tab["id"], "fine": fine_tab["fine"],
                      "cluster": pa.array(cluster, pa.int32()), "distance": fine_tab["distance"]})
    write_parquet(task.out, table)
    c = task.n_clusters
    bytes_, words = np.zeros(c, np.int64), np.zeros(c, np.int64)
    rng = np.random.default_rng(task.seed)
    samples: dict[int, list[str]] = {}
    best: dict[int, list[tuple[float, str, str]]] = {}
    for start, b in read_aligned(task.path, task.corpus, len(cluster)):
        for row, (doc_id, text) in enumerate(zip(b.ids, b.texts), start):
            cl = int(cluster[row])
            if cl < 0:
                continue
            bytes_[cl] += len(text.encode("utf-8"))
            words[cl] += len(text.split())
            if rng.random() < task.sample_p:
                samples.setdefault(cl, []).append(text[:2000])
            nearest = best.setdefault(cl, [])
            nearest.append((float(dist[row]), doc_id, text[:SNIPPET]))
            nearest.sort()
            del nearest[task.exemplars:]
    return {"bytes": bytes_.tolist(), "words": words.tolist(), "samples": samples, "exemplars": best,
            "docs": np.bincount(cluster[cluster >= 0], minlength=c).tolist(),
            "pruned_quality": pruned_quality, "pruned": int((cluster < 0).sum())}


def top_terms(samples: dict[int, list[str]], n_clusters: int, n_terms: int) -> list[list[str]]:
    from sklearn.feature_extraction.text import TfidfVectorizer
    texts, owner = [], []
    for c, ts in samples.items():
        texts += ts
        owner += [c] * len(ts)
    if not texts:
        return [[] for _ in range(n_clusters)]
    vec = TfidfVectorizer(max_features=50_000, stop_words="english", sublinear_tf=True,
                          token_pattern=r"(?u)\b[a-zA-Z][a-zA-Z]+\b", min_df=2 if len(texts) > 50 else 1)
    x = vec.fit_transform(texts)
    vocab = np.array(vec.get_feature_names_out())
    owner_arr = np.array(owner)
    out = []
    for c in range(n_clusters):
        rows = np.flatnonzero(owner_arr == c)
        if len(rows) == 0:
            out.append([])
            continue
        mean = np.asarray(x[rows].mean(axis=0)).ravel()
        out.append(vocab[np.argsort(-mean)[:n_terms]].tolist())
    return out


def key(cfg: RunConfig, paths: RunPaths) -> str:
    return digest(upstream_key(paths, "embed"), cfg.cluster, cfg.corpus.text_column)


def run(cfg: RunConfig, paths: RunPaths) -> dict:
    return execute(paths, "cluster", key(cfg, paths), lambda folder, ex: _cluster(cfg, paths, ex),
                   executor=cfg.executor, digest_files=("clusters.json",))


def _cluster(cfg: RunConfig, paths: RunPaths, ex) -> dict:
    settings, out = cfg.cluster, paths.cluster
    names = paths.shards()
    files = paths.shard_files(cfg)
    sizes = [len(e) for e in load_embeddings(paths, names)]  # headers only: nothing is read
    n = sum(sizes)
    if n < settings.k:
        raise InputError(f"{n} documents but cluster.k={settings.k}: need at least as many documents as clusters; "
                         f"lower it (--set cluster.k={max(2, n // 10)}) or add documents")
    sample = _sample(paths, names, sizes, settings.sample_size, settings.seed)
    cents, kstats = train_kmeans(sample, settings.k, settings.niter, settings.seed)
    np.save(out.centroids, cents)
    tasks = [AssignTask(shard=s, path=str(files[s]), run_dir=str(paths.root), corpus=cfg.corpus, cluster=settings,
                        centroids=str(out.centroids), out=str(out.fine(s))) for s in names]
    parts = ex.map(assign_shard, tasks, desc="assign")
    counts = np.sum([p["counts"] for p in parts], axis=0)
    fine_to, prune = plan_clusters(settings, cents, counts)
    c = int(fine_to.max()) + 1
    sample_p = min(1.0, max(20, 20_000 // c) * c / n)
    summarise = [SummariseTask(path=t.path, corpus=cfg.corpus, fine=t.out, out=str(out.assignments(t.shard)),
                               fine_to=tuple(fine_to.tolist()), min_quality=settings.min_quality, n_clusters=c,
                               seed=settings.seed + i, sample_p=sample_p, exemplars=settings.exemplars)
                 for i, t in enumerate(tasks)]
    shard_parts = ex.map(finalise_shard, summarise, desc="summarise")
    docs = np.sum([f["docs"] for f in shard_parts], axis=0)
    bytes_ = np.sum([f["bytes"] for f in shard_parts], axis=0)
    words = np.sum([f["words"] for f in shard_parts], axis=0)
    samples: dict[int, list[str]] = {}
    exemplars: dict[int, list] = {}
    for f in shard_parts:
        for cl, ts in f["samples"].items():
            samples.setdefault(int(cl), []).extend(ts)
        for cl, nearest in f["exemplars"].items():
            exemplars.setdefault(int(cl), []).extend(nearest)
    terms = top_terms(samples, c, settings.top_terms)
    merged = np.stack([np.average(cents[fine_to == i], axis=0, weights=counts[fine_to == i] + 1e-9)
                       for i in range(c)])
    merged /= np.linalg.norm(merged, axis=1, keepdims=True) + 1e-12
    np.save(out.cluster_centroids, merged.astype(np.float32))
    clusters = [{"cluster": i, "fine": np.flatnonzero(fine_to == i).tolist(), "docs": int(docs[i]),
                 "bytes": int(bytes_[i]), "words": int(words[i]), "top_terms": terms[i],
                 "exemplars": [{"id": e[1], "distance": round(e[0], 4), "text": e[2]}
                               for e in sorted(exemplars.get(i, []))[: settings.exemplars]]} for i in range(c)]
    write_json(out.summary, {"n_clusters": c, "k": settings.k, "clusters": clusters,
                             "fine_to_cluster": fine_to.tolist()})
    pruned = int(sum(f["pruned"] for f in shard_parts))
    stats = {"docs": n, "k": settings.k, "clusters": c, "assigned": int(docs.sum()), "pruned": pruned,
             "pruned_quality": int(sum(f["pruned_quality"] for f in shard_parts)), **prune, "kmeans": kstats,
             "shards": names}
    log.info("cluster: %d docs -> %d fine -> %d clusters (%d pruned); k-means %.1fs on %s",
             n, settings.k, c, pruned, kstats["seconds"], kstats["backend"])
    return stats


def load_assignments(paths: RunPaths, shard: str) -> pa.Table:
    return read_assignments(paths.cluster.assignments(shard))


def read_assignments(path: Path) -> pa.Table:
    try:
        return pq.read_table(path)
    except (OSError, pa.ArrowInvalid) as e:
        raise InputError(f"{path}: cannot read the cluster assignments ({e}); run `climb cluster` "
                         "(same --config and --run) to re-create them") from None
