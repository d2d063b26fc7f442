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
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from .config import ClusterConfig, RunConfig
from .embed import load_embeddings, load_ids, shard_files, shard_name
from .executor import make_executor
from .io import InputError, read_documents, read_json, write_json, write_parquet
from .kmeans import assign, train_kmeans
from .stage import RunPaths, begin, finish, is_done, skipped, stage_key, upstream_hash

log = logging.getLogger(__name__)
SNIPPET = 240


def _sample(embs: list[np.ndarray], n: int, seed: int) -> np.ndarray:
    sizes = np.array([len(e) for e in embs])
    total = int(sizes.sum())
    rng = np.random.default_rng(seed)
    idx = np.sort(rng.choice(total, size=min(n, total), replace=False))
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    parts = []
    for s, e in enumerate(embs):
        sel = idx[(idx >= offsets[s]) & (idx < offsets[s + 1])] - offsets[s]
        if len(sel):
            parts.append(np.asarray(e[sel], dtype=np.float32))
    return np.concatenate(parts)


def _hq_probability(model, text: str) -> float:
    # The low-level call: fastText's Python wrapper mangles the probability arrays under numpy 2.
    pairs = model.f.predict(text.replace("\n", " ") + "\n", -1, 0.0, "strict")
    return float(dict((label, p) for p, label in pairs).get("__label__hq", 0.0))


def _quality(task: dict, ids: list[str]) -> np.ndarray | None:
    cc, kc = task["corpus"], task["cluster"]
    if not (kc.quality_column or kc.quality_fasttext):
        return None
    extra = [kc.quality_column] if kc.quality_column else []
    scores, seen = [], []
    model = None
    if kc.quality_fasttext:
        import fasttext
        model = fasttext.load_model(kc.quality_fasttext)
    for b in read_documents(task["path"], cc.text_column, cc.id_column, extra, cc.batch_rows):
        seen += b.ids
        if kc.quality_column:
            scores += [float(x) if x is not None else float("nan") for x in b.extra[kc.quality_column]]
        else:
            scores += [_hq_probability(model, t) for t in b.texts]
    if seen != ids:
        raise InputError(f"{task['path']} changed since it was embedded; re-run `climb embed`")
    return np.asarray(scores, dtype=np.float32)


def assign_shard(task: dict) -> dict:
    """Nearest fine centroid (and quality score) for every document of one shard."""
    out = Path(task["out"])
    if out.exists():
        t = pq.read_table(out, columns=["fine"])
        return {"shard": task["shard"], "counts": np.bincount(t["fine"].to_numpy(), minlength=task["k"]).tolist()}
    emb = load_embeddings(Path(task["emb_dir"]), [task["shard"]])[0]
    ids = load_ids(Path(task["emb_dir"]), task["shard"])["id"].to_pylist()
    cents = np.load(task["centroids"])
    fine, dist = assign(np.asarray(emb, dtype=np.float32), cents)
    cols = {"id": pa.array(ids, pa.string()), "fine": pa.array(fine, pa.int32()),
            "distance": pa.array(dist, pa.float32())}
    q = _quality(task, ids)
    if q is not None:
        cols["quality"] = pa.array(q, pa.float32())
    write_parquet(out, pa.table(cols))
    return {"shard": task["shard"], "counts": np.bincount(fine, minlength=task["k"]).tolist()}


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


def finalise_shard(task: dict) -> dict:
    """Write the final cluster column and gather this shard's part of the summary."""
    fine_tab = pq.read_table(task["fine"])
    fine_to = np.asarray(task["fine_to"])
    fine = fine_tab["fine"].to_numpy()
    cluster = fine_to[fine]
    pruned_quality = 0
    if "quality" in fine_tab.column_names:
        bad = ~(fine_tab["quality"].to_numpy() >= task["min_quality"])
        pruned_quality = int((bad & (cluster >= 0)).sum())
        cluster = np.where(bad, -1, cluster)
    dist = fine_tab["distance"].to_numpy()
    table = pa.table({"id": fine_tab["id"], "fine": fine_tab["fine"],
                      "cluster": pa.array(cluster, pa.int32()), "distance": fine_tab["distance"]})
    write_parquet(task["out"], table)
    c = task["n_clusters"]
    bytes_, words = np.zeros(c, np.int64), np.zeros(c, np.int64)
    rng = np.random.default_rng(task["seed"])
    samples: dict[int, list[str]] = {}
    best: dict[int, list[tuple[float, str, str]]] = {}
    cc = task["corpus"]
    row = 0
    for b in read_documents(task["path"], cc.text_column, cc.id_column, batch_rows=cc.batch_rows):
        for doc_id, text in zip(b.ids, b.texts):
            cl = int(cluster[row])
            d = float(dist[row])
            row += 1
            if cl < 0:
                continue
            bytes_[cl] += len(text.encode("utf-8"))
            words[cl] += len(text.split())
            if rng.random() < task["sample_p"]:
                samples.setdefault(cl, []).append(text[:2000])
            ex = best.setdefault(cl, [])
            ex.append((d, doc_id, text[:SNIPPET]))
            ex.sort()
            del ex[task["exemplars"]:]
    if row != len(cluster):
        raise InputError(f"{task['path']} changed since it was embedded; re-run `climb embed`")
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


