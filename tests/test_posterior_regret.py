"""posterior_regret: how far the predictor's posterior says a pick may still be from the best."""
from __future__ import annotations

import numpy as np

from climb.optimize.gp import GPPredictor
from climb.optimize.pick import posterior_regret
from climb.optimize.quality import warnings


def _f(W):
    return (W[:, 0] - 0.6) ** 2 + 0.5 * W[:, 1]


def _pool(n, k, seed):
    return np.random.default_rng(seed).dirichlet(np.ones(k), n)


def test_a_well_measured_pick_has_less_regret_than_a_poor_one():
    X = _pool(40, 4, 0)
    y = _f(X)
    gp = GPPredictor(seed=0).fit(X, y)
    pool = _pool(500, 4, 1)
    good = posterior_regret(gp, X, y, X[np.argmin(y)], pool, "minimize", seed=0)
    bad = posterior_regret(gp, X, y, X[np.argmax(y)], pool, "minimize", seed=0)
    assert 0 <= good["posterior_regret"] < bad["posterior_regret"]
    assert good["posterior_spread"] >= 0


def test_unmeasured_candidates_add_regret():
    # results from one corner of the simplex only; the pool near them, then with the far corners too
    rng = np.random.default_rng(2)
    X = 0.7 * np.eye(4)[0] + 0.3 * rng.dirichlet(np.ones(4), 25)
    y = _f(X)
    gp = GPPredictor(seed=0).fit(X, y)
    near = 0.7 * np.eye(4)[0] + 0.3 * rng.dirichlet(np.ones(4), 300)
    far = 0.9 * np.eye(4)[1:].repeat(50, 0) + 0.1 * rng.dirichlet(np.ones(4), 150)
    a = posterior_regret(gp, X, y, X[np.argmin(y)], near, "minimize", n_samples=2000, seed=0)
    b = posterior_regret(gp, X, y, X[np.argmin(y)], np.vstack([near, far]), "minimize", n_samples=2000, seed=0)
    assert b["posterior_regret"] > a["posterior_regret"]
    assert b["posterior_spread"] > a["posterior_spread"]


def test_maximize_mirrors_minimize():
    X = _pool(30, 3, 4)
    y = _f(X)
    pool = _pool(300, 3, 5)
    kw = {"n_samples": 4000, "seed": 1}
    lo = posterior_regret(GPPredictor(seed=0).fit(X, y), X, y, X[np.argmin(y)], pool, "minimize", **kw)
    hi = posterior_regret(GPPredictor(seed=0).fit(X, -y), X, -y, X[np.argmin(y)], pool, "maximize", **kw)
    # the same posterior, mirrored: equal up to the sampling error of 4,000 draws
    assert np.isclose(lo["posterior_regret"], hi["posterior_regret"], rtol=0.05)
    assert np.isclose(lo["posterior_spread"], hi["posterior_spread"], rtol=0.05)


def test_the_run_warns_when_the_spread_is_large_against_the_gain():
    q = {"comparison": {"uniform": {"diff": -0.10, "verdict": "better"}, "natural": {"diff": -0.20, "verdict": "better"}}}
    q["steadiness"] = {"rerun_sd": 0.02, "posterior_spread": 0.005, "posterior_regret": 0.01}
    assert any("may move with the search seed" in w and "target_prior" in w and "iterations = [8, 8, 4, 8]" in w
               for w in warnings(q))
    q["steadiness"] = {"rerun_sd": 0.004, "posterior_spread": 0.02, "posterior_regret": 0.03}
    assert not any("may move with the search seed" in w for w in warnings(q))
