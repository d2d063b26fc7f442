"""k-means behind one small interface: FAISS (GPU or CPU) or torch on CUDA.

Plain functions over arrays, returning arrays and a stats dict.

    cents, stats = train_kmeans(x, k=16, niter=25, seed=0)
    labels, dist = assign(x, cents)
"""
from __future__ import annotations

import logging
import time

import numpy as np

log = logging.getLogger(__name__)


def _faiss_gpus() -> int:
    import faiss
    return faiss.get_num_gpus() if hasattr(faiss, "get_num_gpus") else 0


def backend() -> str:
    if _faiss_gpus() > 0:
        return "faiss-gpu"
    import torch
    return "torch-cuda" if torch.cuda.is_available() else "faiss-cpu"


def train_kmeans(x: np.ndarray, k: int, niter: int = 25, seed: int = 0,
                 which: str | None = None) -> tuple[np.ndarray, dict]:
    """Lloyd k-means on x [n, d] float32; returns centroids [k, d] and stats."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    which = which or backend()
    t0 = time.time()
    if which == "torch-cuda":
        cents, obj = _torch_kmeans(x, k, niter, seed, "cuda")
    elif which == "torch":
        cents, obj = _torch_kmeans(x, k, niter, seed, "cpu")
    else:
        import faiss
        km = faiss.Kmeans(x.shape[1], k, niter=niter, seed=seed, gpu=which == "faiss-gpu",
                          max_points_per_centroid=max(256, len(x) // k + 1), verbose=False)
        km.train(x)
        cents, obj = km.centroids, float(km.obj[-1]) if len(km.obj) else float("nan")
    secs = time.time() - t0
    log.info("k-means (%s): %d x %d -> k=%d, %d iterations in %.1fs", which, *x.shape, k, niter, secs)
    return np.asarray(cents, dtype=np.float32), {"backend": which, "seconds": round(secs, 3),
                                                 "inertia": obj, "sample": len(x)}


def _torch_kmeans(x: np.ndarray, k: int, niter: int, seed: int, device: str) -> tuple[np.ndarray, float]:
    import torch
    g = torch.Generator().manual_seed(seed)
    xt = torch.from_numpy(x).to(device)
    cents = xt[torch.randperm(len(xt), generator=g)[:k].to(device)].clone()
    xx = (xt * xt).sum(1, keepdim=True)
    obj = float("nan")
    for _ in range(niter):
        d = xx - 2 * xt @ cents.T + (cents * cents).sum(1)
        dist, lab = d.min(1)
        obj = float(dist.sum())
        sums = torch.zeros_like(cents).index_add_(0, lab, xt)
        cnt = torch.bincount(lab, minlength=k).to(xt.dtype).unsqueeze(1)
        empty = cnt.squeeze(1) == 0
        cents = torch.where(empty.unsqueeze(1), cents, sums / cnt.clamp(min=1))
    return cents.cpu().numpy(), obj


def assign(x: np.ndarray, centroids: np.ndarray, batch: int = 65536) -> tuple[np.ndarray, np.ndarray]:
    """Nearest centroid and its squared L2 distance for every row of x.

    FAISS finds the two nearest centroids in float32; the choice between them and the
    distance are then computed exactly (float64, ties to the lower index). FAISS's float32
    distances depend on how many BLAS threads ran, and near-ties (about 3e-7 apart: 3 of a
    million documents) were broken differently in-process and on one-thread Dask workers.
    """
    import faiss
    cents = np.ascontiguousarray(centroids, dtype=np.float32)
    index = faiss.IndexFlatL2(cents.shape[1])
    index.add(cents)
    c64 = cents.astype(np.float64)
    top = min(2, len(cents))
    labels = np.empty(len(x), np.int64)
    dist = np.empty(len(x), np.float32)
    for s in range(0, len(x), batch):
        xb = np.ascontiguousarray(x[s:s + batch], dtype=np.float32)
        _, cand = index.search(xb, top)
        labels[s:s + len(xb)], dist[s:s + len(xb)] = _exact_nearest(xb, c64, cand)
    return labels, dist


def _exact_nearest(x: np.ndarray, c64: np.ndarray, cand: np.ndarray, rows: int = 8192):
    """Of each row's candidate centroids, the nearest by float64 distance (first on a tie)."""
    labels = np.empty(len(x), np.int64)
    dist = np.empty(len(x), np.float32)
    for s in range(0, len(x), rows):
        xs, cs = x[s:s + rows].astype(np.float64), cand[s:s + rows]
        d = np.stack([_sq_norms(xs - c64[cs[:, j]]) for j in range(cs.shape[1])], 1)
        d = np.where(cs >= 0, d, np.inf)  # FAISS pads with -1 when there are fewer centroids
        # Order the candidates by index first, so an exact tie goes to the lower index.
        order = np.argsort(cs, axis=1, kind="stable")
        cs, d = np.take_along_axis(cs, order, 1), np.take_along_axis(d, order, 1)
        best = np.argmin(d, axis=1)
        labels[s:s + rows] = cs[np.arange(len(cs)), best]
        dist[s:s + rows] = d[np.arange(len(cs)), best]
    return labels, dist


def _sq_norms(diff: np.ndarray) -> np.ndarray:
    return np.einsum("ij,ij->i", diff, diff)
