"""`search.reuse`: a search that starts from an earlier run's evidence when the corpus changed.

One earlier run is searched once for the module; each test works on a copy of its folder (a
copied run folder redoes no stage), as a team would start the next version of its corpus. The
proxies are an in-process stand-in (`proxy.lookup` with its look-up replaced): a curved bowl in
the weights, lowest inside the simplex, plus seed noise drawn per (corpus version, seed, mixture),
so that the next version's proxies have fresh noise as a changed token store gives them. A test
keeps, shifts, stretches or reverses the landscape between the runs (`WORLD`), so what the
confirmation round should find is known.
"""
from __future__ import annotations

import json
import re
import shutil
import zlib

import numpy as np
import pytest

from conftest import FakeModel, lookup_search_sets, vocab_docs, write_parquet_shards

ITERATIONS = (8, 6, 4)
NOISE = 0.01
CENTRE = np.array([0.45, 0.3, 0.15, 0.1])  # the bowl's lowest point
# How the stand-in proxy scores: the landscape, the corpus version its noise is drawn for, proxies trained.
WORLD = {"mode": "same", "version": "v1", "calls": 0}


def _bowl(task):
    """0.5 |w - CENTRE|^2 plus noise per (version, mixture, seed); "shifted" adds a constant,
    "stretched" doubles every difference, "reversed" turns the bowl upside down. Over another
    number of clusters (clusters fitted again), the bowl is centred on the uniform mixture."""
    WORLD["calls"] += 1
    w = np.asarray(task.weights, float)
    centre = CENTRE if len(w) == len(CENTRE) else np.full(len(w), 1 / len(w))
    d = 0.5 * float(((w - centre) ** 2).sum())
    d = {"same": d, "shifted": d + 0.03, "stretched": 2 * d, "reversed": 1.0 - d}[WORLD["mode"]]
    rng = np.random.default_rng([zlib.crc32(WORLD["version"].encode()), int(task.seed),
                                 zlib.crc32(np.round(w, 6).tobytes())])
    return {"loss": 1.0 + d + float(rng.normal(0, NOISE))}, 0


@pytest.fixture(autouse=True)
def _world(monkeypatch):
    import climb.runtime.proxy_runs
    monkeypatch.setattr(climb.runtime.proxy_runs, "_lookup", _bowl)
    WORLD.update(mode="same", version="v2", calls=0)
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
    cfg = load_config(None, lookup_search_sets(root, [f"{root}/corpus/*.parquet"], ITERATIONS))
    paths = RunPaths(root / "v1")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(climb.stages.embed, "load_model", lambda c: FakeModel())
        mp.setattr(climb.runtime.proxy_runs, "_lookup", _bowl)
        WORLD.update(mode="same", version="v1")
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
    # A residual 2.5x the noise: beyond what noise known exactly gives, within what a noise
    # measured on 6 degrees of freedom may hide.
    wide = agreement(p, p + 0.025 * np.array([-1.0, 1.0, 1.0, -1.0]) / np.std([-1, 1, 1, -1], ddof=1))
    assert wide["residual_sd"] == pytest.approx(0.025)
    assert decide(wide, 0.01, 0.2)[0] == "drifted" and decide(wide, 0.01, 0.2, noise_df=6)[0] == "holds"


def test_the_noise_of_a_difference_and_the_round_spread_over_the_values():
    from climb.stages.search.reuse import difference_noise, spread_over_values
    assert difference_noise({"paired_sd": 0.01, "seed_sd": 0.05}) == pytest.approx(0.01 * 2 ** 0.5)
    assert difference_noise({"paired_sd": None}) is None
    recs = [{"mixture_id": f"m{i}", "objective": v} for i, v in enumerate([3.0, 1.0, 2.0, 5.0, 4.0, 0.5, 6.0])]
    got = [r["objective"] for r in spread_over_values(recs, 3, "minimize")]
    assert got == [2.0, 4.0, 6.0]  # ranks 2, 4, 6 of 0..6: the best left to the pick, the worst taken
    assert [r["objective"] for r in spread_over_values(recs, 3, "maximize")] == [4.0, 2.0, 0.5]
    assert len(spread_over_values(recs[:2], 3, "minimize")) == 2


# ----------------------------------------------------------------- holds, drifted, fails
def _round(paths, earlier_root) -> list[dict]:
    """The confirmation round, each mixture beside the earlier record it repeats."""
    old = {r["mixture_id"]: r for r in _records(type(paths)(earlier_root))}
    plan = json.loads(paths.search.reuse_plan.read_text())["mixtures"]
    return [(m, old.get(m["earlier"])) for m in plan]


