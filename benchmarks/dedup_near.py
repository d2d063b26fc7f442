"""Near duplicates in a large fine cluster: the IVF search (climb.stages.dedup, above
NEAR_EXACT_MAX documents) against the exact flat search, on a synthetic fine cluster of
`--n` vectors with planted near duplicates. Recall of the exact search's pairs over the
threshold, of its flagged duplicates (with the same kept document), the IVF's false pairs
(none: it computes each candidate's cosine exactly), speed-up, and whether the result
depends on the thread count. `--sizes` times both searches at other sizes (the flat one
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


def pairs(x: np.ndarray, threshold: float, neighbors: int, exact_max: int) -> set[tuple[int, int]]:
    """The pairs over the threshold that the search (as near_groups runs it) returns."""
    from climb.stages import dedup
    index = dedup._index(x, exact_max)
    out = set()
    for a in range(0, len(x), 8192):
        sims, nbrs = index.search(x[a:a + 8192], min(neighbors + 1, len(x)))
        for r, c in zip(*np.nonzero((sims >= threshold) & (nbrs >= 0))):
            if r + a != nbrs[r, c]:
                out.add((min(r + a, int(nbrs[r, c])), max(r + a, int(nbrs[r, c]))))
    return out


def timed(fn):
    t = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t


def main() -> None:
    import faiss

    from climb.stages import dedup
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=50_000)
    ap.add_argument("--vectors", default="", help="a real fine cluster's embeddings (.npy) instead")
    ap.add_argument("--threshold", type=float, default=0.95)
    ap.add_argument("--neighbors", type=int, default=16)
    ap.add_argument("--sizes", default="", help="comma-separated sizes to time both searches at")
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
    flat, t_flat = timed(lambda: dedup.near_groups(x, th, nb, exact_max=n))
    ivf, t_ivf = timed(lambda: dedup.near_groups(x, th, nb, exact_max=0))
    p_flat, p_ivf = pairs(x, th, nb, n), pairs(x, th, nb, 0)
    flagged = flat != np.arange(n)
    threads = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(1)
    one = dedup.near_groups(x, th, nb, exact_max=0)
    faiss.omp_set_num_threads(threads)
    sample = np.random.default_rng(1).choice(n, 1000, replace=False)
    top = np.sort(x[sample] @ x.T, axis=1)[:, -2]  # each sampled document's nearest other
    out = {"n": n, "d": int(x.shape[1]), "source": args.vectors or "synthetic", "planted_copies": planted,
           "threshold": th, "neighbors": nb, "nlist": max(1, n // dedup.IVF_LIST), "nprobe": dedup.IVF_PROBE,
           "nearest_other_cosine_quartiles": np.quantile(top, [0.25, 0.5, 0.75]).round(3).tolist(),
           "pairs_exact": len(p_flat), "pairs_ivf": len(p_ivf), "pairs_found": len(p_flat & p_ivf),
           "pair_recall": round(len(p_flat & p_ivf) / max(1, len(p_flat)), 5),
           "pairs_ivf_not_exact": len(p_ivf - p_flat),
           "duplicates_exact": int(flagged.sum()), "duplicates_ivf": int((ivf != np.arange(n)).sum()),
           "duplicate_recall_same_first": round(float(((ivf == flat) & flagged).sum() / max(1, flagged.sum())), 5),
           "seconds_exact": round(t_flat, 2), "seconds_ivf": round(t_ivf, 2), "speedup": round(t_flat / t_ivf, 2),
           "threads": threads, "same_with_one_thread": bool(np.array_equal(one, ivf)),
           "same_again": bool(np.array_equal(dedup.near_groups(x, th, nb, exact_max=0), ivf))}
    print(json.dumps(out, indent=1), flush=True)
    timings = []
    for size in [int(s) for s in args.sizes.split(",") if s]:
        y, _ = synthetic(size, seed=2)
        row = {"n": size, "seconds_ivf": round(timed(lambda: dedup.near_groups(y, th, nb, exact_max=0))[1], 2)}
        if size <= args.flat_max:
            row["seconds_exact"] = round(timed(lambda: dedup.near_groups(y, th, nb, exact_max=size))[1], 2)
        print(json.dumps(row), flush=True)
        timings.append(row)
    out["timings"] = timings
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
