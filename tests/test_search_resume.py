"""A search killed at any point and resumed reports exactly what an undisturbed one does.

One search runs to the end; then, for each kill point (in each iteration, between
the search and its replicates, in the comparison), a copy of the run folder is cut
back to what a kill there leaves on disk: the results log up to that proxy, the
plans written so far, nothing written after. The resumed search must then produce
every output file of the undisturbed one, field for field (less wall-clock times).
The proxies are the quadratic-bowl trainer, so results do not depend on timing.
"""
from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

from climb.config import load_config
from climb.runtime.layout import RunPaths
from climb.stages import cluster, embed, search, tokenize

HELPER = Path(__file__).parent / "helpers" / "quadratic_proxy.py"
ITERATIONS = (4, 4, 4)
TIMING = {"seconds"}


def _no_timing(obj):
    if isinstance(obj, dict):
        return {k: _no_timing(v) for k, v in obj.items() if k not in TIMING}
    if isinstance(obj, list):
        return [_no_timing(v) for v in obj]
    return obj


def outputs(paths: RunPaths) -> dict[str, object]:
    """Every file of the search folder but its bookkeeping, parsed, without timings."""
    out = {}
    for f in sorted(paths.search.dir.iterdir()):
        if f.name in ("manifest.json", "stage_state.json") or not f.is_file():
            continue
        text = f.read_text()
        if f.suffix == ".jsonl":
            out[f.name] = [_no_timing(json.loads(x)) for x in text.splitlines()]
        elif f.suffix == ".json":
            out[f.name] = _no_timing(json.loads(text))
        else:
            out[f.name] = text
    return out


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """(cfg, the undisturbed run's paths, its outputs)."""
    return _finished(tmp_path_factory.mktemp("resume"))


@pytest.fixture(scope="module")
def noisy(tmp_path_factory):
    """The same search on a bowl whose proxies carry seed noise (sd 0.02), so replicates measure it."""
    return _finished(tmp_path_factory.mktemp("noisy"), " x 0.02")


def _finished(tmp, extra: str = ""):
    from conftest import FakeModel, vocab_docs, write_parquet_shards
    write_parquet_shards(tmp / "corpus", vocab_docs(60), 2)
    cfg = load_config(None, [
        f'corpus.paths=["{tmp}/corpus/*.parquet"]', "cluster.k=4", "cluster.niter=10",
        "proxy.vocab_size=320", "proxy.seq_len=16", "proxy.tokenizer_docs=100",
        f'proxy.command="{sys.executable} {HELPER} {{weights}} {{out}}{extra}"',
        'target.objective=["loss"]', 'target.goal="minimize"', 'target.texts=["x"]',
        f"search.iterations={list(ITERATIONS)}", "search.pool_size=2000", "search.min_weight=0.0",
        "search.epoch_cap=100.0", "search.replicates=2", "search.replicate_seeds=1", "search.eval_seeds=2"])
    paths = RunPaths(tmp / "ref")
    mp = pytest.MonkeyPatch()
    mp.setattr(embed, "load_model", lambda c: FakeModel())
    try:
        embed.run(cfg, paths)
    finally:
        mp.undo()
    cluster.run(cfg, paths)
    tokenize.run(cfg, paths)
    search.run(cfg, paths)
    return cfg, paths, outputs(paths)


def _kill(paths: RunPaths, kept: int, plans: int, keep: tuple[str, ...] = ()) -> None:
    """Leave what a kill leaves: `kept` records of the log, plans 0..plans-1, the stage's state
    (written when it starts: without it the stage would start over) and the `keep` files."""
    d = paths.search.dir
    lines = paths.search.results.read_text().splitlines()
    for f in d.iterdir():
        if f.name.startswith("plan_"):
            if int(f.stem.split("_")[1]) >= plans:
                f.unlink()
        elif f.name not in ("results.jsonl", "stage_state.json") + keep:
            f.unlink()
    paths.search.results.write_text("".join(x + "\n" for x in lines[:kept]))


# (name, records kept, plans on disk, other files kept)
KILLS = [
    ("in iteration 1", 2, 1, ()),
    ("before the replicates", 4, 1, ()),
    ("in iteration 2", 6, 2, ("replicates.json",)),
    ("in iteration 3", 10, 3, ("replicates.json",)),
    ("in the comparison", 12, 3, ("replicates.json", "comparison.json")),
]


@pytest.mark.parametrize("name,kept,plans,keep", KILLS, ids=[k[0] for k in KILLS])
def test_resumed_search_reports_what_an_undisturbed_one_does(finished, tmp_path, name, kept, plans, keep):
    cfg, ref, want = finished
    paths = RunPaths(tmp_path / "run")
    shutil.copytree(ref.root, paths.root)
    if "comparison.json" in keep:  # the comparison cut after its first proxies
        comp = json.loads(paths.search.dir.joinpath("comparison.json").read_text())
        first = dict(list(comp.items())[:2])
        paths.search.dir.joinpath("comparison.json").write_text(json.dumps(first))
    _kill(paths, kept, plans, keep)
    search.run(cfg, paths)
    got = outputs(paths)
    assert sorted(got) == sorted(want)
    for f in want:
        assert got[f] == want[f], f"{f} differs after a kill {name}"


