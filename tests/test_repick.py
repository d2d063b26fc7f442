"""`climb repick`: a finished search's mixture picked again under another objective.

One small search is run once for the module (its proxies an external command whose two
metrics pull apart: tests/helpers/two_metric_proxy.py) and each test works on a copy of its
run folder (a copied run folder redoes nothing). A re-pick trains no proxy, leaves the search
up to date, picks by the run's rule from the recomputed objectives, and with `--compare`
trains the new pick's comparison proxies alone.
"""
from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import FakeModel, vocab_docs, write_parquet_shards

HELPER = Path(__file__).parent / "helpers" / "two_metric_proxy.py"
WEIGHTED = 'target.objective={bpb=1.0, "task/acc"={weight=0.5, goal="maximize"}}'


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """The run folder of a finished search (bpb minimised; the swarm also records task/acc)."""
    import climb.stages.embed
    from climb.config import load_config
    from climb.runtime.layout import RunPaths
    from climb.stages import cluster, embed, search, tokenize
    root = tmp_path_factory.mktemp("repick")
    write_parquet_shards(root / "corpus", vocab_docs(60), 2)
    cfg = load_config(None, [
        f'corpus.paths=["{root}/corpus/*.parquet"]', "cluster.k=4", "cluster.niter=10",
        "proxy.vocab_size=320", "proxy.seq_len=16", "proxy.tokenizer_docs=100",
        f'proxy.command="{sys.executable} {HELPER} {{weights}} {{out}}"',
        'target.objective=["bpb"]', 'target.texts=["x"]', "target.contamination=0",
        "search.iterations=[6, 4]", "search.pool_size=400", "search.min_weight=0.0", "search.replicates=0",
        "search.eval_seeds=2", "search.steadiness_boot=0", "search.epoch_cap=100.0"])
    paths = RunPaths(root / "run")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(climb.stages.embed, "load_model", lambda c: FakeModel())
        for stage in (embed, cluster, tokenize, search):
            stage.run(cfg, paths)
    paths.save_config(cfg)
    return cfg, paths.root


@pytest.fixture
def run(finished, tmp_path):
    """(the run's config, RunPaths of a fresh copy of the finished run folder)."""
    from climb.runtime.layout import RunPaths
    cfg, root = finished
    shutil.copytree(root, tmp_path / "run")
    return cfg, RunPaths(tmp_path / "run")


def _repick(paths, *args: str, capsys=None) -> tuple[int, str, str]:
    from climb.cli import main
    rc = main(["repick", "--run", str(paths.root), *args])
    out = capsys.readouterr() if capsys else None
    return rc, out.out if out else "", out.err if out else ""


def _counts(paths) -> tuple[int, int]:
    return (len(paths.search.results.read_text().splitlines()), len(json.loads(paths.search.comparison.read_text())))


def _ok(paths) -> list[dict]:
    from climb.stages.search import read_results
    return [r for r in read_results(paths) if r["status"] == "ok"]


def test_a_repick_trains_nothing_and_leaves_the_search_up_to_date(run, capsys):
    from climb.stages import search
    cfg, paths = run
    files = {p: p.read_bytes() for p in paths.search.dir.iterdir() if p.is_file()}
    before = _counts(paths)
    rc, out, err = _repick(paths, "--set", WEIGHTED, capsys=capsys)
    assert rc == 0, err
    assert _counts(paths) == before  # not one proxy trained: no search record, no comparison record
    assert {p: p.read_bytes() for p in files} == files  # the search's own outputs untouched
    (kept,) = paths.search.repicks
    rec = json.loads(kept.read_text())
    assert rec["trained"] == 0 and rec["spec"] == {"objective": ["bpb", "task/acc"], "goal": "minimize",
                                                   "weights": {"bpb": 1.0, "task/acc": 0.5},
                                                   "goals": {"task/acc": "maximize"}}
    # the run's rule ("seen") under the new aggregate: the measured mixture with the least (bpb - 0.5 acc) / 1.5
    ok = _ok(paths)
    best = min(ok, key=lambda r: (r["metrics"]["bpb"] - 0.5 * r["metrics"]["task/acc"]) / 1.5)
    np.testing.assert_allclose(rec["weights"], best["weights"])
    assert rec["best_seen"]["mixture_id"] == best["mixture_id"]
    m = best["metrics"]
    assert rec["best_seen"]["objective"] == pytest.approx((m["bpb"] - 0.5 * m["task/acc"]) / 1.5)
    assert set(rec["predicted"]["re-pick"]) == {"bpb", "task/acc", "objective"}
    # the two metrics pull apart: each one's predicted best leans on its own end of the clusters
    w_bpb, w_acc = (np.array(rec["best_for"][m]["weights"]) for m in ("bpb", "task/acc"))
    assert w_bpb[-1] > w_bpb[0] and w_acc[0] > w_acc[-1]
    assert rec["best_for"]["bpb"]["predicted"]["bpb"] < rec["predicted"]["re-pick"]["bpb"]
    assert "| re-pick |" in out and "0 proxies trained" in out and str(kept) in out
    # a second `climb search` on the run skips: the search stage is as fresh as before
    assert search.run(cfg, paths).get("skipped_stage")


