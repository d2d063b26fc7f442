"""Candidate mixtures: Dirichlet pools around a prior, with caps, a minimum weight and no near-duplicates.

The search scores such a pool with the predictor (`climb.optimize.predictor.propose`,
`climb.optimize.strategy`) unless it is given a fixed candidate set.

    from climb.optimize.candidates import sample_candidates
    pool = sample_candidates(np.full(17, 1 / 17), 100_000, np.random.default_rng(0))
"""
from __future__ import annotations

import logging

import numpy as np

from climb.io.mixture import check_weights

log = logging.getLogger(__name__)


def _cap(W: np.ndarray, max_weight: np.ndarray, iters: int = 50) -> np.ndarray:
    """Clip to per-domain caps and hand the excess to uncapped domains pro rata (water filling)."""
    for _ in range(iters):
        over = W > max_weight
        if not over.any():
            break
        excess = np.where(over, W - max_weight, 0.0).sum(1, keepdims=True)
        W = np.minimum(W, max_weight)
        room = np.where(W < max_weight, W, 0.0)
        W = W + excess * room / np.maximum(room.sum(1, keepdims=True), 1e-300)
    return W


def _close_pairs(W: np.ndarray, r: float) -> np.ndarray:
    """All (i, j), i < j, with L1(W[i], W[j]) < r. A projection on u in [-1, 1]^d never
    exceeds the L1 distance, so after sorting by it only a short window needs checking
    (a KD-tree in 17 dimensions was much slower; pool sampling times: BENCHMARKS.md,
    Mixture predictor on RegMix's real proxy swarm, Speed)."""
    proj = W @ np.random.default_rng(0).uniform(-1, 1, (W.shape[1], 3))
    order = np.argsort(proj[:, 0], kind="stable")
    ps, p1, p2, Ws = proj[order, 0], proj[order, 1], proj[order, 2], W[order]
    active, out, k = np.arange(len(W)), [], 1
    while len(active):
        i = active[active + k < len(W)]
        i = i[ps[i + k] - ps[i] < r]  # sorted: once out of the window, farther offsets are too
        c = i[(np.abs(p1[i + k] - p1[i]) < r) & (np.abs(p2[i + k] - p2[i]) < r)]  # cheap 1-D filters first
        close = c[np.abs(Ws[c + k] - Ws[c]).sum(1) < r]
        out.append(np.sort(np.stack([order[close], order[close + k]], 1), axis=1))
        active, k = i, k + 1
    return np.concatenate(out) if out else np.empty((0, 2), int)


def dedupe(W: np.ndarray, min_l1: float) -> np.ndarray:
    """Keep rows in order, dropping any within L1 distance < min_l1 of a kept earlier row."""
    if len(W) < 2 or min_l1 <= 0:
        return W
    W = W[np.sort(np.unique(np.round(W, 6), axis=0, return_index=True)[1])]  # exact repeats first: cheap
    pairs = _close_pairs(W, min_l1)
    keep = np.ones(len(W), bool)
    for i, j in pairs[np.lexsort((pairs[:, 1], pairs[:, 0]))]:
        if keep[i] and keep[j]:  # pairs sorted by i: i's own fate is already settled
            keep[j] = False
    return W[keep]


def sample_candidates(prior: np.ndarray, n: int, rng: np.random.Generator, concentrations=None,
                      temperature: float = 1.0, min_weight: float = 0.0, max_weight: np.ndarray | None = None,
                      dedupe_l1: float = 1e-3, bounds=None) -> np.ndarray:
    """Up to n distinct mixtures from Dirichlet(c * p), p = prior**temperature renormalised.

    `concentrations` are total concentrations c (sum of the Dirichlet's alphas), mixed in
    equal shares; default d * (0.5, 1, 4) for d domains. Domains with prior 0 stay 0.
    Weights below `min_weight` are zeroed, then rows are capped at `max_weight` (water
    filling; rows that cannot satisfy the caps are dropped); with `bounds`
    (climb.optimize.bounds.Bounds) each row is moved to the nearest mixture that holds them
    and rows that cannot be are dropped; then near-duplicates (L1 < dedupe_l1) are dropped,
    so fewer than n rows may come back.
    """
    prior = np.asarray(prior, float)
    check_weights(prior, where="sample_candidates prior", tol=None)  # p is renormalised below, after the temperature
    d, p = prior.size, prior ** temperature
    p, support = p / p.sum(), p > 0
    conc = tuple(concentrations) if concentrations is not None else (0.5 * d, 1.0 * d, 4.0 * d)
    if max_weight is not None:
        max_weight = np.broadcast_to(np.asarray(max_weight, float), (d,))
        if max_weight[support].sum() < 1 - 1e-9:
            raise ValueError(f"the caps max_weight sum to {max_weight[support].sum():.3f} < 1: no mixture fits")
    out, have = np.empty((0, d)), 0
    for _ in range(5):  # rounds of oversampling until dedupe/rejection leave n rows
        m = max(int(1.3 * (n - have)), 16)
        S = np.vstack([rng.dirichlet(np.maximum(c * p[support], 1e-3), size=-(-m // len(conc))) for c in conc])
        W = np.zeros((len(S), d))
        W[:, support] = S
        W[W < min_weight] = 0.0
        W = W[W.sum(1) > 0]
        W /= W.sum(1, keepdims=True)
        if max_weight is not None:
            W = _cap(W, max_weight)
            W = W[(W <= max_weight + 1e-9).all(1) & np.isclose(W.sum(1), 1.0)]
        if bounds is not None:
            from climb.optimize.bounds import project, satisfied
            W = project(W, bounds)
            W = W[satisfied(W, bounds)]
        out = dedupe(np.vstack([out, W[rng.permutation(len(W))]]), dedupe_l1)
        if (have := len(out)) >= n:
            break
    if have < n:
        log.warning("sample_candidates: only %d distinct mixtures of %d asked for", have, n)
    return out[:n]
