"""Weighted objectives with a goal per metric: the aggregate, the config's table form, the refusals,
and the per-metric predictors (climb.config.objective, climb.config.load, climb.optimize.multi)."""
from __future__ import annotations

import json

import numpy as np
import pytest

from climb.config import ConfigError, TargetConfig, digest, load_config, to_toml
from climb.config.schema import key_data
from climb.io.errors import InputError
from climb.runtime.targets import objective

NAMES = ("bpb", "a/acc", "b/gold_loss_per_byte", "c/acc_norm", "train_loss")


@pytest.mark.parametrize("seed", range(40))
def test_without_weights_the_objective_is_the_mean_to_the_last_bit(seed):
    rng = np.random.default_rng(seed)
    names = list(rng.choice(NAMES, int(rng.integers(1, 7))))
    metrics = dict(zip(NAMES, rng.normal(0, 10 ** rng.uniform(-3, 6), len(NAMES)).tolist()))
    goal = ["minimize", "maximize"][seed % 2]
    mean = float(np.mean([metrics[m] for m in names]))
    assert objective(metrics, TargetConfig(objective=tuple(names), goal=goal)) == mean
    # equal weights, and goals that all agree with target.goal, are the same plain mean
    w = float(rng.uniform(0.01, 100))
    same = TargetConfig(objective=tuple(names), goal=goal, weights={m: w for m in names},
                        goals={names[0]: goal})
    assert objective(metrics, same) == mean


def test_weights_and_goals_make_a_signed_weighted_mean():
    m = {"bpb": 1.2, "piqa/acc": 0.6, "arc/acc": 0.4}
    t = TargetConfig(objective=("bpb", "piqa/acc"), weights={"bpb": 1.0, "piqa/acc": 0.5},
                     goals={"piqa/acc": "maximize"})
    assert objective(m, t) == pytest.approx((1.2 - 0.5 * 0.6) / 1.5)
    # target.goal stays the aggregate's direction: maximised, a loss enters with a minus sign
    t = TargetConfig(objective=("piqa/acc", "arc/acc", "bpb"), goal="maximize", weights={"arc/acc": 2.0},
                     goals={"bpb": "minimize"})
    assert objective(m, t) == pytest.approx((0.6 + 2 * 0.4 - 1.2) / 4)
    # a better accuracy lowers a minimised aggregate, raises a maximised one
    up = {**m, "piqa/acc": 0.9}
    lo = TargetConfig(objective=("bpb", "piqa/acc"), goals={"piqa/acc": "maximize"})
    hi = TargetConfig(objective=("piqa/acc", "bpb"), goal="maximize", goals={"bpb": "minimize"})
    assert objective(up, lo) < objective(m, lo) and objective(up, hi) > objective(m, hi)
    with pytest.raises(InputError, match=r"names \['arc/acc_norm'\]"):
        objective(m, TargetConfig(objective=("bpb", "arc/acc_norm"), weights={"bpb": 2.0}))


def test_the_aggregate_over_arrays_is_the_objective_of_each_row():
    from climb.optimize.multi import aggregate
    rng = np.random.default_rng(0)
    t = TargetConfig(objective=("bpb", "a/acc"), weights={"a/acc": 3.0}, goals={"a/acc": "maximize"})
    cols = {"bpb": rng.random(7), "a/acc": rng.random(7)}
    rows = [objective({k: v[i] for k, v in cols.items()}, t) for i in range(7)]
    np.testing.assert_allclose(aggregate(cols, t), rows)
    plain = TargetConfig(objective=("bpb", "a/acc"))
    np.testing.assert_array_equal(aggregate(cols, plain), np.mean([cols["bpb"], cols["a/acc"]], axis=0))


TABLE = 'target.objective={bpb=1.0, "piqa/acc"={weight=0.5, goal="maximize"}}'


