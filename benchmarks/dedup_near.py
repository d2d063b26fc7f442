"""Near duplicates in a large fine cluster: the IVF search (climb.stages.cluster.dedup.ivf_pairs,
above NEAR_EXACT_MAX documents: list by list, one matrix product a list) against FAISS's
per-query search of the same lists (what the near pass ran before) and the exact flat
search, on a synthetic fine cluster of `--n` vectors with planted near duplicates. Recall of
the exact search's pairs over the threshold, of its flagged duplicates (with the same kept
document), false pairs (none: each candidate's cosine is computed exactly), whether the two
IVF searches return the same pairs, speed-ups measured side by side, and whether the result
depends on the thread count (FAISS's and BLAS's). `--sizes` times the searches at other sizes (the flat one
only up to `--flat-max`) for the choice of NEAR_EXACT_MAX. `--vectors` takes a real fine
cluster's embeddings (an .npy of L2-normalised rows in corpus order) instead.

    python benchmarks/dedup_near.py --n 50000 --sizes 5000,10000,20000,40000,156000 \\
        --json benchmarks/results/dedup_near.json

The synthetic cluster: a centre, 300 subtopics around it, each document a subtopic plus
noise (cosine ~0.35 between documents of the cluster, ~0.6 within a subtopic); 5% of the
documents are copies of an earlier one with noise (cosine 0.95-0.99 with it), a fifth of
those copies of copies (groups of three and more).
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np


def synthetic(n: int, d: int = 384, seed: int = 0) -> tuple[np.ndarray, int]:
    rng = np.random.default_rng(seed)
    centre = rng.standard_normal(d)
    centre /= np.linalg.norm(centre)
    subtopics = centre + 0.9 * rng.standard_normal((300, d)) / np.sqrt(d)
    x = subtopics[rng.integers(300, size=n)] + 1.0 * rng.standard_normal((n, d)) / np.sqrt(d)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    copies = np.sort(rng.choice(np.arange(1, n), n // 20, replace=False))
    for i, j in enumerate(copies):
        src = x[j - 1] if i % 5 == 0 else x[rng.integers(j)]
        noise = rng.uniform(0.1, 0.33)  # cosine 1/sqrt(1 + noise^2): 0.95-0.995
        x[j] = src + noise * rng.standard_normal(d) / np.sqrt(d)
        x[j] /= np.linalg.norm(x[j])
    return x.astype(np.float32), len(copies)


def per_query_ivf(x: np.ndarray, threshold: float, neighbors: int) -> tuple[np.ndarray, np.ndarray]:
    """The baseline: the same IVF lists searched query by query by FAISS (IndexIVFFlat.search,
    what the near pass ran before `ivf_pairs`), the pairs over the threshold."""
    import faiss

    from climb.stages.cluster import dedup
    n, d = x.shape
    nlist = max(1, n // dedup.IVF_LIST)
    index = faiss.IndexIVFFlat(faiss.IndexFlatIP(d), d, nlist, faiss.METRIC_INNER_PRODUCT)
    index.cp.seed = dedup.IVF_SEED
    index.nprobe = dedup.IVF_PROBE
    sample = np.sort(np.random.default_rng(dedup.IVF_SEED).choice(n, min(n, dedup.IVF_TRAIN * nlist), replace=False))
    index.train(x[sample])
    index.add(x)
    a_, b_ = [], []
    for a in range(0, n, 8192):
        sims, nbrs = index.search(x[a:a + 8192], min(neighbors + 1, n))
        r, c = np.nonzero((sims >= threshold) & (nbrs >= 0))
        keep = nbrs[r, c] != r + a
        a_.append(r[keep] + a)
        b_.append(nbrs[r, c][keep])
    return np.concatenate(a_), np.concatenate(b_)


def exact_pairs(x: np.ndarray, threshold: float, neighbors: int) -> tuple[np.ndarray, np.ndarray]:
    """The exact search's pairs (a flat index, as near_groups runs it up to NEAR_EXACT_MAX)."""
    from climb.stages.cluster import dedup
    index = dedup._flat(x)
    a_, b_ = [], []
    for a in range(0, len(x), 8192):
        sims, nbrs = index.search(x[a:a + 8192], min(neighbors + 1, len(x)))
        r, c = np.nonzero((sims >= threshold) & (nbrs >= 0))
        keep = nbrs[r, c] != r + a
        a_.append(r[keep] + a)
        b_.append(nbrs[r, c][keep])
    return np.concatenate(a_), np.concatenate(b_)