def test_the_undisturbed_run_has_the_figures_a_resume_could_change(finished):
    """What the test above compares is not empty: the out-of-fold Spearman of iteration 1 is
    undefined (4 results), of later ones defined; the replicates and comparison ran."""
    _, _, want = finished
    oof = want["quality.json"]["predictor_oof_spearman"]
    assert oof[0] is None and all(v is not None for v in oof[1:])
    assert len(want["results.jsonl"]) == sum(ITERATIONS)
    assert want["replicates.json"] and want["comparison.json"]


def test_quality_does_not_depend_on_the_order_proxies_finished_in(finished, tmp_path):
    """Proxies running in parallel finish in any order, and a resumed run appends in yet another:
    the same results in another order give the same figures to the last bit (quality.json's noise,
    SNR and steadiness, the mixture, the tables)."""
    import random
    cfg, ref, want = finished
    paths = RunPaths(tmp_path / "run")
    shutil.copytree(ref.root, paths.root)
    _kill(paths, sum(ITERATIONS), len(ITERATIONS), ("replicates.json", "comparison.json"))
    lines = paths.search.results.read_text().splitlines()
    random.Random(7).shuffle(lines)
    assert [json.loads(x)["mixture_id"] for x in lines] != sorted(json.loads(x)["mixture_id"] for x in lines)
    paths.search.results.write_text("".join(x + "\n" for x in lines))
    rep = json.loads(paths.search.dir.joinpath("replicates.json").read_text())  # and the replicates' seeds
    paths.search.dir.joinpath("replicates.json").write_text(json.dumps(
        {k: dict(reversed(list(v.items()))) if isinstance(v, dict) else v for k, v in reversed(list(rep.items()))}))
    search.run(cfg, paths)
    got = outputs(paths)
    assert want["quality.json"]["steadiness"]["pick_sd"] is not None
    assert want["quality.json"]["steadiness"]["rerun_sd"] is not None
    for f in want:
        if f not in ("results.jsonl", "replicates.json"):
            assert got[f] == want[f], f"{f} differs when the proxies finished in another order"


def test_noise_figures_are_computed_in_mixture_order():
    """Floating-point sums depend on their order: the figures are computed over the results and
    replicates sorted by mixture id and seed, so any finishing order gives the same bits."""
    import random

    import numpy as np
    rng = np.random.default_rng(0)
    cfg = load_config(None, [])
    results = [{"mixture_id": f"it0-{i:03d}", "iteration": 0, "status": "ok",
                "objective": float(2 + rng.normal(0, 0.1))} for i in range(8)]
    reps = {f"it0-{i:03d}": {s: float(2 + rng.normal(0, 0.01)) for s in (0, 1, 2)} for i in range(6)}
    runs = {m: {s: {"objective": float(2 + rng.normal(0, 0.01))} for s in range(5)} for m in ("climb", "uniform")}
    want = search._quality(cfg, results, reps, runs, [])
    differ = 0
    for t in range(50):
        r = random.Random(t)
        shuffled = r.sample(results, len(results))
        reps_s = {k: dict(r.sample(list(v.items()), len(v))) for k, v in r.sample(list(reps.items()), len(reps))}
        runs_s = {k: dict(r.sample(list(v.items()), len(v))) for k, v in r.sample(list(runs.items()), len(runs))}
        got = search._quality(cfg, shuffled, reps_s, runs_s, [])
        for k in ("seed_sd", "paired_sd", "swarm_sd", "snr"):
            assert got[k] == want[k], (t, k)
        differ += float(np.std([x["objective"] for x in shuffled], ddof=1)) != want["swarm_sd"]
    assert differ  # the unsorted figure does change with the order: the check above can fail


@pytest.mark.parametrize("rule", [{"final": "predicted", "final_top_k": 16},
                                  {"final": "measured-predicted", "final_noise": "measured"}])
def test_a_replayed_final_rule_picks_what_a_search_run_with_it_does(finished, noisy, tmp_path, rule):
    """The final rule does not steer the trajectory, so replaying it on a finished search's results
    (as benchmarks/steady_pick.py does, the measured noise read from the run's quality.json) gives
    the pick a search run with that rule makes."""
    from dataclasses import replace

    import numpy as np

    from climb.stages.search.common import final_mixture, mixture_space, replicate_noise
    cfg, ref, want = noisy if "final_noise" in rule else finished
    other = replace(cfg, search=replace(cfg.search, **rule))
    space = mixture_space(other, tokenize.cluster_tokens(ref))
    noise = replicate_noise(want["quality.json"]["replicates"])
    assert noise is not None and (noise > 0.005 if "final_noise" in rule else noise < 1e-3)
    replayed = final_mixture(other, space, search.read_results(ref), noise=noise)
    paths = RunPaths(tmp_path / "run")
    shutil.copytree(ref.root, paths.root)
    for f in paths.search.dir.iterdir():  # a fresh search folder: the rule's own run from scratch
        if f.is_file():
            f.unlink()
    search.run(other, paths)
    got = json.loads(paths.search.mixture.read_text())
    assert [r["mixture_id"] for r in search.read_results(paths)] == [r["mixture_id"] for r in search.read_results(ref)]
    np.testing.assert_array_equal(got["weights"], replayed["weights"])
    if rule["final"] == "predicted":
        assert not np.allclose(got["weights"], want["mixture.json"]["weights"])  # another rule, another pick
    else:  # the floor the run used is the one the replay read off its replicates
        assert got["noise_floor"] == pytest.approx(noise) and "noise_floor" not in want["mixture.json"]
