"""How far another search seed's answer may fall: a run's search simulated again.

`rerun_spread` is the figure a run keeps as `steadiness.rerun_sd`: the whole search simulated
eight times with other seeds on what the run's measured mixtures say (`trend_mean`: a ridge line
in the weights, the kernel average of what it leaves added back), with the run's paired noise on
every look-up; the sd of the simulated picks' values. Held out on the bench preset (rule 2a2f766,
eight search seeds an arm) it read 0.91 x the measured seed-to-seed sd of the default search and
1.25 x that of target-last; on tech and sport, 0.68-1.66 x on every search it models
(docs/benchmarks/steady-answer.md). `neighbours_mean` alone (the figure kept before) read up to
5.04 x on sport's target-last.

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
    h = _kernel_bandwidth(np.sqrt(((X[:, None] - X[None]) ** 2).sum(-1)), y)
    if h is None:  # every measured mixture the same: nothing to say but their mean
        return np.full(len(P), float(np.mean(y))), 0.0
    E = np.sqrt(((P[:, None] - X[None]) ** 2).sum(-1))
    K = np.exp(-0.5 * ((E / h) ** 2 - (E.min(1, keepdims=True) / h) ** 2))  # scaled by the nearest: no underflow
    return K @ y / K.sum(1), h


def _kernel_bandwidth(D: np.ndarray, y: np.ndarray) -> float | None:
    """The bandwidth of the grid (quantiles of the measured mixtures' distances `D`) whose kernel
    average predicts each value of `y` best from the others (leave-one-out); None if all coincide."""
    best = None
    for h in np.quantile(D[np.triu_indices(len(y), 1)], BANDWIDTH_QUANTILES):
        if h <= 0:
            continue
        K = np.exp(-0.5 * (D / h) ** 2)
        np.fill_diagonal(K, 0.0)
        err = float(np.mean((K @ y / np.maximum(K.sum(1), 1e-300) - y) ** 2))
        if best is None or err < best[0]:
            best = (err, float(h))
    return None if best is None else best[1]


def trend_mean(X, y, P, goal: str) -> tuple[np.ndarray, float]:
    """`neighbours_mean` around a trend: a ridge line in the weights (its penalty by leave-one-out)
    fitted to the measured values, the kernel average of what it leaves over added back. Far from
    every measured mixture the trend carries on (a mixture with more of what helped reads better),
    where the plain kernel average holds its nearest measured value. No mixture reads better than
    the best measured one (nor worse than the worst). Returns the values and the bandwidth."""
    from sklearn.linear_model import RidgeCV
    X, y, P = (np.asarray(a, float) for a in (X, y, P))
    line = RidgeCV(alphas=np.logspace(-4, 2, 13)).fit(X, y)
    g, h = neighbours_mean(X, y - line.predict(X), P)
    f = line.predict(P) + (g if h else 0.0)
    return np.clip(f, y.min(), y.max()), h


def predicted_mean(X, y, P, goal: str, predictor: str = "default", seed: int = 0) -> tuple[np.ndarray, float]:
    """The run's own predictor, fitted on every measured mixture, as the landscape; no mixture reads
    better than the best measured one (nor worse than the worst). Returns the values and 0.0."""
    from climb.optimize.predictor import make_predictor
    X, y, P = (np.asarray(a, float) for a in (X, y, P))
    f = make_predictor(predictor, seed=seed).fit(X, y).predict(P)
    return np.clip(np.asarray(f, float), y.min(), y.max()), 0.0


TRUTHS = ("neighbours", "trend", "predicted")


def rerun_spread(X, y, goal: str, pool, iterations, strategy, noise: float, runs: int = 8,
                 truth: str = "trend") -> dict:
    """How far another search seed's answer may fall: the search (`iterations`, `strategy`)
    simulated `runs` times with seeds 0..runs-1 over `pool` (drawn as the run draws its own), each
    look-up the landscape `truth` reads off the run's results plus Gaussian noise of sd `noise`
    (the run's paired seed noise); `rerun_sd` is the sd of the simulated picks' values, `rerun_range` their
    range. A pick that averages mixtures (`final_top_k` > 1) is simulated as its single best
    (k = 1), so every simulated pick is a pool member with a value. Returns None with fewer than
    four results or fewer than two runs. `truth` names the landscape the re-runs search: "trend"
    (`trend_mean`, the figure a run keeps), "neighbours" (`neighbours_mean`) or "predicted"
    (`predicted_mean`), the candidates measured in docs/benchmarks/steady-answer.md."""
    if getattr(strategy, "final_top_k", 1) > 1:
        strategy = replace(strategy, final_top_k=1)
    X, y = np.asarray(X, float), np.asarray(y, float)
    if len(y) < 4 or runs < 2:
        return None
    if truth not in TRUTHS:
        raise ValueError(f"unknown truth {truth!r}; choose one of: {', '.join(TRUTHS)}")
    if truth == "neighbours":
        f, h = neighbours_mean(X, y, pool)
    elif truth == "trend":
        f, h = trend_mean(X, y, pool, goal)
    else:
        f, h = predicted_mean(X, y, pool, goal, getattr(strategy, "predictor", "default"))
    picks = [simulate(pool, f, goal, iterations, strategy, seed=j, noise=noise)["pick"] for j in range(runs)]
    v = f[picks]
    return {"rerun_sd": float(np.std(v, ddof=1)), "rerun_range": [float(v.min()), float(v.max())],
            "rerun_runs": runs, "rerun_bandwidth": h}