def as_set(ab: tuple[np.ndarray, np.ndarray]) -> set[tuple[int, int]]:
    a, b = ab
    return set(zip(np.minimum(a, b).tolist(), np.maximum(a, b).tolist()))


def timed(fn):
    t = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t


def groups(x: np.ndarray, ab) -> np.ndarray:
    from climb.stages.cluster import dedup
    return dedup._firsts(len(x), *ab)


def main() -> None:
    import faiss
    from threadpoolctl import threadpool_limits

    from climb.stages.cluster import dedup
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=50_000)
    ap.add_argument("--vectors", default="", help="a real fine cluster's embeddings (.npy) instead")
    ap.add_argument("--threshold", type=float, default=0.95)
    ap.add_argument("--neighbors", type=int, default=16)
    ap.add_argument("--sizes", default="", help="comma-separated sizes to time the searches at")
    ap.add_argument("--flat-max", type=int, default=60_000, help="time the flat search only up to this size")
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    th, nb = args.threshold, args.neighbors
    if args.vectors:
        x = np.ascontiguousarray(np.load(args.vectors), dtype=np.float32)
        planted = None
    else:
        x, planted = synthetic(args.n)
    n = len(x)
    p_flat, t_flat = timed(lambda: exact_pairs(x, th, nb))
    p_query, t_query = timed(lambda: per_query_ivf(x, th, nb))
    p_list, t_list = timed(lambda: dedup.ivf_pairs(x, th, nb))
    flat, query, listed = groups(x, p_flat), groups(x, p_query), groups(x, p_list)
    s_flat, s_query, s_list = as_set(p_flat), as_set(p_query), as_set(p_list)
    flagged = flat != np.arange(n)
    threads = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(1)
    with threadpool_limits(1):
        one = dedup.ivf_pairs(x, th, nb)
    faiss.omp_set_num_threads(threads)
    sample = np.random.default_rng(1).choice(n, 1000, replace=False)
    top = np.sort(x[sample] @ x.T, axis=1)[:, -2]  # each sampled document's nearest other
    probes = dedup.ivf_probes(x)
    sizes = np.bincount(probes[:, 0])
    out = {"n": n, "d": int(x.shape[1]), "source": args.vectors or "synthetic", "planted_copies": planted,
           "threshold": th, "neighbors": nb, "nlist": max(1, n // dedup.IVF_LIST), "nprobe": dedup.IVF_PROBE,
           "comparisons_per_query": round(float((sizes[probes]).sum() / n), 1),
           "nearest_other_cosine_quartiles": np.quantile(top, [0.25, 0.5, 0.75]).round(3).tolist(),
           "pairs_exact": len(s_flat), "pairs_per_query_ivf": len(s_query), "pairs_list_by_list": len(s_list),
           "pair_recall": round(len(s_flat & s_list) / max(1, len(s_flat)), 5),
           "pairs_list_by_list_not_exact": len(s_list - s_flat),
           "pairs_list_by_list_equal_per_query": s_list == s_query,
           "duplicates_exact": int(flagged.sum()), "duplicates_list_by_list": int((listed != np.arange(n)).sum()),
           "duplicate_recall_same_first": round(float(((listed == flat) & flagged).sum() / max(1, flagged.sum())), 5),
           "groups_equal_per_query": bool(np.array_equal(listed, query)),
           "seconds_exact": round(t_flat, 2), "seconds_per_query_ivf": round(t_query, 2),
           "seconds_list_by_list": round(t_list, 2), "speedup_over_per_query": round(t_query / t_list, 2),
           "speedup_over_exact": round(t_flat / t_list, 2), "threads": threads,
           "same_with_one_thread": as_set(one) == s_list, "same_again": as_set(dedup.ivf_pairs(x, th, nb)) == s_list}
    print(json.dumps(out, indent=1), flush=True)
    timings = []
    for size in [int(s) for s in args.sizes.split(",") if s]:
        y, _ = synthetic(size, seed=2)
        (pq, tq), (pl, tl) = timed(lambda: per_query_ivf(y, th, nb)), timed(lambda: dedup.ivf_pairs(y, th, nb))
        row = {"n": size, "seconds_per_query_ivf": round(tq, 2), "seconds_list_by_list": round(tl, 2),
               "speedup": round(tq / tl, 2), "same_pairs": as_set(pq) == as_set(pl)}
        if size <= args.flat_max:
            row["seconds_exact"] = round(timed(lambda: exact_pairs(y, th, nb))[1], 2)
        print(json.dumps(row), flush=True)
        timings.append(row)
    out["timings"] = timings
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
