"""`search.reuse`: a search that starts from an earlier run's evidence when the corpus changed.

One earlier run is searched once for the module; each test works on a copy of its folder (a
copied run folder redoes no stage), as a team would start the next version of its corpus. The
proxies are an in-process stand-in (`proxy.lookup` with its look-up replaced): a plane in the
weights with seed noise, which the search's predictor (`linear`) can fit, and whose landscape a
test can keep, shift or reverse between the runs (`WORLD`), so that what the confirmation round
should find is known. (On a curved landscape a predictor's best predicted mixtures are predicted
too well, and near-ties rank by noise: see the module docstring of climb/stages/search/reuse.py.)
"""
from __future__ import annotations

import json
import re
import shutil
import zlib
from pathlib import Path

import numpy as np
import pytest

from conftest import FakeModel, vocab_docs, write_parquet_shards

ITERATIONS = (8, 6, 4)
NOISE = 0.01
WORLD = {"mode": "same", "calls": 0}  # how the stand-in proxy scores: the landscape, and proxies trained


def _bowl(task):
    """A plane in the weights, lowest on the first cluster, plus noise per (mixture, seed);
    "reversed" turns the landscape upside down, "shifted" adds a constant."""
    WORLD["calls"] += 1
    w = np.asarray(task.weights, float)
    d = float(w @ np.linspace(0.0, 1.0, len(w)))
    d = {"same": d, "shifted": d + 0.03, "reversed": 1.0 - d}[WORLD["mode"]]
    rng = np.random.default_rng([int(task.seed), zlib.crc32(np.round(w, 6).tobytes())])
    return {"loss": d + float(rng.normal(0, NOISE))}, 0


@pytest.fixture(autouse=True)
def _world(monkeypatch):
    import climb.runtime.proxy_runs
    monkeypatch.setattr(climb.runtime.proxy_runs, "_lookup", _bowl)
    WORLD.update(mode="same", calls=0)
    yield


@pytest.fixture(scope="module")
def earlier(tmp_path_factory):
    """(config, the earlier run's folder): embedded, clustered, tokenised and searched."""
    import climb.runtime.proxy_runs
    import climb.stages.embed
    from climb.config import load_config
    from climb.runtime.layout import RunPaths
    from climb.stages import cluster, embed, search, tokenize
    root = tmp_path_factory.mktemp("reuse")
    write_parquet_shards(root / "corpus", vocab_docs(40), 2)
    (root / "target.jsonl").write_text(json.dumps({"text": "held-out words"}) + "\n")
    (root / "table.csv").write_text("index,loss\n0,1.0\n")  # the stand-in never reads it; preflight does
    cfg = load_config(None, [
        f'corpus.paths=["{root}/corpus/*.parquet"]', "cluster.k=4", "cluster.niter=10",
        "proxy.vocab_size=320", "proxy.seq_len=16", "proxy.tokenizer_docs=100",
        f'proxy.lookup="{root}/table.csv"', f'proxy.lookup_weights="{root}/table.csv"',
        'target.objective=["loss"]', f'target.texts=["{root}/target.jsonl"]', "target.contamination=0",
        f"search.iterations={list(ITERATIONS)}", "search.pool_size=2000", "search.min_weight=0.0",
        "search.epoch_cap=100.0", 'search.predictor="linear"', "search.dedup_l1=0.3", "search.steadiness_boot=0", "search.replicates=2",
        "search.replicate_seeds=2", "search.eval_seeds=3", "export.token_budget=3000"])
    paths = RunPaths(root / "v1")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(climb.stages.embed, "load_model", lambda c: FakeModel())
        mp.setattr(climb.runtime.proxy_runs, "_lookup", _bowl)
        WORLD.update(mode="same")
        for stage in (embed, cluster, tokenize, search):
            stage.run(cfg, paths)
    paths.save_config(cfg)
    return cfg, paths.root


def _next(earlier, tmp_path, name: str = "v2", **search):
    """(config reusing the earlier run, RunPaths of a copy of the earlier folder)."""
    from dataclasses import replace

    from climb.runtime.layout import RunPaths
    cfg, root = earlier
    shutil.copytree(root, tmp_path / name)
    cfg = replace(cfg, search=replace(cfg.search, reuse=str(root), **search))
    return cfg, RunPaths(tmp_path / name)


def _records(paths) -> list[dict]:
    from climb.stages.search import read_results
    return read_results(paths)


