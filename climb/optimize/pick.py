"""The final pick's room: keeping a pick inside the search's bounds, and how steady it is.

A pick that averages mixtures (the mean of the predicted top k, as RegMix picks) can break
the bounds every mixture it averages obeyed: a cluster at 0 in one and at the minimum weight
in another averages to a weight below the minimum. `project` returns the nearest mixture
(in L2) that sums to one and gives every cluster either 0 or a weight within
[`min_weight`, its cap], so the pick obeys `search.min_weight` and `search.epoch_cap` by
construction, as every trained proxy did.

`steadiness` says how much a run's own pick depends on the luck of its proxies: the run's
results resampled with replacement (a bootstrap over proxies), the pick made again on each
resample, and each resampled pick scored by the predictor fitted on all results. Its sd is
the figure `search/quality.json` keeps as `pick_sd`; its share of held-out clusters and
its L1 distance from the run's pick say where the resampled picks go.

How far another search seed's answer may fall is climb.optimize.rerun's figure.

    from climb.optimize.pick import project, steadiness
    w = project(np.array([0.5, 0.49, 0.01]), max_weight=np.array([0.6, 0.6, 0.6]), min_weight=0.02)
"""
from __future__ import annotations

import numpy as np

from climb.optimize.predictor import goal_sign

TOL = 1e-9


def feasible(max_weight, min_weight: float) -> bool:
    """Whether any mixture gives every cluster 0 or a weight in [min_weight, cap] and sums to 1."""
    caps = np.asarray(max_weight, float)
    return bool(caps[caps >= min_weight].sum() >= 1 - TOL)


def _box_simplex(v: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """argmin ||x - v|| with sum(x) = 1 and lo <= x <= hi (the shift tau found by bisection)."""
    a, b = float(np.min(v - hi)) - 1.0, float(np.max(v - lo)) + 1.0
    for _ in range(200):
        tau = 0.5 * (a + b)
        if np.clip(v - tau, lo, hi).sum() > 1:
            a = tau
        else:
            b = tau
    x = np.clip(v - 0.5 * (a + b), lo, hi)
    return x / x.sum()


def project(w, max_weight, min_weight: float = 0.0) -> np.ndarray:
    """The nearest mixture to `w` whose every weight is 0 or within [min_weight, max_weight].

    Clusters keep a weight where `w` gives them at least half the minimum (rounding to the
    nearer end of the gap); the support grows by the heaviest of the rest while its caps sum
    below one, and sheds its lightest while its minimums sum above one. Raises ValueError
    where no mixture fits the bounds.
    """
    w = np.clip(np.asarray(w, float), 0.0, None)
    caps = np.broadcast_to(np.asarray(max_weight, float), w.shape).copy()
    if not feasible(caps, min_weight):
        raise ValueError(f"no mixture fits: the caps of the clusters that can hold the minimum weight "
                         f"{min_weight} sum to {caps[caps >= min_weight].sum():.3f} < 1")
    allowed = caps >= max(min_weight, TOL)
    support = allowed & (w >= min_weight / 2) & (w > 0)
    order = np.lexsort((-caps, -w))  # heaviest first, then largest cap
    for i in order:  # too little room: take in the heaviest of the rest
        if caps[support].sum() >= 1 - TOL:
            break
        if allowed[i] and not support[i]:
            support[i] = True
    while support.sum() * min_weight > 1 + TOL:  # too many minimums: drop the lightest
        support[np.flatnonzero(support)[np.argmin(w[support])]] = False
    out = np.zeros_like(w)
    idx = np.flatnonzero(support)
    out[idx] = _box_simplex(w[idx], np.full(len(idx), min_weight), caps[idx])
    return out


def within(w, max_weight, min_weight: float, tol: float = 1e-7) -> bool:
    """Whether `w` obeys the bounds: sums to 1, every weight 0 or within [min_weight, cap]."""
    w, caps = np.asarray(w, float), np.asarray(max_weight, float)
    pos = w > 0
    return bool(abs(w.sum() - 1) <= tol and (w >= -tol).all() and (w[pos] >= min_weight - tol).all()
                and (w <= caps + tol).all())


def steadiness(pick_fn, X, y, goal: str, score_fn, n_boot: int = 16, seed: int = 0) -> dict:
    """The spread of the pick over bootstrap resamples of the run's results.

    `pick_fn(X_b, y_b) -> weights` makes the pick on a resample; `score_fn(W) -> values` scores
    mixtures (the predictor fitted on every result). Returns the sd and range of the resampled
    picks' scores, their mean L1 distance from each other's mean, and the picks themselves.
    """
    X, y = np.asarray(X, float), np.asarray(y, float)
    rng = np.random.default_rng([seed, 4049])
    picks = []
    for _ in range(n_boot):
        i = rng.integers(0, len(y), len(y))
        if len(np.unique(i)) < 4:
            continue
        picks.append(np.asarray(pick_fn(X[i], y[i]), float))
    P = np.array(picks)
    v = np.asarray(score_fn(P), float)
    s = goal_sign(goal)
    return {"pick_sd": float(np.std(v, ddof=1)) if len(v) > 1 else None,
            "pick_range": [float(np.min(v)), float(np.max(v))] if len(v) else None,
            "pick_worst_gap": float(np.max(s * v) - np.min(s * v)) if len(v) else None,
            "pick_l1": float(np.abs(P - P.mean(0)).sum(1).mean()) if len(P) else None,
            "n_boot": len(v), "picks": P}


def posterior_regret(model, X, y, pick, pool, goal: str, n_samples: int = 256, shortlist: int = 2000,
                     seed: int = 0) -> dict:
    """How much better than `pick` the search space may still be, by the predictor's posterior.

    The bootstrap of `steadiness` reshuffles the results a run has; it cannot see the regions the
    run never measured, and those are what move one search seed's answer from another's. Here the
    predictor's GP (climb.optimize.acquisition.spread_model) is sampled jointly over the measured
    mixtures, the pick and the first `shortlist` rows of the candidate pool; in each sample the
    regret is the pick's value minus the best value of that sample (in the goal's direction, so
    >= 0). Returns its mean (`posterior_regret`) and sd (`posterior_spread`): an unexplored region
    the GP is unsure of widens both. On the demo's tech target the sd tracked the seed-to-seed sd
    of the found objective within a factor of 2 (docs/benchmarks/steady-answer.md).
    """
    from climb.optimize.acquisition import gp_posterior, spread_model
    X, y = np.asarray(X, float), np.asarray(y, float)
    pool = np.asarray(pool, float)[: max(0, shortlist - len(X) - 1)]
    Q = np.vstack([np.asarray(pick, float)[None], X, pool])
    gp = spread_model(model, X, y, seed)
    mean, cov = gp_posterior(gp, Q, full_cov=True)
    cov = (cov + cov.T) / 2
    scale = max(float(np.mean(np.diag(cov))), 1e-12)
    try:
        root = np.linalg.cholesky(cov + 1e-8 * scale * np.eye(len(Q)))
    except np.linalg.LinAlgError:  # near singular (duplicated points): the symmetric root
        vals, vecs = np.linalg.eigh(cov)
        root = vecs * np.sqrt(np.clip(vals, 0.0, None))
    rng = np.random.default_rng([seed, 4050])
    S = goal_sign(goal) * (mean[None] + rng.standard_normal((n_samples, len(Q))) @ root.T)
    regret = S[:, 0] - S.min(1)
    return {"posterior_regret": float(regret.mean()), "posterior_spread": float(regret.std(ddof=1)),
            "posterior_samples": int(n_samples), "posterior_points": int(len(Q))}