def test_the_table_form_in_a_file_and_with_set(tmp_path):
    f = tmp_path / "run.toml"
    f.write_text('[target]\ntasks = {piqa = "p.jsonl"}\n'
                 'objective = { bpb = 1, "piqa/acc" = { weight = 0.5, goal = "maximize" }, "piqa/acc_norm" = '
                 '{ goal = "maximize" } }\n')
    t = load_config(f).target
    assert t.objective == ("bpb", "piqa/acc", "piqa/acc_norm")  # the names, in order
    assert t.weights == {"bpb": 1.0, "piqa/acc": 0.5} and isinstance(t.weights["bpb"], float)
    assert t.goals == {"piqa/acc": "maximize", "piqa/acc_norm": "maximize"}
    t = load_config(None, [TABLE]).target
    assert (t.objective, t.weights, t.goals) == (("bpb", "piqa/acc"), {"bpb": 1.0, "piqa/acc": 0.5},
                                                 {"piqa/acc": "maximize"})
    # set directly, and a list objective over a file's table replaces it whole
    t = load_config(None, ['target.objective=["bpb", "piqa/acc"]', "target.weights={bpb=2}",
                           'target.goals={"piqa/acc"="maximize"}']).target
    assert (t.weights, t.goals) == ({"bpb": 2.0}, {"piqa/acc": "maximize"})
    assert load_config(f, ['target.objective=["bpb"]']).target.weights == {}
    # the saved config.toml reads back to the same config
    cfg = load_config(None, [TABLE])
    saved = tmp_path / "config.toml"
    saved.write_text(to_toml(cfg))
    assert load_config(saved) == cfg


def test_the_new_fields_enter_no_key_at_their_defaults():
    assert "weights" not in key_data(TargetConfig()) and "goals" not in key_data(TargetConfig())
    assert digest(load_config(None, ['target.objective=["bpb"]']).target) == digest(TargetConfig())
    assert digest(load_config(None, [TABLE]).target) != digest(load_config(None, [
        'target.objective=["bpb", "piqa/acc"]']).target)


@pytest.mark.parametrize("overrides, said", [
    (['target.objective=["bpb"]', 'target.weights={"piqa/acc"=1.0}'],
     "target.weights names ['piqa/acc'], which target.objective ['bpb'] does not"),
    (['target.objective=["bpb"]', 'target.goals={"piqa/acc"="maximize"}'], "target.goals names ['piqa/acc']"),
    (['target.objective={bpb=0.0}'], "the weight of 'bpb' must be a number above 0, got 0.0"),
    (['target.objective={bpb=-1}'], "must be a number above 0, got -1.0"),
    (['target.objective={bpb="heavy"}'], "must be a number above 0, got 'heavy'"),
    (['target.objective={"piqa/acc"={goal="higher"}}'], "the goal of 'piqa/acc' must be 'minimize' or 'maximize'"),
    (['target.objective={bpb={goal="maximize"}}'], "'bpb' is a loss (lower is better), but its goal is 'maximize'"),
    (['target.objective={"piqa/acc"=1.0, bpb={goal="minimize"}}'],
     "'piqa/acc' is an accuracy (higher is better), but its goal is 'minimize' (target.goal)"),
    (['target.objective={bpb={weight=1.0, sign=1}}'], "target.objective.bpb: unknown key(s) ['sign']"),
    ([TABLE, "target.weights={bpb=2.0}"], "target.weights and the table target.objective both set ['bpb']"),
])
def test_bad_weights_and_goals_are_refused_at_load(overrides, said):
    with pytest.raises(ConfigError) as e:
        load_config(None, overrides)
    assert said in str(e.value) and "\n" not in str(e.value)


def test_a_refusal_exits_2_in_one_line_before_any_stage(tmp_path, capsys):
    from climb.cli import main
    f = tmp_path / "run.toml"
    f.write_text("")
    run = tmp_path / "run"
    assert main(["search", "--config", str(f), "--run", str(run), "--set", 'target.objective={bpb=0}']) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "must be a number above 0" in err and not run.exists()