# ----------------------------------------------------------------- the decision
def test_decide_names_the_three_outcomes():
    from climb.stages.search.reuse import agreement, decide
    p = np.array([1.0, 1.1, 1.2, 1.3])
    assert decide(agreement(p, p + 0.05 + [0.001, -0.001, 0.0, 0.0]), 0.01, 0.2)[0] == "holds"
    assert decide(agreement(p, p + [0.0, 0.05, -0.04, 0.06]), 0.01, 0.2)[0] == "drifted"  # residual too wide
    assert decide(agreement(p, p + 0.5), 0.01, 0.2)[0] == "drifted"  # a shift beyond the swarm's spread
    assert decide(agreement(p, p + 0.001 * np.arange(4)), None, 0.2)[0] == "drifted"  # no noise to judge by
    assert decide(agreement(p, p[::-1]), 0.01, 0.2)[0] == "fails"
    assert decide(agreement(p[:2], p[:2]), 0.01, 0.2)[0] == "fails"  # too few to judge


# ----------------------------------------------------------------- holds, fails
def test_an_unchanged_corpus_holds_and_trains_the_confirmation_and_the_last_iteration(earlier, tmp_path):
    from climb.stages import search
    from climb.stages.report import quality_lines
    cfg, paths = _next(earlier, tmp_path)
    stats = search.run(cfg, paths)
    recs = _records(paths)
    assert stats["reuse"]["decision"] == "holds", json.loads(paths.search.reuse.read_text())
    assert len(recs) == ITERATIONS[-1] + ITERATIONS[-1]  # the confirmation round, then the last iteration
    assert sum(r["mixture_id"].startswith("reuse-") for r in recs) == ITERATIONS[-1]
    assert {r["iteration"] for r in recs} == {0, len(ITERATIONS) - 1}
    first = json.loads(paths.search.reuse_plan.read_text())["mixtures"][0]
    np.testing.assert_allclose(first["weights"], json.loads((earlier[1] / "search" / "mixture.json").read_text())
                               ["weights"], atol=1e-9)  # the earlier pick is confirmed first
    # The pick is one of this run's own measured mixtures, never an earlier record.
    mix = json.loads(paths.search.mixture.read_text())
    assert mix["best_seen"]["mixture_id"] in {r["mixture_id"] for r in recs}
    assert any(np.abs(np.array(r["weights"]) - mix["weights"]).sum() < 1e-9 for r in recs)
    q = json.loads(paths.search.quality.read_text())
    assert q["reuse"]["decision"] == "holds" and q["reuse"]["noise"] > 0
    assert q["swarm_sd"] is None  # a chosen round is no swarm
    assert "search.reuse" in quality_lines(q) and "holds" in quality_lines(q)


def test_a_reversed_landscape_falls_back_to_the_full_search(earlier, tmp_path, caplog):
    from climb.stages import search
    cfg, paths = _next(earlier, tmp_path)
    WORLD["mode"] = "reversed"
    with caplog.at_level("WARNING"):
        stats = search.run(cfg, paths)
    assert stats["reuse"]["decision"] == "fails"
    assert len(_records(paths)) == ITERATIONS[-1] + sum(ITERATIONS)  # the confirmation, then all of it
    assert any("search.reuse" in r.message and "fails" in r.message for r in caplog.records
               if r.levelname == "WARNING")
    q = json.loads(paths.search.quality.read_text())
    assert q["reuse"]["spearman"] < 0


def test_a_shifted_landscape_still_holds_with_the_bias_measured(earlier, tmp_path):
    from climb.stages import search
    cfg, paths = _next(earlier, tmp_path)
    WORLD["mode"] = "shifted"
    search.run(cfg, paths)
    rep = json.loads(paths.search.reuse.read_text())
    assert rep["decision"] == "holds" and rep["bias"] == pytest.approx(0.03, abs=0.02)


# ----------------------------------------------------------------- refusals, before any proxy
@pytest.mark.parametrize("change,said", [
    (["--set", "proxy.n_layer=3"], r"its proxies were \d+ layers x \d+, this run's are 3 x \d+; reuse needs the same"),
    (["--set", "proxy.tokenizer_docs=30"], r"tokenizer \(tokenize/tokenizer.json\) holds other tokens"),
    ("target", r"its target files hold other content than this run's; reuse needs the same target"),
    (["--set", 'target.goal="maximize"', "--set", 'target.objective=["loss"]'], r"its target.goal was 'minimize'"),
], ids=["proxy size", "tokenizer", "target files", "goal"])
def test_another_proxy_tokenizer_or_target_is_refused_in_one_line(earlier, tmp_path, monkeypatch, capsys, change,
                                                                  said):
    import climb.stages.embed
    from climb.cli import main
    from climb.config import to_toml
    cfg, paths = _next(earlier, tmp_path)
    if change == "target":
        from dataclasses import replace
        other = tmp_path / "target.jsonl"
        other.write_text(json.dumps({"text": "other held-out words"}) + "\n")
        cfg, change = replace(cfg, target=replace(cfg.target, texts=(str(other),))), []
    config = tmp_path / "v2.toml"
    config.write_text(to_toml(cfg))
    monkeypatch.setattr(climb.stages.embed, "load_model", lambda c: FakeModel())
    before = paths.search.results.read_bytes()
    rc = main(["search", "--config", str(config), "--run", str(paths.root), *change])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2
    assert re.search(said, err[-1]) and err[-1].count("search.reuse") == 1, err
    assert WORLD["calls"] == 0 and paths.search.results.read_bytes() == before
    assert not paths.search.reuse_plan.exists()


