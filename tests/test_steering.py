"""A steered run end to end: sources, bounds on clusters and sources, a pin, a KL bound and a
weighted objective with a goal each, through search, export, report and a re-pick; every view
gives the mixture by source as well as by cluster, and every mixture trained or picked holds
every bound."""
from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from climb import pipeline
from scripted_run import prepare, script
from test_sources import _docs


@pytest.fixture
def steered(tmp_path, monkeypatch):
    from climb.stages.search.common import mixture_space
    from climb.stages.search.sources import source_shares
    from climb.stages.tokenize import cluster_tokens
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf-datasets"))
    cfg, paths, _, control = prepare(tmp_path, monkeypatch, 'corpus.source_column="source"',
                                     "export.token_budget=6000", docs=_docs(), columns=("source",))
    script(control, aux=True)  # the trainer reports a second metric, "aux"
    pipeline.run_stage("tokenize", cfg, paths.root)
    # Bounds the natural mixture holds (so they hold together), tight enough to bind.
    space = mixture_space(cfg, cluster_tokens(paths))
    shares = source_shares(cfg, paths)
    names, share = shares["names"], np.asarray(shares["share"])
    nat = space["natural"] @ share
    pin = round(float(nat[names.index("web")]), 3)
    c = int(np.argmax(space["natural"]))
    bounds = {"source:web": pin, "source:github": [0.0, round(float(nat[names.index("github")]) + 0.05, 3)],
              f"cluster:{c}": [0.0, round(float(space["natural"][c]) + 0.05, 3)]}
    cfg = dataclasses.replace(
        cfg, search=dataclasses.replace(cfg.search, bounds=bounds, kl_max=0.5),
        target=dataclasses.replace(cfg.target, objective=("loss", "aux"), weights={"loss": 1.0, "aux": 0.5},
                                   goals={"aux": "minimize"}))
    for stage in ("search", "export", "report"):
        pipeline.run_stage(stage, cfg, paths.root)
    return cfg, paths, bounds, names


def _bounds(cfg, paths):
    from climb.stages.search.common import run_space
    return run_space(cfg, paths)["bounds"]


def test_every_mixture_trained_and_the_pick_hold_every_bound(steered):
    from climb.optimize.bounds import satisfied
    from climb.runtime import results as results_log
    cfg, paths, bounds, names = steered
    b = _bounds(cfg, paths)
    W = np.array([r["weights"] for r in results_log.load(paths.search.results) if r["status"] == "ok"])
    assert len(W) >= 6 and satisfied(W, b).all()
    mix = json.loads(paths.search.mixture.read_text())
    assert satisfied(np.array([mix["weights"]]), b).all()
    by = mix["by_source"]
    assert by["climb"][by["names"].index("web")] == pytest.approx(bounds["source:web"], abs=1e-6)
    assert by["climb"][by["names"].index("github")] <= bounds["source:github"][1] + 1e-6


def test_the_objective_is_the_weighted_aggregate_of_every_recorded_metric(steered):
    from climb.runtime import results as results_log
    cfg, paths, _, _ = steered
    for r in results_log.load(paths.search.results):
        if r["status"] == "ok":
            m = r["metrics"]
            assert r["objective"] == pytest.approx((m["loss"] + 0.5 * m["aux"]) / 1.5)


def test_summary_report_and_card_give_the_mixture_by_source_and_by_cluster(steered):
    cfg, paths, bounds, names = steered
    summary = json.loads(paths.report.summary.read_text())
    assert summary["by_source"]["names"] == names
    page = paths.report.page.read_text()
    assert "## By source" in page and "## Clusters" in page
    card = (paths.export.dir / "README.md").read_text()
    assert "By source" in card and "cluster" in card.lower()
    exported = json.loads((paths.export.dir / "mixture.json").read_text())
    real = exported["by_source"]
    web = real["names"].index("web")
    # The export realises the pinned source within its weight tolerance.
    assert real["realised_weights"][web] == pytest.approx(bounds["source:web"], abs=cfg.export.weight_tolerance + 0.02)
    assert not paths.stats("export").get("bounds_off")


def test_a_repick_for_one_metric_trains_nothing_and_keeps_the_bounds(steered):
    from climb.optimize.bounds import satisfied
    from climb.runtime import results as results_log
    from climb.stages.search.repick import repick
    cfg, paths, _, _ = steered
    before = len(results_log.load(paths.search.results))
    one = dataclasses.replace(cfg, target=dataclasses.replace(cfg.target, objective=("aux",), weights={}, goals={}))
    out = repick(cfg, one, paths)
    assert len(results_log.load(paths.search.results)) == before
    assert out["trained"] == 0
    assert satisfied(np.array([out["weights"]]), _bounds(cfg, paths)).all()
