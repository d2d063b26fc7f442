"""Mixture predictors: from mixture weights to a proxy metric, and the search step.

A predictor maps mixture weights (rows summing to 1) to the raw metric a proxy
reached; callers handle the goal (minimize/maximize). Names (`make_predictor`):

- ``default``: a Gaussian process (ARD Matern-5/2 on standardised log weights)
  blended with LightGBM (1,000 trees, learning rate 0.01, the library's other
  defaults), the blend weight chosen at every fit by inner 5-fold CV (pooled
  out-of-fold Spearman) on the results given, so a swarm whose response is not
  smooth falls back to the trees; below 10 results (and while the trees cannot
  split, below 40), the GP alone. Chosen by
  CV on RegMix's *training* runs only: ``benchmarks/predictor_regmix.py --select``.
- ``gp``: the Gaussian process alone (`climb.optimize.gp`).
- ``lightgbm``: plain LightGBM, 1,000 trees, learning rate 0.01, otherwise defaults
  except ``min_child_samples`` scaled to the rows given (n // 10 within [2, 20], the
  library's 20 from 200 rows on), so that it can split on a small swarm.
- ``lightgbm-log``: the same on weights plus log weights.
- ``linear``: least squares on the weights.

The search step: `propose` (best predicted, diverse, plus exploration) and
`best_mixture`, over a candidate pool (`climb.optimize.candidates.sample_candidates`).

    from climb.optimize.predictor import make_predictor, rank_metrics
    m = make_predictor("default").fit(X_train, y_train)
    print(rank_metrics(y_test, m.predict(X_test), "minimize"))
"""
from __future__ import annotations

import logging
from typing import Protocol

import numpy as np
from scipy.spatial import cKDTree
from scipy.stats import pearsonr, spearmanr

from climb.optimize.gp import LOG_EPS, GPPredictor

log = logging.getLogger(__name__)


class Predictor(Protocol):
    name: str
    def fit(self, X: np.ndarray, y: np.ndarray) -> "Predictor": ...  # noqa: E301
    def predict(self, X: np.ndarray) -> np.ndarray: ...  # noqa: E301