@pytest.mark.parametrize("version", ["v2", "v1"], ids=["fresh noise", "the same windows"])
def test_an_unchanged_corpus_holds_and_trains_the_confirmation_and_the_last_iteration(earlier, tmp_path, version):
    from climb.stages import search
    from climb.stages.report import quality_lines
    cfg, paths = _next(earlier, tmp_path)
    WORLD["version"] = version  # v2: the update drew other windows; v1: it drew the same
    stats = search.run(cfg, paths)
    recs = _records(paths)
    rep = json.loads(paths.search.reuse.read_text())
    assert stats["reuse"]["decision"] == "holds", rep
    assert rep["spearman"] >= 0.5 and rep["residual_sd"] <= rep["residual_limit"]
    assert rep["noise"] == pytest.approx(2 ** 0.5 * rep["paired_sd"])
    if version == "v1":  # same seed, same data: the same proxy, so the same value
        assert rep["bias"] == 0 and rep["residual_sd"] == 0
    assert len(recs) == ITERATIONS[-1] + ITERATIONS[-1]  # the confirmation round, then the last iteration
    assert sum(r["mixture_id"].startswith("reuse-") for r in recs) == ITERATIONS[-1]
    assert {r["iteration"] for r in recs} == {0, len(ITERATIONS) - 1}
    # The round repeats earlier measurements with their seeds: the pick first, then values spread
    # from near the best to the worst the earlier run measured.
    pairs = _round(paths, earlier[1])
    np.testing.assert_allclose(pairs[0][0]["weights"], json.loads((earlier[1] / "search" / "mixture.json")
                                                                  .read_text())["weights"], atol=1e-9)
    for m, old in pairs:
        assert old is not None and m["weights"] == old["weights"] and m["seed"] == old["seed"]
        assert m["expected"] == old["objective"]
    expected = [m["expected"] for m, _ in pairs]
    assert expected == sorted(expected) and expected[-1] == max(r["objective"] for r in _records(
        type(paths)(earlier[1])))
    # The pick is one of this run's own measured mixtures, never an earlier record.
    mix = json.loads(paths.search.mixture.read_text())
    assert mix["best_seen"]["mixture_id"] in {r["mixture_id"] for r in recs}
    assert any(np.abs(np.array(r["weights"]) - mix["weights"]).sum() < 1e-9 for r in recs)
    q = json.loads(paths.search.quality.read_text())
    assert q["reuse"]["decision"] == "holds" and q["reuse"]["noise"] > 0
    assert q["swarm_sd"] is None  # a chosen round is no swarm
    assert "search.reuse" in quality_lines(q) and "holds" in quality_lines(q)
    # The earlier run's replicate seeds stand for this run's: no proxy beyond the round, the last
    # iteration and the comparison trained, and the noise figures are read from the earlier replicates.
    eq = json.loads((earlier[1] / "search" / "quality.json").read_text())
    assert rep["replicates_inherited"] and q["replicates"] == eq["replicates"] and eq["replicates"]
    assert stats["replicate_proxies"] == 0 and not paths.search.replicates.exists()
    assert WORLD["calls"] == len(recs) + stats["comparison_proxies"]


def test_a_shifted_landscape_still_holds_with_the_bias_measured(earlier, tmp_path):
    from climb.stages import search
    cfg, paths = _next(earlier, tmp_path)
    WORLD["mode"] = "shifted"
    search.run(cfg, paths)
    rep = json.loads(paths.search.reuse.read_text())
    assert rep["decision"] == "holds" and rep["bias"] == pytest.approx(0.03, abs=2 * NOISE)


def test_a_stretched_landscape_drifted_and_runs_the_last_two_iterations(earlier, tmp_path, caplog):
    from climb.stages import search
    cfg, paths = _next(earlier, tmp_path)
    WORLD["mode"] = "stretched"  # the same order, every difference doubled
    with caplog.at_level("WARNING"):
        stats = search.run(cfg, paths)
    rep = json.loads(paths.search.reuse.read_text())
    assert stats["reuse"]["decision"] == "drifted", rep
    assert rep["spearman"] >= 0.5 and rep["residual_sd"] > rep["residual_limit"]
    assert len(_records(paths)) == ITERATIONS[-1] + sum(ITERATIONS[-2:])
    assert any("search.reuse" in r.message and "drifted" in r.message for r in caplog.records
               if r.levelname == "WARNING")


