"""Stage 2, cluster: k-means on a sample, assign everything, prune, merge, summarise.

Reads: `<run>/embed/` and the corpus (texts for top terms, exemplars and duplicates).
Writes: `<run>/cluster/`: `centroids.npy`, `cluster_centroids.npy`, `clusters.json`,
`fitted.json`, `fine/` and `assign/` per shard.
Rooms: `kmeans` (FAISS / torch k-means and assignment), `dedup` (exact and near duplicates).

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

When only the corpus changed since the centroids were fitted (a shard added or
replaced; the settings the same), the centroids and the fine -> cluster plan are kept
(`fitted.json` says what they were fitted on), only the new or changed shards are
assigned (each shard's files record the embeddings they came from), and the stats say
how far the new documents lie from their centroids against those fitted on (`drift`);
`cluster.refit = true` fits k-means again instead. A stage stopped after k-means keeps the
centroids it fitted (`kmeans.json`) and the shards it assigned.

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
from climb.io.files import InputError, read_aligned, read_json, write_json, write_npy, write_parquet
from climb.runtime.stage import execute, output_digest, upstream_key, upstream_resume
from climb.runtime.layout import RunPaths
from climb.stages.cluster.dedup import text_hash
from climb.stages.embed import load_embeddings, load_ids
from climb.stages.cluster.kmeans import assign, train_kmeans

log = logging.getLogger(__name__)
# The k-means fit (its embeddings' digests and stats), written once the centroids are: a stage
# stopped after it keeps the centroids rather than fitting them again.
KMEANS_FIT = "kmeans.json"
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
    # The shard's embeddings (their digest), kept in the assignment file's metadata: a shard
    # whose embeddings changed is assigned again when the stage keeps its centroids.
    source: str = ""


def _source(path: Path) -> str | None:
    meta = pq.read_metadata(path).metadata or {}
    return meta.get(b"source", b"").decode() or None


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
    if out.exists() and (not task.source or _source(out) == task.source):
        t = pq.read_table(out, columns=["fine", "distance"])
        return {"shard": task.shard, "counts": np.bincount(t["fine"].to_numpy(), minlength=k).tolist(),
                "distance_sum": float(np.sum(t["distance"].to_numpy(), dtype=np.float64)), "assigned_now": False}
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
    table = pa.table(cols)
    if task.source:
        table = table.replace_schema_metadata({"source": task.source})
    write_parquet(out, table)
    return {"shard": task.shard, "counts": np.bincount(fine, minlength=k).tolist(),
            "distance_sum": float(np.sum(dist, dtype=np.float64)), "assigned_now": True}


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
    # Where this shard's part of the summary is kept, and what it was made from: a shard
    # whose assignments and plan are unchanged is not summarised (nor its text read) again.
    cache: str = ""
    cache_key: str = ""
    hashes: str = ""  # where each document's text hash goes (climb.stages.cluster.dedup.text_hash; 0: pruned)


def finalise_shard(task: SummariseTask) -> dict:
    """Write the final cluster column and gather this shard's part of the summary."""
    if (task.cache and Path(task.cache).exists() and Path(task.out).exists()
            and (not task.hashes or Path(task.hashes).exists())):
        try:
            kept = read_json(task.cache)
        except ValueError:
            kept = {}
        if kept.get("key") == task.cache_key:
            return kept["part"]
    part = _finalise(task)
    if task.cache:
        write_json(task.cache, {"key": task.cache_key, "part": part})
    return part


def _finalise(task: SummariseTask) -> dict:
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
    hashes = np.zeros(len(cluster), dtype=np.int64)
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
            if task.hashes:
                hashes[row] = text_hash(text)
            bytes_[cl] += len(text.encode("utf-8"))
            words[cl] += len(text.split())
            if rng.random() < task.sample_p:
                samples.setdefault(cl, []).append(text[:2000])
            nearest = best.setdefault(cl, [])
            nearest.append((float(dist[row]), doc_id, text[:SNIPPET]))
            nearest.sort()
            del nearest[task.exemplars:]
    if task.hashes:
        from climb.io.files import write_npy
        write_npy(task.hashes, hashes)
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
    return digest(upstream_key(paths, "embed"), cfg.cluster, cfg.corpus.text_column, *_dedup_part(cfg))


def _dedup_part(cfg: RunConfig) -> list:
    """[dedup] in the key: left out at its defaults, so run folders from before it keep their keys."""
    from climb.config import DedupConfig
    return [] if cfg.dedup == DedupConfig() else [cfg.dedup]


def run(cfg: RunConfig, paths: RunPaths) -> dict:
    return execute(paths, "cluster", key(cfg, paths), lambda folder, ex: _cluster(cfg, paths, ex),
                   executor=cfg.executor, digest_files=("clusters.json",), resume_key=resume_key(cfg, paths))


def resume_key(cfg: RunConfig, paths: RunPaths) -> str | None:
    """What the centroids depend on besides the corpus: the settings and the embeddings' own
    settings (None with cluster.refit: any change fits them again)."""
    if cfg.cluster.refit:
        return None
    return digest(upstream_resume(paths, "embed"), cfg.cluster, cfg.corpus.text_column)


