"""The search strategy over a finite pool: restricted to it, measured by look-up, same as `climb search`.

A pool of Dirichlet mixtures with a known smooth response (a bowl around one
mixture) stands in for a released swarm; every acquisition must stay inside the
pool, never measure a mixture twice, and find a good mixture within a small budget.
"""
from __future__ import annotations

import dataclasses
import json
import sys

import numpy as np
import pandas as pd
import pytest

from climb.optimize.acquisition import ACQUISITIONS, gp_posterior, select_batch
from climb.optimize.gp import GPPredictor
from climb.runtime.lookup import LookupTable
from climb.runtime.lookup import main as lookup_main
from climb.optimize.predictor import make_predictor
from climb.optimize.strategy import Strategy, final_pick, plan, row_index, simulate

OPT = np.array([0.05, 0.6, 0.05, 0.3])


def pool(n=120, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.dirichlet(np.full(OPT.size, 0.8), n)
    return X, ((X - OPT) ** 2).sum(1) + 0.002 * rng.normal(size=n)


@pytest.mark.parametrize("acq", ("explore",) + ACQUISITIONS)
def test_simulate_stays_in_the_pool_and_never_measures_twice(acq):
    X, y = pool()
    st = Strategy(predictor="gp", acquisition=acq, final="predicted")
    out = simulate(X, y, "minimize", (10, 5, 5), st, seed=3)
    assert len(out["measured"]) == 20 and len(set(out["measured"])) == 20
    assert 0 <= out["pick"] < len(X)
    assert out["regret"] == pytest.approx(y[out["pick"]] - y.min()) and out["regret"] >= 0
    assert out["rank"] == 1 + int((y < y[out["pick"]]).sum())
    # 20 of 120 at random would reach the top 10 of the pool only ~ (1 - (110/120)^20) of the time; the
    # search does it by design: its pick is far better than the median mixture.
    assert out["rank"] <= 12, out


def test_final_pick_rules():
    X, y = pool(60, seed=1)
    seen = np.arange(20)
    for final in ("seen", "measured-predicted"):
        w = final_pick(X[seen], y[seen], "minimize", X, Strategy(predictor="gp", final=final), 0)["weights"]
        assert row_index(w[None], X[seen])[0] >= 0  # a measured mixture
    w = final_pick(X[seen], y[seen], "minimize", X, Strategy(predictor="gp", final="seen"), 0)["weights"]
    assert row_index(w[None], X)[0] == int(np.argmin(y[:20]))
    w = final_pick(X[seen], -y[seen], "maximize", X, Strategy(predictor="gp", final="seen"), 0)["weights"]
    assert row_index(w[None], X)[0] == int(np.argmin(y[:20]))  # the goal's direction is respected
    w = final_pick(X[seen], y[seen], "minimize", X, Strategy(predictor="gp", final="predicted"), 0)["weights"]
    assert row_index(w[None], X)[0] >= 0  # predicted best of the pool: a pool member


def test_plan_first_iteration_is_random_and_leaves_out_measured():
    X, y = pool(50)
    a, pa = plan(0, 10, np.empty((0, 4)), [], "minimize", X, Strategy(), seed=0)
    b, _ = plan(0, 10, np.empty((0, 4)), [], "minimize", X, Strategy(), seed=1)
    assert pa == [None] * 10 and len(set(a)) == 10 and set(a) != set(b)
    c, pc = plan(1, 45, X[a], y[a], "minimize", X, Strategy(predictor="gp"), seed=0)
    assert len(c) == 40 and not set(c) & set(a)  # only 40 unmeasured: fewer proxies, none repeated
    assert all(isinstance(p, float) for p in pc)


def test_gp_posterior_interpolates_and_is_uncertain_far_away():
    X, y = pool(40, seed=2)
    gp = GPPredictor().fit(X, y)
    mean, var = gp_posterior(gp, X)
    np.testing.assert_allclose(mean, gp.predict(X), atol=1e-9)
    far = np.array([[0.97, 0.01, 0.01, 0.01]])
    assert gp_posterior(gp, far)[1][0] > 3 * np.median(var)
    m2, cov = gp_posterior(gp, X[:5], full_cov=True)
    np.testing.assert_allclose(np.diag(cov), var[:5], rtol=1e-6, atol=1e-12)


@pytest.mark.parametrize("kind", ACQUISITIONS)
def test_select_batch_distinct_gap_and_goal(kind):
    X, y = pool(200, seed=4)
    seen = np.arange(30)
    rng = np.random.default_rng(0)
    for goal, sign in (("minimize", 1.0), ("maximize", -1.0)):
        model = make_predictor("gp").fit(X[seen], sign * y[seen])
        idx = select_batch(kind, model, X[seen], sign * y[seen], X[30:], 6, rng, sign=sign, min_l1=0.05)
        C = X[30:][idx]
        assert len(set(idx)) == 6
        d = np.abs(C[:, None] - C[None]).sum(-1) + 9 * np.eye(6)
        assert d.min() >= 0.05 - 1e-12
        # the batch leans toward the optimum whatever the goal: better than the unmeasured average
        assert y[30:][idx].mean() < y[30:].mean()
    with pytest.raises(ValueError, match="acquisition"):
        select_batch("greedy", model, X[seen], y[seen], X[30:], 3, rng)


def test_strategy_rejects_unknown_names():
    with pytest.raises(ValueError, match="acquisition"):
        Strategy(acquisition="random-walk")
    with pytest.raises(ValueError, match="final"):
        Strategy(final="best")


def _table(tmp_path, n=20):
    X, y = pool(n, seed=5)
    keys = [f"m{i}" for i in range(n)]
    w, m = tmp_path / "w.csv", tmp_path / "m.csv"
    pd.DataFrame(X.round(3), columns=list("abcd")).assign(index=keys)[["index", *"abcd"]].to_csv(w, index=False)
    pd.DataFrame({"index": keys, "loss": y, "note": ["x"] * n}).to_csv(m, index=False)
    return w, m, y


def test_lookup_table(tmp_path):
    w, m, y = _table(tmp_path)
    t = LookupTable(w, m)
    W = t.swarm.weights  # rounded to 3 decimals, then renormalised, as any reader of the file sees them
    assert t.metrics(W[3]) == {"loss": pytest.approx(y[3])}  # numeric columns only
    assert t.metrics(2 * W[3])["loss"] == pytest.approx(y[3])  # weights are shares
    with pytest.raises(LookupError, match="not in .*w.csv"):
        t.metrics(np.full(4, 0.25))
    with pytest.raises(ValueError, match="3 weights"):
        t.metrics([0.5, 0.25, 0.25])


def test_lookup_as_proxy_command(tmp_path):
    w, m, y = _table(tmp_path)
    W = LookupTable(w, m).swarm.weights
    (tmp_path / "mix.json").write_text(json.dumps({"weights": W[7].tolist()}))
    assert lookup_main(["--weights", str(w), "--metrics", str(m), str(tmp_path / "mix.json"),
                        str(tmp_path / "out.json")]) == 0
    assert json.loads((tmp_path / "out.json").read_text())["metrics"]["loss"] == pytest.approx(y[7])
    (tmp_path / "mix.json").write_text(json.dumps({"weights": [1, 0, 0, 0]}))
    assert lookup_main(["--weights", str(w), "--metrics", str(m), str(tmp_path / "mix.json"),
                        str(tmp_path / "out2.json")]) == 2
    assert not (tmp_path / "out2.json").exists()


def test_lookup_proxy_record(tmp_path):
    from climb.config import ProxyConfig, TargetConfig
    from climb.runtime.proxy_runs import ProxyTask, stack_size, train_and_score
    w, m, y = _table(tmp_path)
    W = LookupTable(w, m).swarm.weights
    pc = ProxyConfig(lookup=str(m), lookup_weights=str(w))
    task = ProxyTask(mixture_id="a", iteration=0, seed=0, weights=tuple(W[2].tolist()), tokens_dir="", run_dir="",
                     proxy=pc, target=TargetConfig(objective=("loss",)))
    rec = train_and_score(task)
    assert rec["status"] == "ok" and rec["objective"] == pytest.approx(y[2]) and stack_size(pc) == 1
    rec = train_and_score(dataclasses.replace(task, weights=(0.25,) * 4))
    assert rec["status"] == "failed" and "not in" in rec["error"]  # failed like a proxy, the search goes on
    via_cmd = ProxyConfig(command=f"{sys.executable} -m climb.runtime.lookup --weights {w} --metrics {m} {{weights}} {{out}}")
    assert train_and_score(dataclasses.replace(task, proxy=via_cmd))["objective"] == pytest.approx(y[2])
