"""The search strategy as plain functions: what to measure next, and which mixture to pick.

`climb search` (`climb/stages/search/__init__.py`) and the oracle benchmark
(`benchmarks/search_oracle.py`) both call `plan` for every iteration and
`final_pick` at the end, so what the benchmark measures is what a search does.

- `plan(it, n, X_seen, y_seen, goal, pool, strategy, seed)`: indices into `pool`
  of the n mixtures of iteration `it`. The first iteration (or one after too few
  successes) takes random mixtures of the pool; later ones fit the predictor on
  every result so far and choose by the strategy's acquisition: ``explore`` (the
  best predicted plus a fixed share of far-away ones, `climb.optimize.predictor.propose`) or
  one that uses the predictor's uncertainty (``thompson``, ``ei``, ``ucb``:
  `climb.optimize.acquisition`); with `exploit_last`, the last iteration takes the best
  predicted alone, since its results only serve the final pick. Mixtures already
  measured are never proposed again.
- `final_pick(X_seen, y_seen, goal, pool, strategy, seed)`: ``seen`` (the best
  measured), ``measured-predicted`` (the measured mixture the predictor rates best:
  less swayed by one lucky draw of proxy noise; the mean of the k it rates best if
  `final_top_k` > 1) or ``predicted`` (the best predicted of the pool and the measured
  mixtures; the mean of the top k if `final_top_k` > 1).
- `simulate(...)`: a whole search over a finite pool whose every result is known,
  the measurement being a table look-up.

    from climb.optimize.strategy import Strategy, simulate
    out = simulate(X, y, "minimize", (32, 16, 8), Strategy(), seed=0)
    print(out["regret"], out["rank"])
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, replace

import numpy as np
from scipy.spatial import cKDTree

from climb.config import SEARCH_FINALS
from climb.optimize.acquisition import ACQUISITIONS, select_batch
from climb.optimize.experts import ExpertPrior
from climb.optimize.predictor import goal_sign, make_predictor, propose

log = logging.getLogger(__name__)

FINALS = SEARCH_FINALS
MIN_FIT = 4  # fewer successful results than this: the next iteration is random again


@dataclass(frozen=True)
class Strategy:
    predictor: str = "default"
    # How later iterations choose: "explore" (best predicted + explore_frac far-away ones),
    # or from the predictor's uncertainty: "thompson", "ei", "ucb".
    acquisition: str = "ei"
    explore_frac: float = 0.25
    final: str = "seen"
    final_top_k: int = 1
    # The predicted pick pays final_kl * KL(w || natural): 0, none.
    final_kl: float = 0.0
    # The final pick's predictor takes every measurement to carry at least this noise sd (the
    # run's measured seed noise with search.final_noise = "measured"): 0, the evidence decides.
    final_noise: float = 0.0
    # Proposals keep at least this L1 distance from each other and from measured mixtures.
    min_l1: float = 0.05
    # The last iteration only feeds the final pick: measure the best predicted, no exploration.
    exploit_last: bool = True
    # A feature of mixtures the predictor fits a line in before its own model (the experts'
    # ensemble bpb, climb.optimize.experts.ExpertPrior); None: the predictor alone.
    prior: object = None

    def __post_init__(self):
        if self.acquisition not in ("explore",) + ACQUISITIONS:
            raise ValueError(f"unknown acquisition {self.acquisition!r}; choose one of: explore, "
                             f"{', '.join(ACQUISITIONS)}")
        if self.final not in FINALS:
            raise ValueError(f"unknown final pick {self.final!r}; choose one of: {', '.join(FINALS)}")


def from_search_config(search_cfg) -> Strategy:
    """The strategy a `SearchConfig` describes."""
    return Strategy(predictor=search_cfg.predictor, acquisition=search_cfg.acquisition,
                    explore_frac=search_cfg.explore_frac, final=search_cfg.final, final_top_k=search_cfg.final_top_k,
                    final_kl=search_cfg.final_kl,
                    min_l1=search_cfg.dedup_l1, exploit_last=search_cfg.exploit_last)


def row_index(rows: np.ndarray, pool: np.ndarray, tol: float = 1e-9) -> np.ndarray:
    """For each row, its index in pool (exact up to `tol` in L1); -1 where it has none."""
    if not len(rows):
        return np.empty(0, int)
    d, i = cKDTree(pool).query(np.asarray(rows, float), k=1, p=1)
    return np.where(d <= tol, i, -1)


def _fit(strategy: Strategy, X, y, seed: int, noise_floor: float = 0.0):
    model = make_predictor(strategy.predictor, seed=seed, noise_floor=noise_floor)
    if strategy.prior is not None:
        model = ExpertPrior(model, strategy.prior)
    return model.fit(np.asarray(X, float), np.asarray(y, float))


def propose_next(X_seen, y_seen, goal: str, C: np.ndarray, n: int, strategy: Strategy, seed: int):
    """Indices into C of the next n mixtures and the predictor's value for each."""
    X_seen, y_seen, C = np.asarray(X_seen, float), np.asarray(y_seen, float), np.asarray(C, float)
    if strategy.acquisition == "explore":
        W, pred = propose(X_seen, y_seen, goal, C, n, predictor_name=strategy.predictor, seed=seed,
                          explore_frac=strategy.explore_frac, min_l1=strategy.min_l1,
                          fit=lambda X, y: _fit(strategy, X, y, seed))
        return row_index(W, C), pred
    model = _fit(strategy, X_seen, y_seen, seed)
    idx = select_batch(strategy.acquisition, model, X_seen, y_seen, C, n, np.random.default_rng(seed),
                       sign=goal_sign(goal), min_l1=strategy.min_l1, seed=seed)
    return idx, np.asarray(model.predict(C[idx]), float)