def _kept_fit(paths: RunPaths, resumable: bool) -> dict | None:
    """The centroids and plan of an earlier run of these settings, if the stage keeps them."""
    out = paths.cluster
    if not resumable or not (out.centroids.exists() and out.fitted.exists()):
        return None
    try:
        return read_json(out.fitted)
    except ValueError:
        return None


def _fit_in_flight(paths: RunPaths, sources: dict) -> dict | None:
    """The k-means fit of this stage's run that stopped before its plan (`fitted.json`) was
    written, if it was fitted on these very embeddings: begin() removed it had the settings
    changed."""
    out = paths.cluster
    record = out.dir / KMEANS_FIT
    if not (record.exists() and out.centroids.exists()):
        return None
    try:
        fit = read_json(record)
    except ValueError:
        return None
    return fit if fit.get("sources") == sources else None


def _drop_stale(paths: RunPaths, names: list[str]) -> None:
    """A shard that left the corpus takes its assignments and summary part with it."""
    out = paths.cluster
    keep = set(names)
    for folder, suffix in (("fine", ".parquet"), ("assign", ".parquet"), ("summary_parts", ".json")):
        for f in (out.dir / folder).glob(f"*{suffix}") if (out.dir / folder).exists() else ():
            if f.name[: -len(suffix)] not in keep:
                f.unlink()


