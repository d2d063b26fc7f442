"""The final pick stays inside the search's bounds, and says how steady it is.

Property tests over random mixtures, caps and minimum weights (numpy's generator, fixed
seeds): every projected or averaged pick sums to one and gives each cluster 0 or a weight
in [min_weight, cap]; a pick already inside is left alone. The steadiness figure is larger
for a planted noisy swarm than for a quiet one on the same mixtures; so is the simulated
re-run figure (`rerun_sd`).
"""
from __future__ import annotations

import numpy as np
import pytest

from climb.optimize.pick import feasible, project, steadiness, within
from climb.optimize.rerun import neighbours_mean, predicted_mean, rerun_spread, trend_mean
from climb.optimize.strategy import Strategy, final_pick, pick_weights


def _case(rng, k):
    """Random caps (some below the minimum, so those clusters must be 0) that admit a mixture."""
    min_weight = float(rng.choice([0.0, 0.01, 0.02, 0.05]))
    while True:
        caps = rng.uniform(0.0, 0.6, k)
        if feasible(caps, min_weight):
            return caps, min_weight


@pytest.mark.parametrize("k", [3, 8, 24])
def test_projection_obeys_the_simplex_caps_and_minimum_weight(k):
    rng = np.random.default_rng(k)
    for _ in range(300):
        caps, min_weight = _case(rng, k)
        w = rng.dirichlet(np.full(k, rng.choice([0.1, 1.0, 10.0])))
        if rng.random() < 0.3:  # off the simplex too: negative and unnormalised
            w = w * rng.uniform(0.5, 2) - rng.uniform(0, 0.05, k)
        p = project(w, caps, min_weight)
        assert within(p, caps, min_weight), (w, caps, min_weight, p)


def test_projection_leaves_a_mixture_inside_the_bounds_alone():
    rng = np.random.default_rng(1)
    for _ in range(200):
        caps, min_weight = _case(rng, 6)
        p = project(rng.dirichlet(np.ones(6)), caps, min_weight)
        np.testing.assert_allclose(project(p, caps, min_weight), p, atol=1e-9)


def test_projection_is_the_nearest_point_among_those_it_could_choose():
    """On the support it keeps, no random feasible point with that support is nearer."""
    rng = np.random.default_rng(2)
    caps, min_weight = np.full(5, 0.5), 0.05
    for _ in range(50):
        w = rng.dirichlet(np.ones(5))
        p = project(w, caps, min_weight)
        d = np.linalg.norm(p - w)
        for _ in range(200):
            q = project(p + rng.normal(0, 0.05, 5) * (p > 0), caps, min_weight)
            if (q > 0).sum() == (p > 0).sum():
                assert np.linalg.norm(q - w) >= d - 1e-9


def test_projection_refuses_bounds_no_mixture_fits():
    with pytest.raises(ValueError, match="no mixture fits"):
        project(np.ones(3) / 3, np.array([0.3, 0.3, 0.3]), 0.0)
    with pytest.raises(ValueError, match="no mixture fits"):  # only one cluster can hold the minimum
        project(np.ones(3) / 3, np.array([0.9, 0.01, 0.01]), 0.02)


def _bowl(X, centre):
    return ((X - centre) ** 2).sum(1)


def test_an_averaged_pick_that_breaks_the_bounds_is_put_back_inside():
    """The mean of the predicted top k of a pool that obeys the bounds can break them (a cluster
    at 0 in some and at the minimum in others); the pick must not."""
    rng = np.random.default_rng(3)
    k, min_weight = 6, 0.05
    caps = np.array([0.35, 0.35, 0.35, 0.35, 0.35, 0.35])
    raw = rng.dirichlet(np.full(k, 0.4), 4000)
    pool = np.array([project(w, caps, min_weight) for w in raw])
    assert all(within(w, caps, min_weight) for w in pool[:50])
    centre = np.array([0.33, 0.33, 0.2, 0.07, 0.07, 0.0])
    X = pool[:40]
    y = _bowl(X, centre)
    strategy = Strategy(predictor="gp", final="predicted", final_top_k=64)
    from climb.optimize.strategy import _fit
    model = _fit(strategy, X, y, 0)
    mean = pick_weights(X, y, "minimize", pool, strategy, model)
    assert not within(mean, caps, min_weight)  # the plain average breaks them here
    w = pick_weights(X, y, "minimize", pool, strategy, model, bounds=(caps, min_weight))
    assert within(w, caps, min_weight)
    pick = final_pick(X, y, "minimize", pool, strategy, 0, bounds=(caps, min_weight))
    assert within(pick["weights"], caps, min_weight)