def test_a_reversed_landscape_falls_back_to_the_full_search(earlier, tmp_path, caplog):
    from climb.stages import search
    cfg, paths = _next(earlier, tmp_path)
    WORLD["mode"] = "reversed"
    with caplog.at_level("WARNING"):
        stats = search.run(cfg, paths)
    assert stats["reuse"]["decision"] == "fails"
    assert len(_records(paths)) == ITERATIONS[-1] + sum(ITERATIONS)  # the confirmation, then all of it
    # Evidence that fails vouches for nothing: the replicate seeds train again.
    assert stats["replicate_proxies"] > 0 and not json.loads(paths.search.reuse.read_text())["replicates_inherited"]
    assert any("search.reuse" in r.message and "fails" in r.message for r in caplog.records
               if r.levelname == "WARNING")
    q = json.loads(paths.search.quality.read_text())
    assert q["reuse"]["spearman"] < 0


def test_an_added_shard_that_moves_the_best_mixture_is_caught_and_searched_again(earlier, tmp_path, monkeypatch):
    """Planted drift through the data itself: the stand-in proxy scores a mixture by where the token
    store's clusters lie, and a shard added to one cluster makes that cluster the one to draw from.
    The confirmation round must see the earlier landscape moved and spend more than it would have."""
    from dataclasses import replace
    from pathlib import Path

    import climb.runtime.proxy_runs
    import climb.stages.embed
    from climb.runtime.layout import RunPaths
    from climb.stages import cluster, embed, search, tokenize
    from climb.stages.tokenize import cluster_tokens
    from conftest import VOCABS
    before = cluster_tokens(RunPaths(earlier[1])).astype(float)

    def data_bowl(task):
        """The earlier bowl on the earlier store; on a store where a cluster grew by more than half,
        a bowl centred near that cluster (its new documents are what the target wants)."""
        WORLD["calls"] += 1
        now = cluster_tokens(RunPaths(Path(task.run_dir))).astype(float)
        grew = (now - before) / np.maximum(before, 1.0)
        centre = CENTRE.copy()
        if grew.max() > 0.5:
            centre = 0.1 * CENTRE + 0.9 * np.eye(len(CENTRE))[int(np.argmax(grew))]
        w = np.asarray(task.weights, float)
        rng = np.random.default_rng([int(task.seed), zlib.crc32(np.round(w, 6).tobytes())])
        return {"loss": 1.0 + 0.5 * float(((w - centre) ** 2).sum()) + float(rng.normal(0, NOISE))}, 0
    cfg, paths = _next(earlier, tmp_path)
    folder = earlier[1].parent / "corpus"
    added = tmp_path / "added"
    # One vocabulary alone, three times as many documents as it had: the cluster it lands in grows.
    shard = write_parquet_shards(added, [dict(d, id=f"new-{d['id']}") for d in
                                         vocab_docs(120, seed=7, vocabs={"sea": VOCABS["sea"]})], 1)[0]
    shard = shard.rename(added / "sea-added.parquet")
    cfg = replace(cfg, corpus=replace(cfg.corpus, paths=[f"{folder}/*.parquet", str(shard)]))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(climb.stages.embed, "load_model", lambda c: FakeModel())
        for stage in (embed, cluster, tokenize):
            stage.run(cfg, paths)
    grew = (cluster_tokens(paths) - before) / before
    assert grew.max() > 0.5 and np.sort(grew)[-2] < 0.5  # the shard went to one cluster
    monkeypatch.setattr(climb.runtime.proxy_runs, "_lookup", data_bowl)
    stats = search.run(cfg, paths)
    rep = json.loads(paths.search.reuse.read_text())
    assert rep["decision"] in ("drifted", "fails"), rep
    held = ITERATIONS[-1] + ITERATIONS[-1]
    assert len(_records(paths)) > held  # more than a landscape that held would have cost
    # and the pick moved toward the grown cluster, as a full search's would
    g = int(np.argmax(grew))
    old = json.loads((earlier[1] / "search" / "mixture.json").read_text())["weights"]
    assert json.loads(paths.search.mixture.read_text())["weights"][g] > old[g] + 0.2
    assert stats["reuse"]["decision"] == rep["decision"]