def test_a_metric_no_target_gives_is_refused_before_any_stage(tmp_path):
    from climb.runtime import preflight
    texts = tmp_path / "h.jsonl"
    texts.write_text(json.dumps({"text": "held-out words"}) + "\n")
    cfg = load_config(None, [f'target.texts=["{texts}"]', TABLE])
    with pytest.raises(InputError, match=r"target.objective names \['piqa/acc'\], but the built-in proxy trainer"):
        preflight.check_target(cfg, tmp_path)


def test_per_metric_predictors_pick_each_metrics_best_and_the_aggregates():
    from climb.optimize.multi import aggregate_pick, best_per_metric, fit_metrics, predict_metrics
    rng = np.random.default_rng(1)
    X = rng.dirichlet(np.ones(3), 40)
    Y = {"bpb": 1 + X[:, 0], "a/acc": X[:, 1]}  # linear: the best rows lie at the simplex's corners
    models = fit_metrics(X, Y, "linear")
    C = np.vstack([np.eye(3), X])
    pred = predict_metrics(models, C)
    np.testing.assert_allclose(pred["bpb"][:3], [2, 1, 1], atol=1e-9)
    best = best_per_metric(pred, {"bpb": "minimize", "a/acc": "maximize"}, C)
    assert best["a/acc"]["weights"].tolist() == [0, 1, 0] and best["bpb"]["weights"][0] == 0
    assert best["a/acc"]["metrics"]["bpb"] == pytest.approx(1.0)
    t = TargetConfig(objective=("bpb", "a/acc"), weights={"a/acc": 0.1}, goals={"a/acc": "maximize"})
    pick = aggregate_pick(pred, t, C)
    assert pick["weights"].tolist() == [0, 1, 0]
    assert pick["predicted"] == pytest.approx((1.0 - 0.1 * 1.0) / 1.1)


@pytest.mark.parametrize("seed", range(30))
def test_the_front_is_every_point_nothing_dominates(seed):
    from climb.optimize.multi import front
    rng = np.random.default_rng(seed)
    P = rng.integers(0, 12, (int(rng.integers(1, 30)), 2)).astype(float)  # ties and repeats included
    ga, gb = rng.choice(["minimize", "maximize"], 2)
    s = np.array([1 if ga == "minimize" else -1, 1 if gb == "minimize" else -1])
    Q = P * s
    want = {i for i in range(len(P)) if not any((Q[j] <= Q[i]).all() and (Q[j] < Q[i]).any()
                                                for j in range(len(P)))}
    got = front(P, (ga, gb))
    assert set(got.tolist()) == want
    assert (np.diff(Q[got, 0]) >= 0).all()


def test_the_experts_token_weights_follow_the_objectives_weights(monkeypatch):
    """search.experts scores mixtures by -sum(coef * logp): with weights, each term's tokens carry its
    coefficient, so that sum is the weighted objective of the terms (bpb, a task's gold loss per byte)."""
    import math

    import proxies.evaluate
    from climb.runtime.targets import objective_logprobs
    monkeypatch.setattr(proxies.evaluate, "token_logprobs", lambda *a, **k: (np.array([-1.0, -2.0]), 10))
    monkeypatch.setattr(proxies.evaluate, "gold_token_logprobs",
                        lambda *a, **k: [(np.array([-3.0]), 5), (np.array([-1.0, -1.0]), 4)])
    target = {"texts": ["x"], "tasks": {"t": [{}, {}]}}
    terms = {"bpb": 3.0 / (math.log(2) * 10), "t/gold_loss_per_byte": (3.0 / 5 + 2.0 / 4) / 2}
    for t in (TargetConfig(objective=("bpb", "t/gold_loss_per_byte"), tasks={"t": "t.jsonl"}),
              TargetConfig(objective=("bpb", "t/gold_loss_per_byte"), tasks={"t": "t.jsonl"},
                           weights={"bpb": 3.0})):
        logp, coef = objective_logprobs(None, None, t, target, "cpu")
        assert -(coef * logp).sum() == pytest.approx(objective(terms, t))