def min_child_samples(n: int) -> int:
    """Plain LightGBM's leaf minimum for n rows: n // 10 within [2, 20] (20 is the library default)."""
    return int(np.clip(n // 10, 2, 20))


class LightGBMPredictor:
    def __init__(self, seed: int = 0, log_features: bool = False, name: str = "lightgbm", **params):
        self.name, self.log_features = name, log_features
        # One thread: on a few hundred rows OpenMP gains nothing, and on shared cores its
        # spin-waiting made a fit many times slower.
        self.params = dict(n_estimators=1000, learning_rate=0.01, verbose=-1, n_jobs=1, random_state=seed)
        self.params.update(params)

    def _features(self, X):
        X = np.asarray(X, float)
        return np.hstack([X, np.log(X + LOG_EPS)]) if self.log_features else X

    def fit(self, X, y):
        import lightgbm as lgb
        y = np.asarray(y, float)
        # LightGBM's min_child_samples=20 cannot split below 40 rows: the fit is then one
        # constant. Scaled to n (n // 10, between 2 and 20) it splits on small swarms and
        # is the library default from 200 rows on.
        params = {"min_child_samples": min_child_samples(len(y)), **self.params}
        self.model = lgb.LGBMRegressor(**params).fit(self._features(X), y)
        return self

    def predict(self, X):
        return self.model.predict(self._features(X))


class LinearPredictor:
    """Ordinary least squares on the weights (rows sum to 1, so no separate intercept)."""
    name = "linear"

    def fit(self, X, y):
        self.coef = np.linalg.lstsq(np.asarray(X, float), np.asarray(y, float), rcond=None)[0]
        return self

    def predict(self, X):
        return np.asarray(X, float) @ self.coef


def is_constant(v) -> bool:
    """All values equal up to rounding (a least-squares fit of a constant target differs by ~1e-16)."""
    v = np.asarray(v, float)
    return bool(np.ptp(v) <= 1e-12 * max(1.0, float(np.max(np.abs(v)))))


def _spearman(a, b) -> float:
    return float("nan") if is_constant(a) or is_constant(b) else float(spearmanr(a, b).statistic)


class BlendPredictor:
    """alpha * smooth + (1 - alpha) * trees, alpha picked by inner K-fold on the fit data.

    Pooled out-of-fold Spearman decides (ties go to the earlier grid entry: more smooth).
    The smooth model is used alone below `min_n` results, and when the trees cannot
    split in an inner fold (plain LightGBM needs 40 rows), since then there is nothing to judge."""

    def __init__(self, smooth, trees, grid=(1.0, 0.75, 0.5, 0.25, 0.0), folds: int = 5, min_n: int = 10,
                 seed: int = 0, name: str = "default"):
        self.smooth, self.trees, self.grid, self.folds, self.min_n = smooth, trees, grid, folds, min_n
        self.seed, self.name = seed, name

    def fit(self, X, y):
        X, y = np.asarray(X, float), np.asarray(y, float)
        n = len(y)
        if n < self.min_n or len(self.grid) == 1:
            self.alpha, self.cv_scores = (1.0 if n < self.min_n else self.grid[0]), {}
        else:
            oof = np.zeros((2, n))
            folds = np.array_split(np.random.default_rng(self.seed).permutation(n), min(self.folds, n))
            for te in folds:
                tr = np.setdiff1d(np.arange(n), te)
                oof[0, te] = self.smooth().fit(X[tr], y[tr]).predict(X[te])
                oof[1, te] = self.trees().fit(X[tr], y[tr]).predict(X[te])
            self.cv_scores = {a: _spearman(a * oof[0] + (1 - a) * oof[1], y) for a in self.grid}
            self.alpha = max(self.grid, key=lambda a: np.nan_to_num(self.cv_scores[a], nan=-2.0))
            if any(np.ptp(oof[1, te]) == 0 for te in folds):  # trees could not split: their score is fold noise
                self.alpha = 1.0
            log.info("%s: blend weight of the smooth model %.2f (inner-CV Spearman %s)", self.name, self.alpha,
                     {a: round(s, 4) for a, s in self.cv_scores.items()})
        self.models = [self.smooth().fit(X, y) if self.alpha > 0 else None,
                       self.trees().fit(X, y) if self.alpha < 1 else None]
        return self

    def predict(self, X):
        parts = [w * m.predict(X) for w, m in zip((self.alpha, 1 - self.alpha), self.models) if m is not None]
        return np.asarray(sum(parts), float)


def _registry(seed: int, noise_floor: float = 0.0) -> dict:
    gp = lambda: GPPredictor(seed=seed, noise_floor=noise_floor)  # noqa: E731
    lgbm = lambda: LightGBMPredictor(seed=seed)  # noqa: E731
    # The default's trees keep the library's min_child_samples=20, as when it was selected
    # (`predictor_regmix.py --select`); scaled, they took weight from the GP at 16 runs and ranked worse.
    trees = lambda: LightGBMPredictor(seed=seed, min_child_samples=20)  # noqa: E731
    return {
        "default": lambda: BlendPredictor(gp, trees, seed=seed, name="default"),
        "gp": gp,
        "lightgbm": lgbm,
        "lightgbm-log": lambda: LightGBMPredictor(seed=seed, log_features=True, name="lightgbm-log"),
        "linear": LinearPredictor,
    }


PREDICTORS = tuple(_registry(0))


def make_predictor(name: str = "default", seed: int = 0, noise_floor: float = 0.0) -> Predictor:
    """`noise_floor` > 0: the Gaussian process (alone or in the blend) takes every measurement to carry
    at least this noise sd, in the metric's units; the other predictors ignore it."""
    reg = _registry(seed, noise_floor)
    if name not in reg:
        raise ValueError(f"unknown predictor {name!r}; choose one of: {', '.join(reg)}")
    return reg[name]()


def goal_sign(goal: str) -> float:
    """+1 for minimize, -1 for maximize: sign * value is then always 'lower is better'."""
    if goal not in ("minimize", "maximize"):
        raise ValueError(f"goal must be 'minimize' or 'maximize', not {goal!r}")
    return 1.0 if goal == "minimize" else -1.0


def rank_metrics(y_true, y_pred, goal: str) -> dict:
    """Spearman, Pearson, and how good the predicted-best item truly is.

    top1_regret: true value of the predicted-best item minus the true best, in the
    metric's units, oriented so that it is >= 0 (0 = the predicted best is the true best).
    top1_rank: 1 + how many items are truly strictly better than the predicted best.
    A constant prediction picks no item: `constant_prediction` is True, and Spearman,
    Pearson, top1_regret and top1_rank are NaN / None.
    """
    y_true, y_pred, s = np.asarray(y_true, float), np.asarray(y_pred, float), goal_sign(goal)
    out = {"spearman": _spearman(y_true, y_pred), "pearson": float("nan"), "top1_regret": float("nan"),
           "top1_rank": None, "n": int(y_true.size), "constant_prediction": is_constant(y_pred)}
    if not out["constant_prediction"]:
        pick = int(np.argmin(s * y_pred))
        out.update(top1_regret=float(s * y_true[pick] - np.min(s * y_true)),
                   top1_rank=int(1 + np.sum(s * y_true < s * y_true[pick])))
        if not is_constant(y_true):
            out["pearson"] = float(pearsonr(y_true, y_pred).statistic)
    return out


def propose(X_seen, y_seen, goal: str, candidates: np.ndarray, n: int, predictor_name: str = "default",
            seed: int = 0, explore_frac: float = 0.25, min_l1: float = 0.05, fit=None):
    """The next n mixtures to train and their predicted values.

    Exploit: best predicted candidates first, each at L1 >= min_l1 from every mixture
    already seen or chosen. Explore (round(explore_frac * n) slots): among the best
    quarter of the candidates by prediction, farthest-point sampling, i.e. the candidate
    farthest (L1) from everything seen or chosen so far - promising but unmeasured regions.
    If the distance constraint leaves too few candidates it is halved (logged). `fit(X, y)`,
    if given, returns the fitted predictor instead of `predictor_name`'s.
    """
    X_seen, y_seen, C = np.asarray(X_seen, float), np.asarray(y_seen, float), np.asarray(candidates, float)
    if len(C) < n:
        raise ValueError(f"{len(C)} candidates cannot give {n} proposals")
    model = fit(X_seen, y_seen) if fit is not None else make_predictor(predictor_name, seed=seed).fit(X_seen, y_seen)
    pred = model.predict(C)
    order = np.argsort(goal_sign(goal) * pred, kind="stable")
    n_explore = min(int(round(explore_frac * n)), n - 1) if n > 1 else 0
    chosen: list[int] = []
    # L1 distance of each candidate to everything seen or chosen so far
    dist = cKDTree(X_seen).query(C, k=1, p=1)[0] if len(X_seen) else np.full(len(C), np.inf)

    def take(i):
        chosen.append(int(i))
        dist[:] = np.minimum(dist, np.abs(C - C[i]).sum(1))

    gap, top = min_l1, order[: max(len(order) // 4, n)]
    while len(chosen) < n:
        if len(chosen) < n - n_explore:
            ok = order[dist[order] >= gap]
            if not len(ok) and gap > 1e-6:  # too few candidates far enough apart: relax, say so
                gap /= 2
                log.warning("propose: relaxing the L1 diversity gap to %.4f", gap)
                continue
            i = ok[0] if len(ok) else None
        else:
            i = top[np.argmax(dist[top])]
            i = i if dist[i] > 0 else None
        take(i if i is not None else next(j for j in order if j not in chosen))
    log.info("propose: %d exploit + %d explore from %d candidates (predictor %s)", n - n_explore, n_explore,
             len(C), model.name)
    return C[chosen], pred[chosen]


def best_mixture(predictor, candidates: np.ndarray, goal: str, top_k: int = 1) -> np.ndarray:
    """Predicted-best candidate (top_k > 1: the renormalised mean of the top k)."""
    C = np.asarray(candidates, float)
    order = np.argsort(goal_sign(goal) * predictor.predict(C), kind="stable")
    w = C[order[: max(1, top_k)]].mean(0)
    return w / w.sum()