def _cluster(cfg: RunConfig, paths: RunPaths, ex) -> dict:
    settings, out = cfg.cluster, paths.cluster
    names = paths.shards()
    files = paths.shard_files(cfg)
    sizes = [len(e) for e in load_embeddings(paths, names)]  # headers only: nothing is read
    n = sum(sizes)
    if n < settings.k:
        raise InputError(f"{n} documents but cluster.k={settings.k}: need at least as many documents as clusters; "
                         f"lower it (--set cluster.k={max(2, n // 10)}) or add documents")
    # begin() left the centroids only where the settings are those they were fitted with
    kept = _kept_fit(paths, resume_key(cfg, paths) is not None)
    _drop_stale(paths, names)
    sources = {s: output_digest(paths, "embed", f"{s}.npy") or "" for s in names}
    fit = _fit_in_flight(paths, sources)
    if kept is None and fit is not None:  # a run stopped after k-means: its centroids stand, the shards assigned stay
        cents, kstats = np.load(out.centroids), fit["kmeans"]
        log.info("cluster: the centroids fitted before the stage stopped are kept (k-means not run again)")
    elif kept is None:
        sample = _sample(paths, names, sizes, settings.sample_size, settings.seed)
        cents, kstats = train_kmeans(sample, settings.k, settings.niter, settings.seed)
        write_npy(out.centroids, cents)
        write_json(out.dir / KMEANS_FIT, {"sources": sources, "kmeans": kstats})
    else:
        cents = np.load(out.centroids)
        # Fitted on these very embeddings (a run stopped after its plan): that fit's stats.
        kstats = fit["kmeans"] if fit is not None else {"seconds": 0.0, "backend": "kept", "fitted_on": kept["shards"]}
    from climb.io.digests import file_digest
    fitted_to = file_digest(out.centroids)  # an assignment is of these embeddings to these centroids
    tasks = [AssignTask(shard=s, path=str(files[s]), run_dir=str(paths.root), corpus=cfg.corpus, cluster=settings,
                        centroids=str(out.centroids), out=str(out.fine(s)), source=f"{sources[s]}:{fitted_to}")
             for s in names]
    parts = ex.map(assign_shard, tasks, desc="assign")
    counts = np.sum([p["counts"] for p in parts], axis=0)
    if kept is None:
        fine_to, prune = plan_clusters(settings, cents, counts)
        kept = {"shards": names, "sources": sources, "fine_to": fine_to.tolist(), "prune": prune}
        write_json(out.fitted, kept)
    fine_to, prune = np.asarray(kept["fine_to"]), kept["prune"]
    drift = _drift(parts, sizes, names, sources, kept)
    c = int(fine_to.max()) + 1
    sample_p = min(1.0, max(20, 20_000 // c) * c / n)
    plan = digest(kept["fine_to"], settings.min_quality, settings.exemplars, settings.quality_column,
                  settings.quality_fasttext, cfg.dedup.exact)
    summarise = [SummariseTask(path=t.path, corpus=cfg.corpus, fine=t.out, out=str(out.assignments(t.shard)),
                               fine_to=tuple(fine_to.tolist()), min_quality=settings.min_quality, n_clusters=c,
                               seed=settings.seed + i, sample_p=sample_p, exemplars=settings.exemplars,
                               cache=str(out.shard_summary(t.shard)), cache_key=digest(plan, t.source),
                               hashes=str(out.text_hashes(t.shard)) if cfg.dedup.exact else "")
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
            exemplars.setdefault(int(cl), []).extend(tuple(e) for e in nearest)
    terms = top_terms(samples, c, settings.top_terms)
    merged = np.stack([np.average(cents[fine_to == i], axis=0, weights=counts[fine_to == i] + 1e-9)
                       for i in range(c)])
    merged /= np.linalg.norm(merged, axis=1, keepdims=True) + 1e-12
    np.save(out.cluster_centroids, merged.astype(np.float32))
    dups = _dedup(cfg, paths, names, c)
    clusters = [{"cluster": i, "fine": np.flatnonzero(fine_to == i).tolist(), "docs": int(docs[i]),
                 "bytes": int(bytes_[i]), "words": int(words[i]), "top_terms": terms[i],
                 "exemplars": [{"id": e[1], "distance": round(e[0], 4), "text": e[2]}
                               for e in sorted(exemplars.get(i, []))[: settings.exemplars]],
                 **({"duplicates": {"exact": dups["exact"][i], "near": dups["near"][i]},
                     "docs_distinct": dups["docs"][i] - dups["exact"][i] - dups["near"][i],
                     "bytes_distinct": dups["bytes_distinct"][i]} if dups else {})} for i in range(c)]
    write_json(out.summary, {"n_clusters": c, "k": settings.k, "clusters": clusters,
                             "fine_to_cluster": fine_to.tolist(), **({"drift": drift} if drift else {})})
    pruned = int(sum(f["pruned"] for f in shard_parts))
    if dups:
        total = sum(dups["docs"])
        found = sum(dups["exact"]) + sum(dups["near"])
        dedup_stats = {"exact": sum(dups["exact"]), "near": sum(dups["near"]), "rate": round(found / max(1, total), 6),
                       "dropped": found if cfg.dedup.drop else 0}
        log.info("dedup: %d exact and %d near duplicates of %d documents (%.2f%%)%s", dedup_stats["exact"],
                 dedup_stats["near"], total, 100 * dedup_stats["rate"], "; dropped" if cfg.dedup.drop else "")
    stats = {"docs": n, "k": settings.k, "clusters": c, "assigned": int(docs.sum()), "pruned": pruned,
             **({"duplicates": dedup_stats} if dups else {}),
             "pruned_quality": int(sum(f["pruned_quality"] for f in shard_parts)), **prune, "kmeans": kstats,
             "shards": names, "assigned_now": [p["shard"] for p in parts if p.get("assigned_now")],
             **({"drift": drift} if drift else {})}
    log.info("cluster: %d docs -> %d fine -> %d clusters (%d pruned); k-means %.1fs on %s%s",
             n, settings.k, c, pruned, kstats["seconds"], kstats["backend"],
             f"; {drift['message']}" if drift else "")
    return stats


def _dedup(cfg: RunConfig, paths: RunPaths, names: list[str], n_clusters: int) -> dict | None:
    """Find the duplicates (climb.stages.cluster.dedup), mark them in the assignment files (and drop them
    from their clusters with dedup.drop); their counts per cluster (None: dedup off)."""
    from climb.stages.cluster.dedup import dedup
    d = cfg.dedup
    if not d.exact and not d.threshold:
        return None
    return dedup(d, paths, names, cfg.cluster.k, n_clusters)


def _drift(parts: list[dict], sizes: list[int], names: list[str], sources: dict, fitted: dict) -> dict | None:
    """How far the documents of shards the centroids were not fitted on (added since, or whose
    embeddings changed) lie from them, against those they were fitted on: the mean distance to
    the nearest fine centroid. None when the centroids were fitted on every shard as it is."""
    fit = fitted.get("sources", {})
    was = [s in fitted["shards"] and (not fit.get(s) or fit.get(s) == sources[s]) for s in names]
    if all(was) or not any(was):
        return None

    def mean(sel: list[bool]) -> float:
        num = sum(p.get("distance_sum", 0.0) for p, keep in zip(parts, sel) if keep)
        return num / max(1, sum(n for n, keep in zip(sizes, sel) if keep))
    d_old, d_new = mean(was), mean([not w for w in was])
    ratio = d_new / d_old if d_old > 0 else None
    new = [s for s, w in zip(names, was) if not w]
    msg = (f"{len(new)} shard(s) not among those the centroids were fitted on lie at mean distance {d_new:.4f} "
           f"from their nearest centroid, against {d_old:.4f} for those fitted on")
    if ratio is not None and ratio > DRIFT_WARN:
        msg += f" ({ratio:.2f}x: the corpus has drifted from the centroids; cluster.refit = true fits them again)"
        log.warning("cluster: %s", msg)
    return {"new_shards": new, "mean_distance_new": round(d_new, 6), "mean_distance_fitted": round(d_old, 6),
            "ratio": round(ratio, 4) if ratio else None, "drifted": bool(ratio and ratio > DRIFT_WARN),
            "message": msg}


# A corpus whose new documents lie this much further from the centroids than those fitted on
# is said to have drifted from them.
DRIFT_WARN = 1.1


def load_assignments(paths: RunPaths, shard: str) -> pa.Table:
    return read_assignments(paths.cluster.assignments(shard))


def read_assignments(path: Path) -> pa.Table:
    try:
        return pq.read_table(path)
    except (OSError, pa.ArrowInvalid) as e:
        raise InputError(f"{path}: cannot read the cluster assignments ({e}); run `climb cluster` "
                         "(same --config and --run) to re-create them") from None
