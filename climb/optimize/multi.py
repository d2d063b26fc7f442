"""Objectives of several metrics: the weighted aggregate, and one predictor per metric.

A target may weigh several metrics, each with its own goal (`target.objective`,
`target.weights`, `target.goals`); their aggregate's coefficients are climb.config.objective's.

Because every proxy record keeps all its metrics, the trade-offs between them can be read
without training: `fit_metrics` fits one predictor per metric (`make_predictor`, as the search
does) on the swarm's weights and that metric, `predict_metrics` predicts every metric for a set
of mixtures, `aggregate` combines predicted (or measured) metrics under any weights and goals,
`aggregate_pick` takes the mixture of a candidate set that the aggregate prefers,
`best_per_metric` the mixture each metric alone prefers, and `front` the non-dominated points
of two metrics (a Pareto front).

    from climb.optimize.multi import aggregate_pick, fit_metrics, predict_metrics
    models = fit_metrics(X, {"bpb": y_bpb, "piqa/acc": y_acc}, "default", seed=0)
    C = np.vstack([pool, X])
    pick = aggregate_pick(predict_metrics(models, C), target_cfg, C)
"""
from __future__ import annotations

from typing import Mapping

import numpy as np

from climb.config.objective import coefficients
from climb.optimize.predictor import Predictor, goal_sign, make_predictor


def aggregate(values: Mapping[str, float | np.ndarray], target):
    """The objective from each of its metrics' values (scalars, or arrays over mixtures)."""
    coefs = coefficients(target)
    if coefs is None:
        return np.mean([values[m] for m in target.objective], axis=0)
    return sum(c * np.asarray(values[m], float) for m, c in coefs)


def fit_metrics(X, Y: Mapping[str, np.ndarray], predictor: str = "default", seed: int = 0) -> dict[str, Predictor]:
    """One predictor per metric, fitted on the mixtures X and that metric's values Y[m]."""
    X = np.asarray(X, float)
    return {m: make_predictor(predictor, seed=seed).fit(X, np.asarray(y, float)) for m, y in Y.items()}


def predict_metrics(models: Mapping[str, Predictor], W) -> dict[str, np.ndarray]:
    """Every metric's predicted value for each row of W."""
    W = np.atleast_2d(np.asarray(W, float))
    return {m: np.asarray(model.predict(W), float) for m, model in models.items()}


def aggregate_pick(pred: Mapping[str, np.ndarray], target, C) -> dict:
    """The row of the candidates C (a pool and the measured mixtures) whose aggregate of the
    metrics predicted for them (`pred`, as predict_metrics gives) is best under target.goal: its
    weights, the aggregate's value there and every metric's."""
    C = np.asarray(C, float)
    agg = np.asarray(aggregate(pred, target), float)
    i = int(np.argmin(goal_sign(target.goal) * agg))
    return {"weights": C[i], "predicted": float(agg[i]), "metrics": {m: float(v[i]) for m, v in pred.items()}}


def best_per_metric(pred: Mapping[str, np.ndarray], goals: Mapping[str, str], C) -> dict[str, dict]:
    """For each metric of `goals` (name -> its goal), the row of the candidates C it alone prefers
    by its predicted values (`pred`): its weights and every metric's predicted value there."""
    C = np.asarray(C, float)
    out = {}
    for m, goal in goals.items():
        i = int(np.argmin(goal_sign(goal) * pred[m]))
        out[m] = {"weights": C[i], "metrics": {k: float(v[i]) for k, v in pred.items()}}
    return out


def front(points, goals) -> np.ndarray:
    """Indices of the non-dominated rows of `points` (n x 2, one column per metric) under their
    goals: no other row is at least as good on both and better on one. In order of the first column."""
    P = np.asarray(points, float) * np.array([goal_sign(g) for g in goals])  # lower is better on both
    keep = [i for i in range(len(P))
            if not ((P <= P[i]).all(1) & (P < P[i]).any(1)).any()]
    return np.array(sorted(keep, key=lambda i: P[i, 0]), int)
