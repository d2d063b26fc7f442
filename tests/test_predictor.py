"""Predictors, ranking metrics and the search step on synthetic swarms with a known optimum."""
from __future__ import annotations

import numpy as np
import pytest

from climb.optimize.candidates import dedupe, sample_candidates
from climb.optimize.predictor import PREDICTORS, best_mixture, make_predictor, min_child_samples, propose, rank_metrics

OPT = np.array([0.55, 0.2, 0.1, 0.1, 0.05])  # the known optimum of the synthetic response


def response(X, rng=None, noise=0.005):
    """Smooth bowl with its minimum at OPT (in log space, as data-mixture losses behave), plus noise."""
    y = 0.5 * np.sum((np.log(X + 1e-3) - np.log(OPT + 1e-3)) ** 2 * OPT, axis=1) + np.sum((X - OPT) ** 2, axis=1)
    return y + (noise * rng.normal(size=len(X)) if rng is not None else 0.0)


def swarm(n, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.dirichlet(np.ones(OPT.size), n)
    return X, response(X, rng)


def test_rank_metrics_handmade():
    y_true, y_pred = np.array([3.0, 1.0, 2.0, 5.0]), np.array([2.9, 1.5, 1.2, 4.0])
    r = rank_metrics(y_true, y_pred, "minimize")
    assert r["spearman"] == pytest.approx(0.8)
    assert r["top1_regret"] == pytest.approx(1.0)  # picked index 2 (true 2.0), best is 1.0
    assert r["top1_rank"] == 2
    r = rank_metrics(y_true, y_pred, "maximize")
    assert r["top1_regret"] == 0.0 and r["top1_rank"] == 1  # picked index 3, truly the largest
    perfect = rank_metrics(y_true, y_true, "minimize")
    assert perfect["spearman"] == pytest.approx(1.0) and perfect["top1_regret"] == 0 and perfect["top1_rank"] == 1
    flipped = rank_metrics(y_true, -y_true, "minimize")
    assert flipped["spearman"] == pytest.approx(-1.0) and flipped["top1_rank"] == 4
    assert flipped["top1_regret"] == pytest.approx(4.0)
    assert np.isnan(rank_metrics(y_true, np.ones(4), "minimize")["spearman"])  # constant prediction
    with pytest.raises(ValueError, match="goal"):
        rank_metrics(y_true, y_pred, "lowest")


def test_make_predictor_names():
    with pytest.raises(ValueError) as e:
        make_predictor("xgboost")
    for name in ("default", "lightgbm", "linear"):
        assert name in str(e.value) and name in PREDICTORS
    plain = make_predictor("lightgbm")
    assert plain.params["n_estimators"] == 1000 and plain.params["learning_rate"] == 0.01
    assert set(plain.params) == {"n_estimators", "learning_rate", "verbose", "n_jobs", "random_state"}


@pytest.mark.parametrize("name", ["default", "gp", "lightgbm"])
def test_predictor_ranks_held_out_points(name):
    X, y = swarm(300)
    m = make_predictor(name).fit(X[:100], y[:100])
    assert m.name == name
    r = rank_metrics(response(X[100:]), m.predict(X[100:]), "minimize")
    assert r["spearman"] > (0.9 if name != "lightgbm" else 0.8), r


def test_linear_is_least_squares():
    rng = np.random.default_rng(1)
    X = rng.dirichlet(np.ones(4), 50)
    coef = np.array([1.0, 2.0, -1.0, 0.5])
    m = make_predictor("linear").fit(X, X @ coef)
    np.testing.assert_allclose(m.predict(X), X @ coef, atol=1e-9)


@pytest.mark.parametrize("goal", ["minimize", "maximize"])
def test_propose_moves_toward_the_optimum(goal):
    X, y = swarm(40, seed=2)
    sign = 1.0 if goal == "minimize" else -1.0  # maximize: the negated bowl, same optimum
    pool = sample_candidates(np.full(OPT.size, 1 / OPT.size), 5000, np.random.default_rng(3))
    P, pred = propose(X, sign * y, goal, pool, 8, predictor_name="gp", seed=0, explore_frac=0.25, min_l1=0.05)
    assert P.shape == (8, OPT.size) and pred.shape == (8,)
    np.testing.assert_allclose(P.sum(1), 1.0)
    assert np.abs(P.mean(0) - OPT).sum() < np.abs(X.mean(0) - OPT).sum()
    # the exploit proposals are better than the seen ones on the true response
    assert response(P[:6]).mean() < response(X).mean()
    best_seen = np.min(response(X))
    assert response(P[:1])[0] <= best_seen + 0.05
    # diversity: every proposal at least min_l1 from the others and from what was seen
    d = np.abs(P[:, None] - P[None]).sum(-1) + np.eye(8) * 9
    assert d.min() >= 0.05 - 1e-9
    assert np.abs(P[:, None] - X[None]).sum(-1).min() >= 0.05 - 1e-9
    # predicted values come back in the order of the exploit slots
    assert np.all(np.diff(sign * pred[:6]) >= -1e-12)


def test_propose_with_default_predictor_and_few_results():
    X, y = swarm(6, seed=4)  # below the blend's inner-CV minimum: the smooth model alone
    pool = sample_candidates(np.full(OPT.size, 1 / OPT.size), 2000, np.random.default_rng(5))
    P, pred = propose(X, y, "minimize", pool, 4)
    assert P.shape == (4, OPT.size) and np.isfinite(pred).all()
    # the default is the GP alone here: its predictions, its best candidate first
    gp = make_predictor("gp").fit(X, y)
    np.testing.assert_allclose(pred, gp.predict(P), rtol=0, atol=1e-12)
    assert pred[0] == pytest.approx(gp.predict(pool).min())
    # and the exploit proposals are truly good: better than the best of the six seen, in the pool's top 10%
    assert response(P[:3]).max() < response(X).min()
    assert (response(pool) < response(P[:3]).mean()).mean() < 0.1


def test_best_mixture_top_k():
    X, y = swarm(120, seed=6)
    m = make_predictor("gp").fit(X, y)
    pool = sample_candidates(np.full(OPT.size, 1 / OPT.size), 4000, np.random.default_rng(7))
    w1 = best_mixture(m, pool, "minimize")
    w5 = best_mixture(m, pool, "minimize", top_k=5)
    assert w1.sum() == pytest.approx(1.0) and w5.sum() == pytest.approx(1.0)
    assert np.abs(w1 - OPT).sum() < 0.3 and np.abs(w5 - OPT).sum() < 0.3
    assert np.abs(w1 - OPT).sum() < np.abs(pool - OPT).sum(1).mean() / 3


def test_sample_candidates_constraints():
    prior = np.array([0.5, 0.3, 0.15, 0.05, 0.0])
    cap = np.array([0.4, 0.5, 0.5, 0.5, 1.0])
    rng = np.random.default_rng(0)
    W = sample_candidates(prior, 3000, rng, concentrations=(2.0, 10.0), temperature=0.5, min_weight=0.02,
                          max_weight=cap, dedupe_l1=0.01)
    assert 2000 < len(W) <= 3000
    np.testing.assert_allclose(W.sum(1), 1.0)
    assert (W >= 0).all() and (W <= cap + 1e-9).all()
    assert (W[:, 4] == 0).all()  # a domain the prior does not have stays out
    assert ((W == 0) | (W >= 0.02 - 1e-12)).all()  # zeroed below min_weight, never pushed back under it
    d = np.abs(W[:300, None] - W[None, :300]).sum(-1) + np.eye(300) * 9
    assert d.min() >= 0.01 - 1e-9
    with pytest.raises(ValueError, match="caps"):
        sample_candidates(prior, 10, rng, max_weight=np.full(5, 0.1))
    # a high concentration stays near the tempered prior
    tight = sample_candidates(np.array([0.6, 0.3, 0.1]), 500, np.random.default_rng(1), concentrations=(1000.0,))
    np.testing.assert_allclose(tight.mean(0), [0.6, 0.3, 0.1], atol=0.01)


def test_dedupe_keeps_first_of_each_cluster():
    W = np.array([[0.5, 0.5], [0.5005, 0.4995], [0.9, 0.1], [0.5, 0.5]])
    out = dedupe(W, 0.01)
    np.testing.assert_allclose(out, [[0.5, 0.5], [0.9, 0.1]])


def test_propose_rejects_small_pool():
    X, y = swarm(10)
    with pytest.raises(ValueError, match="candidates"):
        propose(X, y, "minimize", X[:3], 5)


def test_default_falls_back_to_trees_on_a_step_response():
    rng = np.random.default_rng(8)
    X = rng.dirichlet(np.full(6, 0.7), 240)
    y = (X[:, 0] > 0.2) + 0.7 * (X[:, 1] > 0.15) + 0.02 * rng.normal(size=len(X))
    m = make_predictor("default").fit(X, y)
    assert m.alpha <= 0.5, m.cv_scores  # the inner CV saw that the trees rank better here
    smooth = make_predictor("default").fit(*swarm(120, seed=9))
    assert smooth.alpha >= 0.5, smooth.cv_scores


def test_plain_lightgbm_splits_on_small_swarms():
    X, y = swarm(60, seed=11)
    for n, least in ((8, 0.0), (16, 0.5), (32, 0.7)):
        pred = make_predictor("lightgbm").fit(X[:n], y[:n]).predict(X[n:])
        assert np.ptp(pred) > 0, n  # with the library's min_child_samples=20 this was one constant
        assert rank_metrics(response(X[n:]), pred, "minimize")["spearman"] > least
    assert [min_child_samples(n) for n in (3, 16, 56, 199, 200, 512)] == [2, 2, 5, 19, 20, 20]


def test_constant_prediction_has_no_ranking():
    y = np.array([3.0, 1.0, 2.0])
    r = rank_metrics(y, np.full(3, 2.5), "minimize")
    assert r["constant_prediction"] and r["top1_rank"] is None and np.isnan(r["top1_regret"])
    # least squares on a constant target: equal up to rounding still counts as constant
    r = rank_metrics(y, 2.5 + np.array([0.0, 4e-16, -4e-16]), "minimize")
    assert r["constant_prediction"] and np.isnan(r["spearman"]) and np.isnan(r["pearson"])
    assert not rank_metrics(y, np.array([1.0, 2.0, 2.0]), "minimize")["constant_prediction"]


def test_default_is_the_smooth_model_when_trees_cannot_split():
    X, y = swarm(30, seed=10)  # the default's trees keep min_child_samples=20: 40 rows for one split
    m = make_predictor("default").fit(X, y)
    assert m.alpha == 1.0 and m.models[1] is None
    np.testing.assert_allclose(m.predict(X[:5]), make_predictor("gp").fit(X, y).predict(X[:5]))


@pytest.mark.parametrize("kernel", ["matern52", "rbf"])
def test_gp_equals_sklearn_at_fixed_hyperparameters(kernel):
    """climb's GP (own kernel and analytic gradient) against scikit-learn's at the same
    hyperparameters: the same kernel, signal variance and noise, no optimiser."""
    from sklearn.gaussian_process import GaussianProcessRegressor
    from sklearn.gaussian_process.kernels import RBF, ConstantKernel, Matern

    from climb.optimize.acquisition import gp_posterior
    from climb.optimize.gp import GPPredictor
    X, y = swarm(40, seed=12)
    gp = GPPredictor(kernel=kernel).fit(X, y)
    base = (Matern(length_scale=gp.ls, length_scale_bounds="fixed", nu=2.5) if kernel == "matern52"
            else RBF(length_scale=gp.ls, length_scale_bounds="fixed"))
    sk = GaussianProcessRegressor(ConstantKernel(gp.s2, constant_value_bounds="fixed") * base,
                                  alpha=gp.sn + 1e-8, optimizer=None, normalize_y=False)
    # the same standardised features and targets climb's GP works on
    features = lambda W: (np.log(W + gp.eps) - gp.mu) / gp.sd  # noqa: E731
    sk.fit(features(X), (y - gp.ym) / gp.ys)
    Q = np.random.default_rng(13).dirichlet(np.ones(OPT.size), 200)
    mean, std = sk.predict(features(Q), return_std=True)
    np.testing.assert_allclose(gp.predict(Q), mean * gp.ys + gp.ym, rtol=0, atol=1e-6)
    np.testing.assert_allclose(gp.predict(X), sk.predict(features(X)) * gp.ys + gp.ym, rtol=0, atol=1e-6)
    _, var = gp_posterior(gp, Q)
    np.testing.assert_allclose(np.sqrt(var), std * gp.ys, rtol=0, atol=1e-6)


@pytest.mark.parametrize("kernel,linear", [("matern52", False), ("rbf", False), ("matern52", True)])
def test_gp_evidence_gradient_is_the_derivative_of_the_evidence(kernel, linear):
    """The hand-written gradient of the negative log evidence (plus the lengthscale prior)
    against finite differences of the function itself (scipy.optimize.check_grad), at
    random hyperparameters of every kind: lengthscales, signal, noise, the linear trend."""
    from scipy.optimize import approx_fprime, check_grad

    from climb.optimize.gp import GPPredictor
    X, y = swarm(30, seed=5)
    gp = GPPredictor(kernel=kernel, linear=linear)
    F = np.log(X + gp.eps)
    F = (F - F.mean(0)) / F.std(0)
    yz = (y - y.mean()) / y.std()
    d = F.shape[1]
    rng = np.random.default_rng(0)
    for _ in range(5):
        th = np.r_[rng.normal(np.log(np.sqrt(d)), 0.5, d), rng.normal(0, 0.5), rng.uniform(-5, -1),
                   [rng.normal(-2, 0.5)] if linear else []]
        f = lambda t: gp._nll(t, F, yz)[0]  # noqa: E731
        g = lambda t: gp._nll(t, F, yz)[1]  # noqa: E731
        err = check_grad(f, g, th, epsilon=1e-6)
        assert err < 1e-4 * max(1.0, np.linalg.norm(g(th))), (err, np.linalg.norm(g(th)))
        np.testing.assert_allclose(g(th), approx_fprime(th, f, 1e-6), rtol=1e-3, atol=1e-4)
    # and the gradient is not trivially zero where the evidence is not flat
    assert np.linalg.norm(g(th)) > 1e-2


def test_the_config_names_the_registered_predictors():
    """climb.config checks names without importing the predictors; the two lists must agree."""
    from climb.config import SEARCH_PREDICTORS
    assert PREDICTORS == SEARCH_PREDICTORS
