"""search.bounds and search.kl_max end to end: the config's refusals, `--set`, the space's refusals,
the messages that name the bounds that clash, fixed candidates, the pick, the export's hand weights,
and the refusal before the search trains anything (climb/optimize/bounds.py)."""
from __future__ import annotations


import numpy as np
import pytest

from climb.cli import main
from climb.config import ConfigError, load_config
from climb.config.schema import RunConfig, key_data
from climb.io.errors import InputError
from climb.optimize.bounds import broken, from_config, infeasible, project, satisfied
from climb.optimize.strategy import Strategy, pick_weights
from climb.runtime import preflight
from test_preflight import _store  # a token store index of given cluster sizes

SPACE = {"natural": np.array([0.4, 0.3, 0.2, 0.1]), "max_weight": np.ones(4),
         "sources": {"names": ["web", "code"], "share": np.array([[1.0, 0.0], [0.8, 0.2], [0.5, 0.5], [0.0, 1.0]])}}


# ----------------------------------------------------------------- the config
def test_toml_and_set_give_the_same_mixed_bounds(tmp_path):
    f = tmp_path / "b.toml"
    f.write_text('[search.bounds]\n"source:code" = 0.10\n"source:web" = [0.0, 0.4]\n"cluster:3" = [0.05, 0.30]\n'
                 "[search]\nkl_max = 0.5\n")
    cfg = load_config(f)
    assert cfg.search.bounds == {"source:code": 0.1, "source:web": [0.0, 0.4], "cluster:3": [0.05, 0.3]}
    assert cfg.search.kl_max == 0.5
    over = load_config(None, ['search.bounds={"cluster:3"=[0,0.3], "source:code"=0.1}'])
    assert over.search.bounds == {"cluster:3": [0, 0.3], "source:code": 0.1}


def test_at_their_defaults_the_new_fields_enter_no_key():
    data = key_data(RunConfig().search)
    assert "bounds" not in data and "kl_max" not in data
    assert "bounds" in key_data(load_config(None, ['search.bounds={"cluster:0"=[0, 0.5]}']).search)


@pytest.mark.parametrize("setting, words", [
    ('search.bounds={"cluster:x"=0.1}', "must be \"cluster:<index>\""),
    ('search.bounds={"domain:a"=0.1}', "must be \"cluster:<index>\""),
    ('search.bounds={"source:"=0.1}', "must be \"cluster:<index>\""),
    ('search.bounds={"cluster:1"=[0.1]}', "expected a share"),
    ('search.bounds={"cluster:1"="a"}', "expected a share"),
    ('search.bounds={"cluster:1"=true}', "expected a share"),
    ('search.bounds={"cluster:1"=1.5}', "shares lie in [0, 1]"),
    ('search.bounds={"cluster:1"=[0.4, 0.2]}', "min 0.4 is above max 0.2"),
    ('search.bounds={"cluster:1"=0.6, "cluster:2"=[0.5, 1]}', "cluster minimums (pins count) sum to 1.1"),
    ('search.bounds={"source:a"=[0.7, 1], "source:b"=0.4}', "source minimums (pins count) sum to 1.1"),
    ('search.bounds={"cluster:1"=0.01}', "below search.min_weight = 0.02"),
    ("search.kl_max=-0.1", "search.kl_max is a KL divergence"),
])
def test_the_config_refuses_bounds_no_mixture_can_meet_in_one_line(setting, words):
    with pytest.raises(ConfigError) as e:
        load_config(None, [setting])
    assert words in str(e.value) and "\n" not in str(e.value)


def test_a_cluster_pinned_at_zero_is_fine_with_a_minimum_weight():
    assert load_config(None, ['search.bounds={"cluster:1"=0}']).search.bounds == {"cluster:1": 0}


# ----------------------------------------------------------------- the space
@pytest.mark.parametrize("bounds, space, words", [
    ({"cluster:4": 0.1}, SPACE, "names cluster 4, but the run has 4 clusters"),
    ({"source:books": 0.1}, SPACE, "no source 'books'; its sources are web, code"),
    ({"source:code": 0.1}, {k: v for k, v in SPACE.items() if k != "sources"}, "has no sources"),
])
def test_a_bound_the_space_cannot_hold_is_refused(bounds, space, words):
    with pytest.raises(InputError, match=words):
        from_config(bounds, space)