def test_kl_penalty_pulls_the_pick_toward_the_natural_mixture():
    rng = np.random.default_rng(4)
    k = 5
    natural = np.array([0.4, 0.3, 0.15, 0.1, 0.05])
    pool = rng.dirichlet(np.ones(k), 3000)
    X = pool[:40]
    y = _bowl(X, np.array([0.0, 0.0, 0.1, 0.4, 0.5]))
    from climb.optimize.strategy import _fit, kl_to
    kl = []
    for lam in (0.0, 0.05, 1.0):
        strategy = Strategy(predictor="gp", final="predicted", final_kl=lam)
        w = pick_weights(X, y, "minimize", pool, strategy, _fit(strategy, X, y, 0), natural=natural)
        kl.append(float(kl_to(w[None], natural)[0]))
    assert kl[0] > kl[1] > kl[2]


def _swarm(noise, seed=5, n=40, k=6):
    rng = np.random.default_rng(seed)
    X = rng.dirichlet(np.ones(k), n)
    y = _bowl(X, np.full(k, 1 / k)) + rng.normal(0, noise, n)
    return X, y


@pytest.mark.parametrize("final", ["seen", "measured-predicted"])
def test_steadiness_is_larger_for_a_noisy_swarm_than_a_quiet_one(final):
    strategy = Strategy(predictor="gp", final=final)
    figures = {}
    for noise in (0.002, 0.05):
        X, y = _swarm(noise)
        pick = final_pick(X, y, "minimize", X, strategy, 0, steadiness=24)
        figures[noise] = pick["steadiness"]
        assert pick["steadiness"]["n_boot"] == 24
        assert all(abs(p.sum() - 1) < 1e-9 for p in pick["steadiness"]["picks"])
    assert figures[0.05]["pick_sd"] > 2 * figures[0.002]["pick_sd"]
    assert figures[0.05]["pick_l1"] > figures[0.002]["pick_l1"]


def test_steadiness_does_not_depend_on_the_order_of_the_results():
    """Given the rows in the same order it is a fixed function of them (the stage sorts them
    by mixture id first, so a resumed run's figure is bit-identical)."""
    X, y = _swarm(0.01)
    strategy = Strategy(predictor="gp", final="seen")
    a = final_pick(X, y, "minimize", X, strategy, 0, steadiness=8)["steadiness"]
    b = final_pick(X.copy(), y.copy(), "minimize", X, strategy, 0, steadiness=8)["steadiness"]
    assert a["pick_sd"] == b["pick_sd"] and np.array_equal(a["picks"], b["picks"])


def test_the_rerun_figure_is_larger_for_a_noisy_swarm_than_a_quiet_one():
    """rerun_spread: the search simulated again on what the results say; with the same mixtures,
    noisier results (and noisier simulated look-ups) move the simulated answer more."""
    strategy = Strategy(predictor="gp", final="seen")
    pool = np.random.default_rng(11).dirichlet(np.ones(6), 300)
    figures = {}
    for noise in (0.002, 0.05):
        X, y = _swarm(noise)
        figures[noise] = rerun_spread(X, y, "minimize", pool, [8, 8, 4], strategy, noise)
        assert figures[noise]["rerun_runs"] == 8
        lo, hi = figures[noise]["rerun_range"]
        assert y.min() - 1e-12 <= lo <= hi <= y.max() + 1e-12  # a kernel average: within the measured values
    assert figures[0.05]["rerun_sd"] > 2 * figures[0.002]["rerun_sd"]


def test_neighbours_mean_reproduces_the_measured_and_never_reads_better_than_the_best():
    X, y = _swarm(0.002)
    pool = np.random.default_rng(12).dirichlet(np.ones(6), 500)
    f, h = neighbours_mean(X, y, pool)
    assert h > 0 and f.min() >= y.min() - 1e-12 and f.max() <= y.max() + 1e-12
    # a smooth bowl: the average tracks it where the measured mixtures are
    g, _ = neighbours_mean(X, y, X)
    assert np.corrcoef(g, y)[0, 1] > 0.8


def test_the_trend_landscape_carries_a_gradient_where_the_kernel_average_holds_its_nearest_value():
    """trend_mean: on a line in the weights measured only near one corner and one far point, a
    mixture past the measured ones toward the good corner reads better than its nearest measured
    neighbour under the trend (never better than the best measured), where the kernel average holds
    the nearest value; predicted_mean stays inside the measured range too."""
    rng = np.random.default_rng(5)
    X = np.vstack([rng.dirichlet(np.ones(4) * 30, 10), rng.dirichlet([1, 1, 1, 8], 10)])
    y = 3.0 - 1.0 * X[:, 3]  # more of the fourth component, lower loss
    P = np.array([[0.02, 0.02, 0.02, 0.94], [0.25, 0.25, 0.25, 0.25]])
    f, _ = trend_mean(X, y, P, "minimize")
    g, _ = neighbours_mean(X, y, P)
    assert f.min() >= y.min() - 1e-12 and f.max() <= y.max() + 1e-12
    assert f[0] <= g[0] + 1e-9 and f[0] < f[1]
    with pytest.raises(ValueError, match="unknown truth"):
        rerun_spread(X, y, "minimize", P, [2], Strategy(predictor="gp"), 0.0, truth="nope")
    h, _ = predicted_mean(X, y, P, "minimize", "gp")
    assert h.min() >= y.min() - 1e-12 and h.max() <= y.max() + 1e-12 and h[0] < h[1]