def plan(it: int, n: int, X_seen, y_seen, goal: str, pool: np.ndarray, strategy: Strategy, seed: int,
         shuffle: bool = True, last: bool = False):
    """Indices into pool of the mixtures of iteration `it`, and their predicted values (None: random).

    Measured mixtures are left out. The random first iteration takes a random n of
    the rest (`shuffle`), or its first n where the pool was drawn at random already.
    """
    X_seen, y_seen = np.asarray(X_seen, float).reshape(-1, pool.shape[1]), np.asarray(y_seen, float)
    free = np.flatnonzero(~np.isin(np.arange(len(pool)), row_index(X_seen, pool)))
    if len(free) < n:
        log.warning("iteration %d: only %d unmeasured candidates for %d proxies", it + 1, len(free), n)
        n = len(free)
    if n == 0:
        return np.empty(0, int), []
    if it == 0 or len(y_seen) < MIN_FIT:
        order = np.random.default_rng(seed + 1000 * it).permutation(len(free)) if shuffle else np.arange(len(free))
        return free[order[:n]], [None] * n
    if last and strategy.exploit_last:
        strategy = replace(strategy, acquisition="explore", explore_frac=0.0)
    idx, pred = propose_next(X_seen, y_seen, goal, pool[free], n, strategy, seed + it)
    return free[idx], [float(p) for p in pred]


def pick_weights(X_seen, y_seen, goal: str, pool: np.ndarray, strategy: Strategy, model, bounds=None,
                 natural=None) -> np.ndarray:
    """The weights `strategy.final` picks, `model` fitted on (X_seen, y_seen).

    `bounds` (max_weight, min_weight), or a climb.optimize.bounds.Bounds: an averaged pick is
    projected back inside them (climb.optimize.pick.project, climb.optimize.bounds.project), and
    with a Bounds only mixtures that hold it are picked from (where none measured does, a
    ValueError); `natural` with `strategy.final_kl` > 0: the predicted pick pays
    final_kl * KL(w || natural) (in the objective's units), as Olmix's proposer does.
    """
    from climb.optimize.bounds import Bounds
    s = goal_sign(goal)
    team = bounds if isinstance(bounds, Bounds) else None
    if team is not None:
        X_seen, y_seen, pool = _holding(X_seen, y_seen, pool, team)
    if strategy.final == "seen":
        return X_seen[int(np.argmin(s * y_seen))]
    if strategy.final == "measured-predicted":
        if strategy.final_top_k <= 1:
            return X_seen[int(np.argmin(s * model.predict(X_seen)))]
        # The mean of the k measured mixtures the predictor rates best, each counted once however
        # often it was trained (replicates): an average over the measured near-best, not a chase
        # of the one proxy that measured luckiest, and never outside the region the search measured.
        _, first = np.unique(X_seen, axis=0, return_index=True)
        C = X_seen[np.sort(first)]
        score = s * model.predict(C)
    else:
        C = np.vstack([np.asarray(pool, float), X_seen])
        score = s * model.predict(C)
        if strategy.final_kl and natural is not None:
            score = score + strategy.final_kl * kl_to(C, natural)
    order = np.argsort(score, kind="stable")
    w = C[order[: max(1, strategy.final_top_k)]].mean(0)
    w = w / w.sum()
    if bounds is not None and strategy.final_top_k > 1:
        if team is None:
            from climb.optimize.pick import project
            return project(w, *bounds)
        from climb.optimize.bounds import project as project_bounds
        from climb.optimize.bounds import satisfied
        p = project_bounds(w, team)[0]
        if satisfied(p, team)[0]:
            return p
        log.warning("the mean of the top %d predicted mixtures could not be brought inside the bounds; the "
                    "best predicted one is taken", strategy.final_top_k)
        return C[order[0]]
    return w