def test_a_source_row_is_its_share_of_each_cluster():
    b = from_config({"source:code": 0.25}, SPACE)
    assert np.allclose(b.A, [[0.0, 0.2, 0.5, 1.0]])
    w = project(np.array([[0.7, 0.1, 0.1, 0.1]]), b)[0]
    assert satisfied(w, b)[0] and w @ SPACE["sources"]["share"][:, 1] == pytest.approx(0.25)


def test_the_clash_with_the_caps_is_named_with_what_they_allow():
    caps = np.array([1.0, 0.05, 0.1, 0.02])  # code: 0.2 x 0.05 + 0.5 x 0.1 + 0.02 = 0.08 at most
    b = from_config({"source:code": 0.1}, {**SPACE, "max_weight": caps},
                    caps_note="the epoch cap (search.epoch_cap = 4 at export.token_budget = 500,000)")
    why = infeasible(b)
    assert why == ("search.bounds: source:code pinned at 0.1, but the epoch cap (search.epoch_cap = 4 at "
                   "export.token_budget = 500,000) lets it reach at most 0.08; loosen one of them")


def test_the_clash_names_only_the_bounds_that_clash():
    b = from_config({"cluster:0": [0.5, 1], "cluster:1": [0, 0.3], "source:code": [0.6, 1]}, SPACE)
    why = infeasible(b)
    assert "cluster:0 at least 0.5" in why and "source:code at least 0.6" in why and "cluster:1" not in why


def test_kl_max_too_tight_for_a_pin_is_named():
    b = from_config({"cluster:3": 0.6}, SPACE, kl_max=0.1)
    why = infeasible(b)
    assert why.startswith("search.kl_max = 0.1 cannot be met") and "cluster:3 pinned at 0.6" in why


def test_min_weight_and_a_pin_that_needs_a_small_cluster_weight_clash():
    # code at 0.01: cluster 1 at 0.06 already gives 0.012, and with clusters 1-3 at 0 code is 0
    b = from_config({"source:code": 0.01}, SPACE, min_weight=0.06)
    why = infeasible(b)
    assert "source:code pinned at 0.01" in why and "search.min_weight = 0.06" in why


def test_broken_names_what_a_mixture_breaks():
    b = from_config({"source:code": [0, 0.3]}, SPACE, kl_max=0.05)
    got = broken(np.array([0.1, 0.1, 0.1, 0.7]), b, caps=False)
    assert got[0].startswith("source:code at most 0.3 (this mixture gives it 0.77") and "kl_max" in got[1]
    assert broken(np.array([0.4, 0.3, 0.2, 0.1]), b) == []


# ----------------------------------------------------------------- the pick
def test_a_measured_pick_comes_from_the_mixtures_inside_the_bounds():
    """Measured mixtures outside the bounds (a search re-picked under new bounds) are not picked."""
    b = from_config({"cluster:0": [0, 0.5]}, SPACE)
    X = np.array([[0.9, 0.1, 0, 0], [0.4, 0.3, 0.3, 0], [0.25, 0.25, 0.25, 0.25]])
    y = np.array([1.0, 2.0, 3.0])
    w = pick_weights(X, y, "minimize", np.empty((0, 4)), Strategy(final="seen"), None, bounds=b)
    assert np.allclose(w, X[1])


# ----------------------------------------------------------------- the run


def test_before_the_search_the_bounds_meet_the_epoch_caps(tmp_path):
    from climb.stages.search.common import check_bounds
    paths = _store(tmp_path, [8_000, 1_000, 1_000])
    fine = load_config(None, ['search.bounds={"cluster:1"=[0, 0.3]}'])
    check_bounds(fine, paths)
    cfg = load_config(None, ['search.bounds={"cluster:1"=0.5}', "search.epoch_cap=2", "export.token_budget=10000"])
    with pytest.raises(InputError) as e:
        check_bounds(cfg, paths)
    assert str(e.value) == ("search.bounds: cluster:1 pinned at 0.5, but the epoch cap (search.epoch_cap = 2 at "
                            "export.token_budget = 10,000) lets it reach at most 0.2; loosen one of them")


