"""The search loop moves toward the optimum under both goals, and resumes.

Proxies are replaced by an external command with a known response (a quadratic
bowl in the mixture weights), so the test checks the loop itself: sampling,
predictor-guided proposals, the goal's direction, results as they arrive.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from climb.stages import cluster, embed, search, tokenize
from climb.config import load_config
from climb.runtime.layout import RunPaths

HELPER = Path(__file__).parent / "helpers" / "quadratic_proxy.py"


def _true(w):
    w = np.asarray(w)
    t = np.full(len(w), 0.1 / (len(w) - 1))
    t[-1] = 0.9
    return float(((w - t) ** 2).sum())


@pytest.fixture
def clustered(tmp_path, fake_model, make_docs, write_shards):
    write_shards(tmp_path / "corpus", make_docs(60), 2)
    def make(goal: str, metric: str, run: str, extra=()):
        cfg = load_config(None, [
            f'corpus.paths=["{tmp_path}/corpus/*.parquet"]', "cluster.k=4", "cluster.niter=10",
            "proxy.vocab_size=320", "proxy.seq_len=16", "proxy.tokenizer_docs=100",
            f'proxy.command="{sys.executable} {HELPER} {{weights}} {{out}}"',
            f'target.objective=["{metric}"]', f'target.goal="{goal}"', 'target.texts=["x"]',
            "search.iterations=[12, 8, 8]", "search.pool_size=5000", "search.min_weight=0.0",
            "search.epoch_cap=100.0", "search.baselines=[\"uniform\", \"natural\"]", *extra])
        paths = RunPaths(tmp_path / run)
        embed.run(cfg, paths)
        cluster.run(cfg, paths)
        tokenize.run(cfg, paths)
        return cfg, paths
    return make


@pytest.mark.parametrize("goal,metric", [("minimize", "loss"), ("maximize", "score")])
def test_search_moves_toward_optimum(clustered, goal, metric):
    cfg, paths = clustered(goal, metric, f"run-{goal}")
    stats = search.run(cfg, paths)
    results = search.read_results(paths)
    assert len(results) == 28 and all(r["status"] == "ok" for r in results)
    first = np.mean([_true(r["weights"]) for r in results if r["iteration"] == 0])
    later = np.mean([_true(r["weights"]) for r in results if r["iteration"] == 2])
    assert later < first, (first, later)
    final = json.loads((paths.root / "search" / "mixture.json").read_text())
    assert _true(final["weights"]) < min(_true(final["natural"]), _true(final["uniform"]))
    assert _true(final["weights"]) < first
    comp = stats["comparison"]
    sign = 1 if goal == "minimize" else -1
    assert sign * comp["climb"] < sign * comp["uniform"] and sign * comp["climb"] < sign * comp["natural"]
    # The swarm is also written as CSV for other tools.
    w = (paths.root / "search" / "swarm_weights.csv").read_text().splitlines()
    assert len(w) == 1 + len(results)


def test_search_resumes_without_retraining(clustered):
    cfg, paths = clustered("minimize", "loss", "run-resume")
    search.run(cfg, paths)
    lines = (paths.root / "search" / "results.jsonl").read_text().splitlines()
    # Simulate a kill in iteration 3: drop its last 3 results and the manifest.
    (paths.root / "search" / "results.jsonl").write_text("\n".join(lines[:-3]) + "\n")
    (paths.root / "search" / "manifest.json").unlink()
    seen = {json.loads(x)["mixture_id"] for x in lines[:-3]}
    search.run(cfg, paths)
    again = search.read_results(paths)
    assert len(again) == len(lines)
    assert len({r["mixture_id"] for r in again}) == len(again)  # nothing trained twice
    assert {r["mixture_id"] for r in again} - seen == {json.loads(x)["mixture_id"] for x in lines[-3:]}


def test_goal_sign():
    assert search.goal_sign("minimize") == 1.0 and search.goal_sign("maximize") == -1.0
    with pytest.raises(ValueError):
        search.goal_sign("lower")


NOISY = Path(__file__).parent / "helpers" / "noisy_proxy.py"


def test_search_measures_its_noise_and_judges_with_paired_seeds(clustered):
    cfg, paths = clustered("minimize", "loss", "run-noisy", extra=[
        f'proxy.command="{sys.executable} {NOISY} {{weights}} {{out}}"', "search.iterations=[10, 6]",
        'search.baselines=["uniform", "natural", "one-shot"]', "search.replicates=3", "search.replicate_seeds=3",
        "search.eval_seeds=6"])
    stats = search.run(cfg, paths)
    sdir = paths.root / "search"
    q = json.loads((sdir / "quality.json").read_text())
    # the replicate table: 3 mixtures x (search seed + 3 more); comparison: 4 mixtures x 6 seeds
    assert stats["replicate_proxies"] == 9 and stats["comparison_proxies"] == 24
    assert len(q["replicates"]) == 3 and all(len(v) == 4 for v in q["replicates"].values())
    # the seed effect (sd 0.05) is shared by mixtures; only the 0.002 interaction is paired noise
    assert 0.02 < q["seed_sd"] < 0.1 and q["paired_sd"] < 0.006
    assert q["snr"] == pytest.approx(q["swarm_sd"] / q["paired_sd"]) and q["snr"] > 2
    assert len(q["predictor_oof_spearman"]) == 2 and q["predictor_oof_spearman"][-1] > 0.5
    # the bowl's optimum is far from uniform and natural: paired seeds resolve it although
    # the seed noise (0.05) is larger than some of the differences
    for name in ("uniform", "natural"):
        c = q["comparison"][name]
        assert c["verdict"] == "better" and c["seeds"] == 6 and c["ci95"][1] < 0 and c["diff"] < 0
    assert set(q["comparison"]) == {"uniform", "natural", "one-shot"}
    # one-shot: 16 mixtures from the initial sampler at the search's budget, 10 of them iteration 1's
    one = json.loads((sdir / "one_shot.json").read_text())
    assert len(one) == 16 - 10 and stats["one_shot_proxies"] == 6
    pick = json.loads((sdir / "one_shot_mixture.json").read_text())
    assert abs(sum(pick["weights"]) - 1) < 1e-6 and pick["proxies"] == pick["succeeded"] == 16
    # RegMix's pick: the predictor's best over a fresh pool, not one of the measured mixtures
    measured = [r["weights"] for r in search.read_results(paths)] + [v["weights"] for v in one.values()]
    assert min(np.abs(np.array(measured) - pick["weights"]).sum(1)) > 1e-6
    # a rerun trains nothing again
    (sdir / "manifest.json").unlink()
    before = {f: (sdir / f).read_text() for f in ("comparison.json", "replicates.json", "one_shot.json")}
    search.run(cfg, paths)
    assert {f: (sdir / f).read_text() for f in before} == before


def test_search_over_candidates_is_the_simulated_search(clustered, tmp_path):
    """`search.candidates` + `proxy.lookup`: the search measures and picks only candidates,
    exactly the ones `climb.optimize.strategy.simulate` (the oracle benchmark's loop) chooses."""
    from climb.optimize.strategy import from_search_config, row_index, simulate
    rng = np.random.default_rng(0)
    X = rng.dirichlet(np.full(4, 0.7), 60)
    y = np.array([_true(w) for w in X])
    keys = [f"c{i}" for i in range(len(X))]
    cols = [f"cluster_{c}" for c in (2, 0, 3, 1)]  # matched by name, not by position
    wdf = pd.DataFrame(X[:, [2, 0, 3, 1]], columns=cols)
    wdf.insert(0, "id", keys)
    wdf.to_csv(tmp_path / "cand.csv", index=False)
    pd.DataFrame({"id": keys, "loss": y}).to_csv(tmp_path / "cand_metrics.csv", index=False)
    cfg, paths = clustered("minimize", "loss", "run-cand", extra=[
        f'search.candidates="{tmp_path}/cand.csv"', 'search.candidates_key="id"', 'proxy.command=""',
        f'proxy.lookup="{tmp_path}/cand_metrics.csv"', f'proxy.lookup_weights="{tmp_path}/cand.csv"',
        'proxy.lookup_key="id"', "search.iterations=[8, 4, 4]", "search.baselines=[]", "search.eval_seeds=2",
        'search.predictor="gp"'])
    search.run(cfg, paths)
    results = search.read_results(paths)
    W = np.array([r["weights"] for r in results])
    assert len(results) == 16 and all(r["status"] == "ok" for r in results)
    idx = row_index(W, X)
    assert (idx >= 0).all() and len(set(idx)) == 16  # only candidates, none twice
    np.testing.assert_allclose([r["objective"] for r in results], y[idx])  # the look-up's values
    final = json.loads((paths.root / "search" / "mixture.json").read_text())
    pick = row_index(np.array([final["weights"]]), X, tol=1e-9)[0]
    assert pick >= 0
    sim = simulate(X, y, "minimize", (8, 4, 4), from_search_config(cfg.search), seed=cfg.search.seed)
    assert sim["measured"] == list(idx) and sim["pick"] == pick
