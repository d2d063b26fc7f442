"""How far another search seed's answer may fall: a run's search simulated again.

`rerun_spread` is the figure a run keeps as `steadiness.rerun_sd`: the whole search simulated
eight times with other seeds on what the run's measured mixtures say of their neighbourhood
(`neighbours_mean`), with the run's paired noise on every look-up; the sd of the simulated
picks' values. Read on the demo's recorded runs it stayed within 0.77-1.41 x the seed-to-seed
sd of five searches whose sd ran 0.005-0.029 (docs/benchmarks/steady-answer.md).

    from climb.optimize.rerun import rerun_spread
    fig = rerun_spread(X, y, "minimize", pool, [8, 8, 8, 4], strategy, noise=0.007)
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from climb.optimize.strategy import simulate


BANDWIDTH_QUANTILES = (0.02, 0.05, 0.1, 0.2, 0.3, 0.5)


def neighbours_mean(X, y, P) -> tuple[np.ndarray, float]:
    """What the measured mixtures `X` (values `y`) say of the mixtures `P`: a Gaussian-kernel
    average of `y` in weight space, its bandwidth the one of a grid (quantiles of the measured
    mixtures' distances) that predicts each measured value best from the others (leave-one-out).
    No mixture reads better than the best measured one. Returns the values and the bandwidth."""
    X, y, P = (np.asarray(a, float) for a in (X, y, P))
    D = np.sqrt(((X[:, None] - X[None]) ** 2).sum(-1))
    best = None
    for h in np.quantile(D[np.triu_indices(len(X), 1)], BANDWIDTH_QUANTILES):
        if h <= 0:
            continue
        K = np.exp(-0.5 * (D / h) ** 2)
        np.fill_diagonal(K, 0.0)
        err = float(np.mean((K @ y / np.maximum(K.sum(1), 1e-300) - y) ** 2))
        if best is None or err < best[0]:
            best = (err, float(h))
    if best is None:  # every measured mixture the same: nothing to say but their mean
        return np.full(len(P), float(np.mean(y))), 0.0
    h = best[1]
    E = np.sqrt(((P[:, None] - X[None]) ** 2).sum(-1))
    K = np.exp(-0.5 * ((E / h) ** 2 - (E.min(1, keepdims=True) / h) ** 2))  # scaled by the nearest: no underflow
    return K @ y / K.sum(1), h


def rerun_spread(X, y, goal: str, pool, iterations, strategy, noise: float, runs: int = 8) -> dict:
    """How far another search seed's answer may fall: the search (`iterations`, `strategy`)
    simulated `runs` times with seeds 0..runs-1 over `pool` (drawn as the run draws its own), each
    look-up `neighbours_mean` of the run's results plus Gaussian noise of sd `noise` (the run's
    paired seed noise); `rerun_sd` is the sd of the simulated picks' values, `rerun_range` their
    range. A pick that averages mixtures (`final_top_k` > 1) is simulated as its single best
    (k = 1), so every simulated pick is a pool member with a value. Returns None with fewer than
    four results or fewer than two runs."""
    if getattr(strategy, "final_top_k", 1) > 1:
        strategy = replace(strategy, final_top_k=1)
    X, y = np.asarray(X, float), np.asarray(y, float)
    if len(y) < 4 or runs < 2:
        return None
    f, h = neighbours_mean(X, y, pool)
    picks = [simulate(pool, f, goal, iterations, strategy, seed=j, noise=noise)["pick"] for j in range(runs)]
    v = f[picks]
    return {"rerun_sd": float(np.std(v, ddof=1)), "rerun_range": [float(v.min()), float(v.max())],
            "rerun_runs": runs, "rerun_bandwidth": h}
