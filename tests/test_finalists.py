"""`search.finalists`: the last iteration measures the best few mixtures again, paired, and the pick
is the finalist with the best mean.

The proxies are an in-process stand-in (`proxy.lookup` with its look-up replaced): a bowl in the
weights plus seed noise drawn per (seed, mixture), so every run of the module sees the same values.
"""
from __future__ import annotations

import json
import shutil
import zlib
from dataclasses import replace

import numpy as np
import pytest

from conftest import FakeModel, lookup_search_sets, vocab_docs, write_parquet_shards

CENTRE = np.array([0.45, 0.3, 0.15, 0.1])
ITERATIONS = (8, 6, 4)
CALLS = {"n": 0}


def _bowl(task):
    CALLS["n"] += 1
    w = np.asarray(task.weights, float)
    rng = np.random.default_rng([int(task.seed), zlib.crc32(np.round(w, 6).tobytes())])
    return {"loss": 1.0 + 0.5 * float(((w - CENTRE) ** 2).sum()) + float(rng.normal(0, 0.01))}, 0


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """(config with two finalists, a clustered and tokenised run folder with no search yet)."""
    import climb.stages.embed
    from climb.config import load_config
    from climb.runtime.layout import RunPaths
    from climb.stages import cluster, embed, tokenize
    root = tmp_path_factory.mktemp("finalists")
    write_parquet_shards(root / "corpus", vocab_docs(40), 2)
    cfg = load_config(None, lookup_search_sets(root, [f"{root}/corpus/*.parquet"], ITERATIONS,
                                               "search.finalists=2"))
    paths = RunPaths(root / "run")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(climb.stages.embed, "load_model", lambda c: FakeModel())
        for stage in (embed, cluster, tokenize):
            stage.run(cfg, paths)
    paths.save_config(cfg)
    return cfg, paths.root


@pytest.fixture(autouse=True)
def _stand_in(monkeypatch):
    import climb.runtime.proxy_runs
    monkeypatch.setattr(climb.runtime.proxy_runs, "_lookup", _bowl)
    CALLS["n"] = 0


def _copy(base, where, **search):
    from climb.runtime.layout import RunPaths
    cfg, root = base
    shutil.copytree(root, where)
    return replace(cfg, search=replace(cfg.search, **search)), RunPaths(where)


@pytest.fixture(scope="module")
def searched(base, tmp_path_factory):
    """(config, paths) of the search with two finalists, run once for the module."""
    import climb.runtime.proxy_runs
    from climb.stages import search
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(climb.runtime.proxy_runs, "_lookup", _bowl)
        cfg, paths = _copy(base, tmp_path_factory.mktemp("searched") / "run")
        search.run(cfg, paths)
    return cfg, paths


def test_the_last_iteration_measures_the_predictors_best_again_on_shared_seeds(searched):
    from climb.io.files import read_json
    from climb.stages.search import finalists, read_results
    cfg, paths = searched
    results = read_results(paths)
    assert sorted({r["iteration"] for r in results}) == [0, 1]  # no new mixture in the last iteration
    assert len(results) == sum(ITERATIONS[:-1])
    state = read_json(paths.search.finalists)
    want = finalists.choose(cfg, results)
    assert [m["mixture_id"] for m in state["finalists"]] == [m["mixture_id"] for m in want]
    assert state["seeds"] == [cfg.search.seed + 1 + cfg.search.replicate_seeds + j for j in range(2)]
    assert sorted(state["records"]) == sorted(f"{m['mixture_id']}/{s}" for m in want for s in state["seeds"])
    # The pick: the finalist whose mean over the search's seed and the shared ones is best.
    means = {m["mixture_id"]: np.mean([m["objective"]] + [state["records"][f"{m['mixture_id']}/{s}"]["objective"]
                                                          for s in state["seeds"]]) for m in state["finalists"]}
    best = min(means, key=means.get)
    mix = json.loads(paths.search.mixture.read_text())
    chosen = next(m for m in state["finalists"] if m["mixture_id"] == best)
    np.testing.assert_allclose(mix["weights"], np.asarray(chosen["weights"]) / np.sum(chosen["weights"]))
    assert [f["mixture_id"] for f in mix["finalists"]] == [m["mixture_id"] for m in want]
    assert mix["finalists"][[f["mixture_id"] for f in mix["finalists"]].index(best)]["mean"] == pytest.approx(means[best])