def test_a_pick_the_search_never_trained_is_expected_at_its_comparison(earlier):
    from climb.runtime.layout import RunPaths
    from climb.stages.search.reuse import _pick_measured, earlier_records
    ep = RunPaths(earlier[1])
    old = earlier_records(ep)
    assert _pick_measured(ep, old, old[3]["weights"]) is old[3]
    got = _pick_measured(ep, old, [0.1, 0.2, 0.3, 0.4])  # search.final = "predicted" may pick such a mixture
    want = json.loads(ep.search.comparison.read_text())[f"climb/{earlier[0].search.eval_seed}"]
    assert got["seed"] == earlier[0].search.eval_seed and got["objective"] == want["objective"]


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


def test_other_clusters_are_not_refused_the_earlier_mixture_enters_as_one_component(earlier, tmp_path):
    """cluster.refit with another cluster.k, the same tokenizer (named), target and proxies: the
    earlier found mixture is read over the new clusters (tests/test_virtual.py), no confirmation round."""
    from dataclasses import replace

    import climb.stages.embed
    from climb.stages import cluster, search, tokenize
    cfg, paths = _next(earlier, tmp_path)
    cfg = replace(cfg, cluster=replace(cfg.cluster, k=3, refit=True),
                  proxy=replace(cfg.proxy, tokenizer=str(earlier[1] / "tokenize" / "tokenizer.json")))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(climb.stages.embed, "load_model", lambda c: FakeModel())
        cluster.run(cfg, paths)
        tokenize.run(cfg, paths)
    stats = search.run(cfg, paths)
    assert paths.n_clusters() == 3 and stats["reuse"] == {"mode": "virtual", "new_clusters": [], "proxies": 0}
    assert _records(paths) == [] and WORLD["calls"] == stats["comparison_proxies"]
    plan = json.loads(paths.search.reuse_plan.read_text())
    assert plan["mode"] == "virtual" and "mixtures" not in plan and plan["matched_docs"] == 120


def test_a_shard_removed_under_the_same_clusters_trains_no_search_proxy(earlier, tmp_path):
    """The corpus less a shard, the clusters kept: nothing was added that a proxy could measure, so
    the earlier found mixture, read over what is left, is the pick (the component path, no new cluster)."""
    from dataclasses import replace

    import climb.stages.embed
    from climb.stages import cluster, embed, search, tokenize
    from climb.stages.search.reuse import mode, removed_only
    from climb.runtime.layout import RunPaths
    cfg, paths = _next(earlier, tmp_path)
    first = sorted((earlier[1].parent / "corpus").glob("*.parquet"))[0]
    cfg = replace(cfg, corpus=replace(cfg.corpus, paths=[str(first)]))
    assert not removed_only(RunPaths(earlier[1]), paths)  # before the update: the same corpus
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(climb.stages.embed, "load_model", lambda c: FakeModel())
        for stage in (embed, cluster, tokenize):
            stage.run(cfg, paths)
    ep = RunPaths(earlier[1])
    assert paths.shards() == ep.shards()[:1] and removed_only(ep, paths) and mode(ep, paths) == "virtual"
    assert not removed_only(paths, ep)  # the other way round, a shard was added
    stats = search.run(cfg, paths)
    assert stats["reuse"] == {"mode": "virtual", "new_clusters": [], "proxies": 0}
    assert _records(paths) == [] and WORLD["calls"] == stats["comparison_proxies"]
    rep = json.loads(paths.search.reuse.read_text())
    assert rep["removed_only"] and 0 < rep["removed_share"] < 1 and rep["lost_clusters"] == []
    assert "only lost documents" in search.reuse.sentence(rep)
    # Every cluster kept documents, so each keeps its weight (inside this run's caps).
    mix = json.loads(paths.search.mixture.read_text())
    old = json.loads((earlier[1] / "search" / "mixture.json").read_text())["weights"]
    assert mix["component"] and mix["weights"] == pytest.approx(old, abs=1e-6)


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
    # reuse_sharpen does nothing without reuse, so it enters no key there whatever its value; with
    # reuse it enters the key except at 0, what a reused search did before the setting existed.
    assert "reuse_sharpen" not in key_data(SearchConfig()) and SearchConfig().reuse_sharpen == 4.0
    assert "reuse_sharpen" not in key_data(SearchConfig(reuse_sharpen=2.0))
    assert key_data(SearchConfig(reuse="runs/v1"))["reuse_sharpen"] == 4.0
    assert "reuse_sharpen" not in key_data(SearchConfig(reuse="runs/v1", reuse_sharpen=0.0))
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