def test_the_rerun_figure_does_not_depend_on_the_order_of_the_results():
    """The stage passes the results in mixture-id order (rerun_figure); given rows in any order
    the figure is the same function of them up to floating point, and bit-identical in one order."""
    X, y = _swarm(0.01)
    pool = np.random.default_rng(13).dirichlet(np.ones(6), 200)
    strategy = Strategy(predictor="gp", final="seen")
    a = rerun_spread(X, y, "minimize", pool, [8, 4], strategy, 0.01)
    b = rerun_spread(X.copy(), y.copy(), "minimize", pool, [8, 4], strategy, 0.01)
    assert a == b
    perm = np.random.default_rng(1).permutation(len(y))
    c = rerun_spread(X[perm], y[perm], "minimize", pool, [8, 4], strategy, 0.01)
    assert np.isclose(c["rerun_sd"], a["rerun_sd"], rtol=1e-9, atol=1e-12)


def test_the_measured_top_k_mean_stays_among_the_measured_and_inside_the_bounds():
    """final = "measured-predicted" with final_top_k > 1: the mean of the k measured mixtures the
    predictor rates best, each counted once (replicates repeat a mixture), put back inside the caps
    and the minimum weight; with k = 1 it is the single measured mixture the predictor rates best."""
    rng = np.random.default_rng(5)
    k, min_weight = 6, 0.05
    caps = np.full(k, 0.35)
    pool = np.array([project(w, caps, min_weight) for w in rng.dirichlet(np.full(k, 0.4), 400)])
    centre = pool[0]  # the best mixture is one of those trained again
    X = np.vstack([pool[:30], pool[:3]])  # three mixtures trained again (replicates)
    y = _bowl(X, centre) + 0.002 * rng.standard_normal(len(X))
    from climb.optimize.strategy import _fit
    one = Strategy(predictor="gp", final="measured-predicted")
    four = Strategy(predictor="gp", final="measured-predicted", final_top_k=4)
    model = _fit(four, X, y, 0)
    best = pick_weights(X, y, "minimize", pool, one, model)
    assert any(np.array_equal(best, x) for x in X)
    order = np.argsort(model.predict(pool[:30]))
    want = pool[:30][order[:4]].mean(0)
    got = pick_weights(X, y, "minimize", pool, four, model)
    np.testing.assert_allclose(got, want / want.sum())  # the replicates do not count twice
    w = final_pick(X, y, "minimize", pool, four, 0, bounds=(caps, min_weight))["weights"]
    assert within(w, caps, min_weight)
    assert np.isclose(w.sum(), 1.0)


def test_a_noise_floor_keeps_the_gp_from_reproducing_each_measurement():
    """With a few dozen results in several dimensions the evidence alone can settle on no noise and
    interpolate every measurement; a floor at the measured seed noise makes the GP smooth over it."""
    from climb.optimize.gp import GPPredictor
    X, y = _swarm(0.03, seed=7, n=28, k=8)
    free = GPPredictor(seed=0).fit(X, y)
    floor = GPPredictor(seed=0, noise_floor=0.03).fit(X, y)
    assert np.sqrt(floor.sn) * floor.ys >= 0.03 * (1 - 1e-6)
    assert np.sqrt(np.mean((floor.predict(X) - y) ** 2)) > 0.5 * 0.03
    # a floor of 0 is the evidence alone, bit for bit
    same = GPPredictor(seed=0, noise_floor=0.0).fit(X, y)
    assert np.array_equal(same.predict(X), free.predict(X))