def _holding(X_seen, y_seen, pool, bounds):
    """The measured mixtures and the pool's that hold the team's bounds (search.bounds, kl_max: a
    fixed candidate set need not meet the caps and min_weight); a ValueError where no measured one does."""
    from climb.optimize.bounds import satisfied
    X_seen, pool = np.asarray(X_seen, float), np.asarray(pool, float)
    ok = satisfied(X_seen, bounds, caps=False)
    if not ok.any():
        raise ValueError(f"none of the {len(X_seen)} measured mixtures holds the bounds")
    return X_seen[ok], np.asarray(y_seen, float)[ok], pool[satisfied(pool, bounds, caps=False)] if len(pool) else pool


def kl_to(W, natural) -> np.ndarray:
    """KL(w || natural) per row, in nats (0 log 0 = 0)."""
    W, q = np.asarray(W, float), np.asarray(natural, float)
    with np.errstate(divide="ignore", invalid="ignore"):
        t = np.where(W > 0, W * np.log(W / np.where(q > 0, q, 1e-300)), 0.0)
    return t.sum(-1)


def final_pick(X_seen, y_seen, goal: str, pool: np.ndarray, strategy: Strategy, seed: int, bounds=None,
               natural=None, steadiness: int = 0) -> dict:
    """The chosen mixture: weights, the predictor's value for it, and the predictor's name.

    `steadiness` > 0: also the pick made again on that many bootstrap resamples of the results
    (climb.optimize.pick.steadiness), each scored by the predictor fitted on all of them, and the
    regret the predictor's posterior still allows the pick (climb.optimize.pick.posterior_regret).
    """
    X_seen, y_seen = np.asarray(X_seen, float), np.asarray(y_seen, float)
    model = _fit(strategy, X_seen, y_seen, seed, strategy.final_noise)
    w = pick_weights(X_seen, y_seen, goal, pool, strategy, model, bounds, natural)
    w = w / w.sum()
    out = {"weights": w, "predicted": float(model.predict(w[None])[0]), "predictor": model.name}
    if steadiness:
        from climb.optimize.pick import steadiness as boot
        out["steadiness"] = boot(
            lambda Xb, yb: pick_weights(Xb, yb, goal, pool, strategy, _fit(strategy, Xb, yb, seed, strategy.final_noise),
                                        bounds, natural),
            X_seen, y_seen, goal, model.predict, n_boot=steadiness, seed=seed)
        from climb.optimize.pick import posterior_regret
        out["steadiness"].update(posterior_regret(model, X_seen, y_seen, w, pool, goal, seed=seed))
    return out


def simulate(X: np.ndarray, y: np.ndarray, goal: str, iterations, strategy: Strategy, seed: int = 0,
             noise: float = 0.0) -> dict:
    """A whole search over the finite pool X whose results y are known: each proxy is a look-up.

    `noise` > 0 adds Gaussian noise of that sd to every measurement (drawn once per mixture
    and seed, as one proxy run would be), while the regret is still judged on y. Returns
    the pick's pool index, its regret (its value minus the pool's best, >= 0) and rank
    (1 = the pool's best), and the indices measured, in order.
    """
    X, y = np.asarray(X, float), np.asarray(y, float)
    s = goal_sign(goal)
    obs = y + noise * np.random.default_rng([seed, 7]).standard_normal(len(y)) if noise else y
    seen: list[int] = []
    for it, n in enumerate(iterations):
        idx, _ = plan(it, n, X[seen], obs[seen], goal, X, strategy, seed, last=it == len(iterations) - 1)
        seen += [int(i) for i in idx]
    pick = final_pick(X[seen], obs[seen], goal, X, strategy, seed)
    i = int(row_index(pick["weights"][None], X, tol=1e-6)[0])
    if i < 0:
        raise ValueError("the final pick is not a member of the pool (final_top_k > 1 averages mixtures)")
    return {"pick": i, "regret": float(s * y[i] - np.min(s * y)), "rank": int(1 + np.sum(s * y < s * y[i])),
            "measured": seen}