def stage_hash(cfg: RunConfig, paths: RunPaths) -> str:
    return stage_key(upstream_hash(paths, "embed"), cfg.cluster, cfg.corpus.text_column)


def run(cfg: RunConfig, paths: RunPaths) -> dict:
    key = stage_hash(cfg, paths)
    if is_done(paths, "cluster", key):
        return skipped(paths, "cluster")
    t0 = time.time()
    kc = cfg.cluster
    emb_dir, out = paths.root / "embed", begin(paths, "cluster", key)
    names = read_json(paths.manifest("embed"))["stats"]["shards"]
    files = {shard_name(f): f for f in paths.corpus_files(cfg)}
    embs = load_embeddings(emb_dir, names)
    n = sum(len(e) for e in embs)
    if n < kc.k:
        raise InputError(f"{n} documents but cluster.k={kc.k}: need at least as many documents as clusters; "
                         f"lower it (--set cluster.k={max(2, n // 10)}) or add documents")
    sample = _sample(embs, kc.sample_size, kc.seed)
    cents, kstats = train_kmeans(sample, kc.k, kc.niter, kc.seed)
    np.save(out / "centroids.npy", cents)
    base = {"corpus": cfg.corpus, "cluster": kc, "k": kc.k, "emb_dir": str(emb_dir),
            "centroids": str(out / "centroids.npy")}
    tasks = [dict(base, shard=s, path=str(files[s]), emb=str(shard_files(emb_dir, s)[0]),
                  out=str(out / "fine" / f"{s}.parquet")) for s in names]
    with make_executor(cfg.executor) as ex:
        parts = ex.map(assign_shard, tasks, desc="assign")
        counts = np.sum([p["counts"] for p in parts], axis=0)
        fine_to, prune = plan_clusters(kc, cents, counts)
        c = int(fine_to.max()) + 1
        sample_p = min(1.0, max(20, 20_000 // c) * c / n)
        ftasks = [dict(corpus=cfg.corpus, path=t["path"], fine=t["out"], out=str(out / "assign" / f"{t['shard']}.parquet"),
                       fine_to=fine_to.tolist(), min_quality=kc.min_quality, n_clusters=c, seed=kc.seed + i,
                       sample_p=sample_p, exemplars=kc.exemplars) for i, t in enumerate(tasks)]
        fin = ex.map(finalise_shard, ftasks, desc="summarise")
    docs = np.sum([f["docs"] for f in fin], axis=0)
    bytes_ = np.sum([f["bytes"] for f in fin], axis=0)
    words = np.sum([f["words"] for f in fin], axis=0)
    samples: dict[int, list[str]] = {}
    exemplars: dict[int, list] = {}
    for f in fin:
        for cl, ts in f["samples"].items():
            samples.setdefault(int(cl), []).extend(ts)
        for cl, ex_ in f["exemplars"].items():
            exemplars.setdefault(int(cl), []).extend(ex_)
    terms = top_terms(samples, c, kc.top_terms)
    merged = np.stack([np.average(cents[fine_to == i], axis=0, weights=counts[fine_to == i] + 1e-9) for i in range(c)])
    merged /= np.linalg.norm(merged, axis=1, keepdims=True) + 1e-12
    np.save(out / "cluster_centroids.npy", merged.astype(np.float32))
    clusters = [{"cluster": i, "fine": np.flatnonzero(fine_to == i).tolist(), "docs": int(docs[i]),
                 "bytes": int(bytes_[i]), "words": int(words[i]), "top_terms": terms[i],
                 "exemplars": [{"id": e[1], "distance": round(e[0], 4), "text": e[2]}
                               for e in sorted(exemplars.get(i, []))[: kc.exemplars]]} for i in range(c)]
    write_json(out / "clusters.json", {"n_clusters": c, "k": kc.k, "clusters": clusters,
                                       "fine_to_cluster": fine_to.tolist()})
    pruned = int(sum(f["pruned"] for f in fin))
    stats = {"docs": n, "k": kc.k, "clusters": c, "assigned": int(docs.sum()), "pruned": pruned,
             "pruned_quality": int(sum(f["pruned_quality"] for f in fin)), **prune, "kmeans": kstats,
             "shards": names}
    log.info("cluster: %d docs -> %d fine -> %d clusters (%d pruned); k-means %.1fs on %s",
             n, kc.k, c, pruned, kstats["seconds"], kstats["backend"])
    return finish(paths, "cluster", key, stats, t0, digest_files=("clusters.json",))


def load_assignments(paths: RunPaths, shard: str) -> pa.Table:
    path = paths.root / "cluster" / "assign" / f"{shard}.parquet"
    try:
        return pq.read_table(path)
    except (OSError, pa.ArrowInvalid) as e:
        raise InputError(f"{path}: cannot read the cluster assignments ({e}); run `climb cluster` "
                         "(same --config and --run) to re-create them") from None