def test_finalists_cost_what_the_last_iteration_would(searched):
    from climb.stages.search.summary import compute_account
    cfg, paths = searched
    by = compute_account(paths)["by_purpose"]
    assert by["finalists"]["proxies"] == ITERATIONS[-1]
    assert by["search"]["proxies"] + by["finalists"]["proxies"] == sum(ITERATIONS)
    assert by["finalists"]["tokens"] == by["search"]["tokens"] / by["search"]["proxies"] * ITERATIONS[-1]


def test_a_seed_a_finalist_failed_on_is_left_out_of_every_mean():
    from climb.stages.search.finalists import pick
    state = {"finalists": [{"mixture_id": "a", "weights": [1.0, 0.0], "objective": 1.0},
                           {"mixture_id": "b", "weights": [0.0, 1.0], "objective": 1.1}],
             "seeds": [3, 4],
             "records": {"a/3": {"status": "ok", "objective": 1.3}, "a/4": {"status": "ok", "objective": 1.3},
                         "b/3": {"status": "ok", "objective": 1.0}, "b/4": {"status": "failed", "objective": None}}}
    cfg = type("C", (), {"target": type("T", (), {"goal": "minimize"})()})()
    best, rows = pick(cfg, state)
    assert [r["values"] for r in rows] == [[1.0, 1.3], [1.1, 1.0]]  # seed 4 out of both
    assert best["mixture_id"] == "b"


def test_a_search_killed_among_its_finalists_resumes_to_the_same_pick(searched, base, tmp_path):
    from climb.io.files import read_json, write_json
    from climb.stages import search
    cfg, ref = searched
    cfg, paths = _copy(base, tmp_path / "run")
    shutil.copytree(ref.search.dir, paths.search.dir)
    state = read_json(paths.search.finalists)
    state["records"] = dict(list(state["records"].items())[:1])  # one finalist proxy done when it was killed
    write_json(paths.search.finalists, state)
    for name in ("mixture.json", "comparison.json", "quality.json", "manifest.json"):
        (paths.search.dir / name).unlink(missing_ok=True)
    search.run(cfg, paths)
    assert CALLS["n"] >= ITERATIONS[-1] - 1  # the three finalist proxies left (and the comparison)
    assert json.loads(paths.search.mixture.read_text())["weights"] == json.loads(ref.search.mixture.read_text())["weights"]


@pytest.mark.parametrize("sets, said", [
    (["search.finalists=5", "search.iterations=[8,4]"], "between 1 and 4"),
    (["search.finalists=2", "search.iterations=[4]"], "an iteration before the last"),
    (["search.finalists=-1"], "search.finalists"),
])
def test_bad_finalists_are_refused_at_load(sets, said):
    from climb.config import ConfigError, load_config
    with pytest.raises(ConfigError, match=said):
        load_config(None, sets)


def test_a_search_with_finalists_keeps_no_rerun_figure_and_the_report_says_why(base, tmp_path):
    """The simulated re-runs model rounds of new mixtures and the pick, not finalists measured again
    (they read 0.29 x the measured spread of tech's target-final arm): no figure, no warning from it,
    where the same search without finalists keeps one."""
    from climb import pipeline
    from climb.stages import search
    for finalists, where in ((2, "with"), (0, "without")):
        cfg, paths = _copy(base, tmp_path / where, steadiness_boot=4, finalists=finalists)
        search.run(cfg, paths)
        st = json.loads(paths.search.quality.read_text())["steadiness"]
        if finalists:
            assert "rerun_sd" not in st and st["rerun_skipped"] == "finalists"
            assert not any("move with the search seed" in w
                           for w in json.loads(paths.search.quality.read_text())["warnings"])
            pipeline.run_stage("report", cfg, paths.root)
            text = paths.report.page.read_text()
            assert "not simulated for a search whose last iteration measures its finalists again" in text
        else:
            assert st["rerun_sd"] > 0 and "rerun_skipped" not in st