def test_an_unknown_source_is_refused_before_any_stage(tmp_path, monkeypatch):
    monkeypatch.setattr(preflight, "source_names", lambda cfg, run_dir: ["web", "code"])
    cfg = load_config(None, ['search.bounds={"source:books"=0.1}'])
    with pytest.raises(InputError, match="no source 'books'; its sources are web, code"):
        preflight.check_bound_sources(cfg, tmp_path)
    preflight.check_bound_sources(load_config(None, ['search.bounds={"source:code"=0.1}']), tmp_path)
    monkeypatch.setattr(preflight, "source_names", lambda cfg, run_dir: [])
    with pytest.raises(InputError, match="the corpus has no sources"):
        preflight.check_bound_sources(cfg, tmp_path)


def test_fixed_candidates_outside_the_bounds_are_dropped_or_refused(tmp_path, caplog):
    from climb.stages.search.common import fixed_candidates
    f = tmp_path / "cands.csv"
    f.write_text("index,cluster_0,cluster_1,cluster_2\n0,0.6,0.2,0.2\n1,0.2,0.4,0.4\n2,0.3,0.3,0.4\n")
    space = {"natural": np.full(3, 1 / 3), "max_weight": np.ones(3), "usable": np.ones(3, bool)}
    cfg = load_config(None, [f'search.candidates="{f}"', 'search.bounds={"cluster:0"=[0, 0.5]}'])
    space["bounds"] = from_config(cfg.search.bounds, space)
    W = fixed_candidates(cfg, space)
    assert np.allclose(W, [[0.2, 0.4, 0.4], [0.3, 0.3, 0.4]]) and "dropped 1 of 3 rows outside" in caplog.text
    space["bounds"] = from_config({"cluster:0": [0.9, 1]}, space)
    with pytest.raises(InputError, match="none of its 3 usable rows holds search.bounds"):
        fixed_candidates(cfg, space)


def test_hand_weights_that_break_a_bound_are_refused_by_the_export(tmp_path):
    from climb.stages.export import _check_bounds
    paths = _store(tmp_path, [8_000, 1_000, 1_000])
    cfg = load_config(None, ['search.bounds={"cluster:1"=[0, 0.2]}'])
    _check_bounds(cfg, paths, [0.7, 0.2, 0.1])
    with pytest.raises(InputError) as e:
        _check_bounds(cfg, paths, [0.5, 0.4, 0.1])
    assert str(e.value).startswith("the weights given break cluster:1 at most 0.2 (this mixture gives it 0.4)")


def test_climb_search_refuses_clashing_bounds_before_training(tmp_path, monkeypatch, capsys):
    from scripted_run import prepare
    _, paths, config_file, _ = prepare(tmp_path, monkeypatch)
    code = main(["search", "--config", str(config_file), "--run", str(paths.root),
                 "--set", 'search.bounds={"cluster:999"=[0, 0.5]}'])
    line = [x for x in capsys.readouterr().err.splitlines() if x.strip()][-1]
    assert code == 2, line
    assert line.startswith("climb: error: search.bounds: cluster:999 names cluster 999, but the run has ")
    assert not paths.search.results.exists()


def test_a_bound_every_mixture_holds_does_not_stall_the_projection():
    # One source in every cluster: its share of any mixture is 1, so a pin at (about) 1 binds nothing;
    # kept as a constraint it would duplicate the simplex's own and stall the projection.
    space = {"natural": np.array([0.21, 0.29, 0.50]), "max_weight": np.ones(3),
             "sources": {"names": ["s0"], "share": np.ones((3, 1))}}
    bounds = {"cluster:0": [0.353, 0.577], "cluster:1": [0.326, 0.563], "cluster:2": [0.0498, 0.1009],
              "source:s0": 0.9999999999999999}
    b = from_config(bounds, space)
    assert infeasible(b) is None and "source:s0" not in b.names
    W = np.random.default_rng(1).dirichlet(np.full(3, 0.5), size=40)
    assert satisfied(project(W, b), b).all()
    with pytest.raises(InputError, match="source:s0"):  # a pin no mixture can meet is still refused
        msg = infeasible(from_config({"source:s0": 0.5}, space))
        raise InputError(msg or "")