def test_the_pick_by_a_denoised_predictor_chases_noise_less_than_the_best_measured():
    """A planted swarm whose seed noise is as large as its spread: over many draws the measured
    mixture the floored GP rates best is truly better, on average, than the one measured best."""
    seen, denoised, differ = [], [], 0
    for seed in range(24):
        rng = np.random.default_rng(100 + seed)
        X = rng.dirichlet(np.ones(6), 28)
        f = _bowl(X, np.full(6, 1 / 6))
        noise = float(np.std(f))
        y = f + rng.normal(0, noise, len(f))
        a = pick_weights(X, y, "minimize", X, Strategy(predictor="gp", final="seen"), None)
        st = Strategy(predictor="gp", final="measured-predicted", final_noise=noise)
        from climb.optimize.strategy import _fit
        b = pick_weights(X, y, "minimize", X, st, _fit(st, X, y, 0, noise))
        ia, ib = (int(np.argmin(np.abs(X - w).sum(1))) for w in (a, b))
        seen.append(f[ia])
        denoised.append(f[ib])
        differ += ia != ib
    assert differ >= 6
    assert np.mean(denoised) < np.mean(seen)


@pytest.mark.parametrize("sets, said", [
    (['search.final_noise="smoothed"'], "fitted.*measured"),
    (['search.final_noise="measured"', "search.replicates=0"], "search.replicates >= 2"),
])
def test_bad_final_noise_is_refused_at_load(sets, said):
    from climb.config import ConfigError, load_config
    with pytest.raises(ConfigError, match=said):
        load_config(None, sets)


def test_a_measured_noise_pick_without_a_measurement_is_refused():
    from climb.io.files import InputError
    from climb.config import load_config
    from climb.stages.search.common import final_mixture
    cfg = load_config(None, ['search.final="measured-predicted"', 'search.final_noise="measured"'])
    X, y = _swarm(0.01)
    space = {"usable": np.ones(6, bool), "max_weight": np.ones(6), "natural": np.full(6, 1 / 6)}
    results = [{"mixture_id": f"it0-{i:03d}", "iteration": 0, "status": "ok", "weights": w.tolist(), "objective": float(v)}
               for i, (w, v) in enumerate(zip(X, y))]
    with pytest.raises(InputError, match="replicates"):
        final_mixture(cfg, space, results, pool=X)
    got = final_mixture(cfg, space, results, pool=X, noise=0.01)
    assert any(np.allclose(got["weights"], w) for w in X)
    # a trainer the seed does not move measures no noise: the pick goes on, with no floor
    assert "noise_floor" not in final_mixture(cfg, space, results, pool=X, noise=0.0)


def test_a_repick_reads_the_replicate_noise_under_its_own_objective(tmp_path):
    """repick.rescored_noise: the run's replicates and its own proxies of those mixtures, rescored
    under the re-pick's objective, give the noise `replicate_noise` reads off the same table."""
    import json
    from types import SimpleNamespace

    from climb.config import load_config
    from climb.stages.search.common import replicate_noise
    from climb.stages.search.repick import rescored_noise
    cfg = load_config(None, ['search.final="measured-predicted"', 'search.final_noise="measured"',
                             'target.objective=["a"]', "search.seed=0"])
    vals = {("it0-000", 0): 2.00, ("it0-000", 1): 2.03, ("it0-000", 2): 1.98,
            ("it0-001", 0): 2.10, ("it0-001", 1): 2.09, ("it0-001", 2): 2.16}
    rec = lambda m, s: {"mixture_id": f"{m}-seed{s}", "seed": s, "status": "ok", "iteration": 0,  # noqa: E731
                        "weights": [0.5, 0.5], "metrics": {"a": vals[m, s], "b": 0.0}, "objective": 9.9}
    f = tmp_path / "replicates.json"
    f.write_text(json.dumps({f"{m}/{s}": rec(m, s) for m, s in vals if s}))
    own = [{"mixture_id": m, "objective": vals[m, 0]} for m in ("it0-000", "it0-001")]
    got = rescored_noise(cfg, SimpleNamespace(search=SimpleNamespace(replicates=f)), own)
    want = replicate_noise({m: {s: vals[m, s] for s in range(3)} for m in ("it0-000", "it0-001")})
    assert got == pytest.approx(want) and got > 0.01


def test_the_report_says_when_every_simulated_search_found_the_same_mixture():
    """A rerun figure of 0 means the eight simulated searches agreed, not that the answer cannot move."""
    from climb.stages.report import quality_lines, summary_table
    q = {"steadiness": {"rerun_sd": 0.0, "rerun_range": [1.5, 1.5], "rerun_runs": 8}}
    summary = {"target": {"name": "t", "goal": "minimize"}, "results": {"climb": 1.5, "uniform": 1.6},
               "steadiness": q["steadiness"]}
    assert "every simulated search found the same mixture" in quality_lines(q)
    assert "every simulation found this mixture" in summary_table(summary)
    q["steadiness"].update(rerun_sd=0.004, rerun_range=[1.49, 1.5])
    text, table = quality_lines(q), summary_table(summary)
    assert "sd 0.0040" in text and "same mixture" not in text
    assert "sd 0.0040 over another search seed" in table and "every simulation" not in table