def test_a_repick_under_the_runs_own_objective_is_the_runs_pick(run):
    from climb.stages.search.repick import repick
    cfg, paths = run
    out = repick(cfg, cfg, paths)
    np.testing.assert_allclose(out["weights"], json.loads(paths.search.mixture.read_text())["weights"])


def test_a_single_metric_repick_picks_that_metrics_best(run):
    from climb.config import load_config
    from climb.stages.search.repick import repick
    cfg, paths = run
    new = load_config(paths.config, ['target.objective=["task/acc"]', 'target.goal="maximize"'])
    out = repick(cfg, new, paths)
    best = max(_ok(paths), key=lambda r: r["metrics"]["task/acc"])
    np.testing.assert_allclose(out["weights"], best["weights"])
    assert set(out["best_for"]) == {"task/acc"}  # only the objective's metrics are fitted


def test_repick_refusals_exit_2_and_write_nothing(run, capsys):
    cfg, paths = run
    for args, said in (
            (['target.objective=["piqa/acc"]'], "never recorded"),
            (["search.iterations=[8, 4]"], "differs from the run's config.toml in ['search.iterations']"),
            (['target.objective={bpb=1.0, "task/acc"={weight=0.0}}'], "must be a number above 0"),
            (['target.objective={bpb=1.0, "task/acc"={goal="up"}}'], "'minimize' or 'maximize'")):
        rc, out, err = _repick(paths, *[x for a in args for x in ("--set", a)], capsys=capsys)
        assert rc == 2 and said in err and len(err.strip().splitlines()) == 1, (args, err)
    paths.manifest("search").unlink()
    rc, _, err = _repick(paths, "--set", WEIGHTED, capsys=capsys)
    assert rc == 2 and "no finished search" in err
    assert not (paths.search.dir / "repicks").exists()


def test_compare_trains_only_the_new_picks_proxies(run, capsys):
    cfg, paths = run
    comparison = paths.search.comparison.read_bytes()
    results = paths.search.results.read_bytes()
    rc, out, err = _repick(paths, "--set", 'target.objective=["task/acc"]', "--set", 'target.goal="maximize"',
                           "--compare", capsys=capsys)
    assert rc == 0, err
    assert paths.search.comparison.read_bytes() == comparison and paths.search.results.read_bytes() == results
    (kept,) = paths.search.repicks
    rec = json.loads(kept.read_text())
    trained = json.loads(paths.search.repick_comparison(rec["digest"]).read_text())
    assert rec["trained"] == len(trained) == cfg.search.eval_seeds  # the new pick, once per comparison seed
    assert set(trained) == {f"climb/{cfg.search.eval_seed + s}" for s in range(cfg.search.eval_seeds)}
    comp = rec["comparison"]
    assert set(comp["results"]) == {"climb", "run's pick", "uniform", "natural"}  # baselines paired, not retrained
    # under the new objective (task/acc, maximised) the re-pick measures better than the run's bpb pick
    assert comp["metrics"]["climb"]["task/acc"] > comp["metrics"]["run's pick"]["task/acc"]
    assert comp["results"]["climb"] == pytest.approx(comp["metrics"]["climb"]["task/acc"])
    # a second --compare finds its proxies trained
    rc, out, err = _repick(paths, "--set", 'target.objective=["task/acc"]', "--set", 'target.goal="maximize"',
                           "--compare", capsys=capsys)
    assert rc == 0 and json.loads(kept.read_text())["trained"] == 0 and "0 proxies trained" in out


def test_the_report_shows_the_tradeoffs_and_the_repicks(run):
    from climb.stages import report
    from climb.stages.search.repick import repick
    cfg, paths = run
    report.run(cfg, paths)
    page = paths.report.page.read_text()
    assert "## Trade-offs between metrics" in page  # the swarm recorded bpb and task/acc
    assert "| best for bpb |" in page and "| best for task/acc |" in page and "(measured " in page
    assert (paths.report.dir / "pareto.png").is_file()  # bpb and task/acc pull apart
    summary = json.loads(paths.report.summary.read_text())
    assert summary["tradeoffs"]["metrics"] == {"bpb": "minimize", "task/acc": "maximize"}
    from climb.config import load_config
    out = repick(cfg, load_config(paths.config, [WEIGHTED]), paths)
    stats = report.run(cfg, paths)  # a re-pick found: the report is made again, showing it
    assert not stats.get("skipped_stage")
    page = paths.report.page.read_text()
    assert "Re-picks" in page and "0.5 task/acc (maximize)" in page
    assert json.loads(paths.report.summary.read_text())["tradeoffs"]["repicks"] == [out["digest"]]