def test_a_run_without_a_finished_search_or_its_own_folder_is_refused(earlier, tmp_path):
    from climb.io.errors import InputError
    from climb.stages import search
    cfg, paths = _next(earlier, tmp_path)
    bare = tmp_path / "bare"
    bare.mkdir()
    from dataclasses import replace
    with pytest.raises(InputError, match="no finished search there"):
        search.run(replace(cfg, search=replace(cfg.search, reuse=str(bare))), paths)
    with pytest.raises(InputError, match="this run's own folder"):
        search.run(replace(cfg, search=replace(cfg.search, reuse=str(paths.root))), paths)
    assert WORLD["calls"] == 0


# ----------------------------------------------------------------- keys, resume
def test_keys_unchanged_by_default_and_the_earlier_run_keyed_by_content(earlier, tmp_path):
    from dataclasses import replace

    from climb.config import SearchConfig
    from climb.config.schema import key_data
    from climb.runtime.layout import RunPaths
    from climb.stages.search import key
    cfg, root = earlier
    assert "reuse" not in key_data(SearchConfig()) and "reuse" not in key_data(cfg.search)
    ep = RunPaths(root)
    assert key(cfg, ep) == json.loads(ep.manifest("search").read_text())["key"]
    moved = tmp_path / "moved"
    shutil.copytree(root, moved)
    a = key(replace(cfg, search=replace(cfg.search, reuse=str(root))), ep)
    b = key(replace(cfg, search=replace(cfg.search, reuse=str(moved))), ep)
    assert a == b != key(cfg, ep)  # where the earlier run lies does not matter; that there is one does
    with open(moved / "search" / "results.jsonl", "a") as fh:  # its evidence changed: this search reruns
        fh.write(json.dumps({"mixture_id": "extra", "iteration": 0, "seed": 0, "weights": [0.25] * 4,
                             "status": "ok", "objective": 1.0, "metrics": {"loss": 1.0}}) + "\n")
    from climb.stages.search.reuse import evidence_key
    from climb.io.errors import InputError
    with pytest.raises(InputError, match="changed since that search finished"):
        evidence_key(replace(cfg, search=replace(cfg.search, reuse=str(moved))))


def _outputs(paths) -> dict:
    def clean(o):
        if isinstance(o, dict):
            return {k: clean(v) for k, v in o.items() if k != "seconds"}
        return [clean(v) for v in o] if isinstance(o, list) else o
    out = {}
    for f in sorted(paths.search.dir.iterdir()):
        if f.is_file() and f.name not in ("manifest.json", "stage_state.json"):
            text = f.read_text()
            out[f.name] = ([clean(json.loads(x)) for x in text.splitlines()] if f.suffix == ".jsonl"
                           else clean(json.loads(text)) if f.suffix == ".json" else text)
    return out


@pytest.mark.parametrize("kept,plans", [(2, False), (ITERATIONS[-1] + 1, True)],
                         ids=["in the confirmation round", "in the last iteration"])
def test_a_killed_reused_search_resumes_to_the_same_answer(earlier, tmp_path, kept, plans):
    from climb.stages import search
    cfg, ref = _next(earlier, tmp_path, "ref")
    search.run(cfg, ref)
    want = _outputs(ref)
    cfg, paths = _next(earlier, tmp_path, "killed")
    shutil.rmtree(paths.search.dir)
    shutil.copytree(ref.search.dir, paths.search.dir)
    lines = paths.search.results.read_text().splitlines()
    for f in paths.search.dir.iterdir():  # what a kill leaves: the log so far, the plans made, the state
        if f.name not in ("results.jsonl", "stage_state.json", "reuse_plan.json") and not (
                plans and f.name.startswith("plan_")):
            shutil.rmtree(f) if f.is_dir() else f.unlink()
    paths.search.results.write_text("".join(x + "\n" for x in lines[:kept]))
    WORLD["calls"] = 0
    search.run(cfg, paths)
    assert WORLD["calls"] > 0
    got = _outputs(paths)
    assert sorted(got) == sorted(want)
    for f in want:
        assert got[f] == want[f], f"{f} differs after a kill"
