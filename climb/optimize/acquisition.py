"""Batch acquisition from a predictor's uncertainty: Thompson sampling, expected improvement, UCB.

The spread comes from a Gaussian process (`climb.optimize.gp.GPPredictor`): the
GP inside the predictor when it has one (``gp``, or ``default`` while its blend
gives the GP a weight), otherwise a GP fitted on the same results. The centre is
the predictor's own mean, so a blend keeps its trees' say in where the optimum is
and the GP only says how sure that is.

All three pick a batch of `n` candidates, lower is better (callers multiply by
the goal's sign first):

- ``thompson``: each slot is the best candidate of one joint draw from the
  posterior over a shortlist, taken without replacement;
- ``ei``: expected improvement over the best predicted value of a measured mixture,
  greedily, each choice
  conditioning the posterior on its predicted value (the "kriging believer"), so the
  next slot looks elsewhere;
- ``ucb``: the same greedy scheme on the lower confidence bound mean - 2 sd.

Every choice also keeps an L1 gap (`min_l1`) from what was measured or chosen, as
`climb.optimize.predictor.propose` does; the gap halves (logged) when it leaves too few.

    from climb.optimize.acquisition import select_batch
    idx = select_batch("thompson", model, X_seen, y_seen, C, n=8, rng=np.random.default_rng(0))
"""
from __future__ import annotations

import logging

import numpy as np
from scipy.linalg import solve_triangular
from scipy.spatial import cKDTree
from scipy.stats import norm

from climb.config import SEARCH_ACQUISITIONS
from climb.optimize.experts import ExpertPrior
from climb.optimize.gp import GPPredictor, blas_one_thread
from climb.optimize.predictor import BlendPredictor

log = logging.getLogger(__name__)

# The acquisitions that use the predictor's uncertainty ("explore" is the strategy's own).
ACQUISITIONS = tuple(a for a in SEARCH_ACQUISITIONS if a != "explore")
SHORTLIST = 2000  # joint posterior over at most this many candidates: a 2000^2 covariance is cheap
UCB_BETA = 2.0


def spread_model(model, X_seen, y_seen, seed: int = 0) -> GPPredictor:
    """The GP whose posterior gives the predictor's uncertainty (fitted here if it has none)."""
    if isinstance(model, GPPredictor):
        return model
    if isinstance(model, BlendPredictor) and isinstance(model.models[0], GPPredictor):
        return model.models[0]
    if isinstance(model, ExpertPrior):  # the spread of what the experts' line leaves
        return spread_model(model.base, X_seen, model.residual, seed)
    return GPPredictor(seed=seed).fit(X_seen, y_seen)


def gp_posterior(gp: GPPredictor, Q: np.ndarray, full_cov: bool = False):
    """Posterior mean and variance (or covariance) of the GP's latent function at Q, in target units."""
    F = (gp._features(Q) - gp.mu) / gp.sd
    with blas_one_thread():
        K, _, KL = gp._gram(F, gp._F, gp.ls, gp.s2, gp.s_lin)
        Ks = K + KL
        mean = Ks @ gp._alpha * gp.ys + gp.ym
        V = solve_triangular(gp._L, Ks.T, lower=True)
        if full_cov:
            Kq, _, KLq = gp._gram(F, F, gp.ls, gp.s2, gp.s_lin)
            return mean, (Kq + KLq - V.T @ V) * gp.ys ** 2
        prior = gp.s2 + (gp.s_lin * (F * F).sum(1) / F.shape[1] if gp.linear else 0.0)
        return mean, np.maximum(prior - (V * V).sum(0), 0.0) * gp.ys ** 2


def _gap_filter(C, X_seen, min_l1: float, n: int):
    """Distances to what was measured, and the gap actually used (halved until n candidates pass)."""
    dist = cKDTree(X_seen).query(C, k=1, p=1)[0] if len(X_seen) else np.full(len(C), np.inf)
    gap = min_l1
    while gap > 1e-6 and (dist >= gap).sum() < n:
        gap /= 2
        log.warning("acquisition: relaxing the L1 diversity gap to %.4f", gap)
    return dist, gap


def select_batch(kind: str, model, X_seen, y_seen, C, n: int, rng: np.random.Generator, sign: float = 1.0,
                 min_l1: float = 0.05, seed: int = 0) -> np.ndarray:
    """Indices into C of n candidates chosen by `kind` (see module doc); sign = goal_sign(goal)."""
    if kind not in ACQUISITIONS:
        raise ValueError(f"unknown acquisition {kind!r}; choose one of: {', '.join(ACQUISITIONS)}")
    X_seen, y_seen, C = np.asarray(X_seen, float), np.asarray(y_seen, float), np.asarray(C, float)
    if len(C) < n:
        raise ValueError(f"{len(C)} candidates cannot give {n} proposals")
    gp = spread_model(model, X_seen, y_seen, seed)
    mean = sign * np.asarray(model.predict(C), float)
    _, var = gp_posterior(gp, C)
    sd = np.sqrt(var)
    dist, gap = _gap_filter(C, X_seen, min_l1, n)
    # Shortlist: the candidates whose optimistic bound is best; the rest are out of reach of any slot.
    eligible = np.flatnonzero(dist >= gap)
    short = eligible[np.argsort(mean[eligible] - 3 * sd[eligible], kind="stable")[:max(SHORTLIST, n)]]
    S = C[short]
    _, cov = gp_posterior(gp, S, full_cov=True)
    m = mean[short]
    far = np.ones(len(short), bool)  # still at least `gap` from every chosen candidate
    chosen: list[int] = []

    def take(j: int) -> None:
        chosen.append(j)
        far[:] &= np.abs(S - S[j]).sum(1) >= gap
        far[j] = False

    if kind == "thompson":
        w, U = np.linalg.eigh(cov)  # eigh, not Cholesky: the covariance is often singular to rounding
        root = U * np.sqrt(np.clip(w, 0.0, None))
        while len(chosen) < n:
            draw = m + root @ rng.standard_normal(len(m))
            ok = np.flatnonzero(far) if far.any() else np.setdiff1d(np.arange(len(m)), chosen)
            take(int(ok[np.argmin(draw[ok])]))
    else:
        # The incumbent is the best predicted value among the measured mixtures, not the best
        # measurement: a lucky draw of proxy noise would otherwise leave only far-off, uncertain
        # candidates any hope of improving on it.
        best = float(np.min(sign * np.asarray(model.predict(X_seen), float))) if len(y_seen) else float(np.min(m))
        cov = cov.copy()
        while len(chosen) < n:
            s = np.sqrt(np.clip(np.diag(cov), 1e-18, None))
            if kind == "ei":
                u = (best - m) / s
                score = -((best - m) * norm.cdf(u) + s * norm.pdf(u))
            else:
                score = m - UCB_BETA * s
            ok = np.flatnonzero(far) if far.any() else np.setdiff1d(np.arange(len(m)), chosen)
            j = int(ok[np.argmin(score[ok])])
            take(j)
            best = min(best, m[j])  # the believer: as if j measured what the model predicts
            c = cov[:, j].copy()
            cov -= np.outer(c, c) / max(c[j], 1e-18)
    log.info("acquisition %s: %d of %d candidates (shortlist %d, gap %.3f)", kind, n, len(C), len(short), gap)
    return short[np.asarray(chosen, int)]
