"""`search.reuse` across other clusters: the earlier found mixture as one fixed component.

Three toy runs, each made in a copy of the folder before it (a copied run folder redoes no
stage, so only what changed runs again), as a team would make the next versions of its corpus:

- v1: shards `part-00000` and `part-00001` (sea, code and food documents, mixed) and `space`
  (a fourth vocabulary alone), 4 clusters, searched;
- v2: `space` removed and 3 clusters fitted again (`cluster.refit`), reusing v1: no cluster is
  new, so the component alone;
- v3: `space` added back and 4 clusters fitted again, reusing v2: its documents form a cluster
  of their own, new to v2.

Every run names v1's tokenizer (`proxy.tokenizer`): fitting the clusters again tokenises the
corpus again, and a tokenizer trained again on other documents would be another tokenizer. The
proxies are test_reuse's in-process stand-in, a bowl in the weights plus seed noise, whose centre
a test plants (`WORLD`), so what the search should find is known.
"""
from __future__ import annotations

import json
import re
import shutil
import zlib
from dataclasses import replace

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from conftest import FakeModel, lookup_search_sets, vocab_docs, write_parquet_shards
from test_reuse import _outputs  # a search folder's outputs, timings left out

ITERATIONS = (8, 6, 4)
NOISE = 0.01
SPACE = {"space": ["planet", "comet", "orbit", "galaxy", "nebula", "rocket", "asteroid", "telescope", "meteor",
                   "eclipse"]}
# The stand-in proxy's landscape: SCALE |w - centre|^2 plus noise per (version, seed, mixture).
WORLD = {"centre": None, "scale": 0.5, "version": "v1", "calls": 0}


def _bowl(task):
    WORLD["calls"] += 1
    w = np.asarray(task.weights, float)
    centre = WORLD["centre"] if WORLD["centre"] is not None else np.full(len(w), 1 / len(w))
    d = WORLD["scale"] * float(((w - centre) ** 2).sum())
    rng = np.random.default_rng([zlib.crc32(WORLD["version"].encode()), int(task.seed),
                                 zlib.crc32(np.round(w, 6).tobytes())])
    return {"loss": 1.0 + d + float(rng.normal(0, NOISE))}, 0


@pytest.fixture(autouse=True)
def _world(monkeypatch):
    import climb.runtime.proxy_runs
    import climb.stages.embed
    monkeypatch.setattr(climb.runtime.proxy_runs, "_lookup", _bowl)
    monkeypatch.setattr(climb.stages.embed, "load_model", lambda c: FakeModel())
    WORLD.update(centre=None, scale=0.5, version="v3", calls=0)
    yield


def _stages(cfg, paths, *, search: bool = True) -> dict:
    """Run the stages up to the search (or the tokenizer); the last one's stats."""
    import climb.runtime.proxy_runs
    import climb.stages.embed
    from climb.stages import cluster, embed
    from climb.stages import search as search_stage
    from climb.stages import tokenize
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(climb.stages.embed, "load_model", lambda c: FakeModel())
        mp.setattr(climb.runtime.proxy_runs, "_lookup", _bowl)
        for stage in (embed, cluster, tokenize) + ((search_stage,) if search else ()):
            stats = stage.run(cfg, paths)
    paths.save_config(cfg)
    return stats


def _with(cfg, shards, k: int, **search):
    return replace(cfg, corpus=replace(cfg.corpus, paths=tuple(map(str, shards))),
                   cluster=replace(cfg.cluster, k=k, refit=True), search=replace(cfg.search, **search))


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """{"root", "shards", "v1", "v2", "v3" (clustered and tokenised, not searched): (config, RunPaths)}."""
    from climb.config import load_config
    from climb.runtime.layout import RunPaths
    from climb.stages.search.virtual import earlier_component
    root = tmp_path_factory.mktemp("virtual")
    shards = write_parquet_shards(root / "corpus", vocab_docs(30), 2)
    space = root / "corpus" / "space.parquet"
    docs = vocab_docs(30, seed=1, vocabs=SPACE)
    pq.write_table(pa.table({"id": [d["id"] for d in docs], "text": [d["text"] for d in docs]}), space)
    cfg = load_config(None, lookup_search_sets(root, [shards[0], shards[1], space], ITERATIONS))
    v1 = RunPaths(root / "v1")
    WORLD.update(centre=np.array([0.45, 0.3, 0.15, 0.1]), version="v1")
    _stages(cfg, v1)
    cfg1 = cfg
    # Later versions name the tokenizer v1 trained: the same tokens (reuse compares them, not the setting).
    cfg = replace(cfg, proxy=replace(cfg.proxy, tokenizer=str(v1.tokenize.tokenizer)))

    # v2: the space shard removed, 3 clusters fitted again, and a bound the component must be brought inside.
    shutil.copytree(v1.root, root / "v2")
    v2 = RunPaths(root / "v2")
    cfg2 = _with(cfg, shards[:2], 3, reuse=str(v1.root))
    _stages(cfg2, v2, search=False)
    read = np.asarray(earlier_component(cfg2, v2, v1)["from_documents"])
    top = int(np.argmax(read))
    cfg2 = replace(cfg2, search=replace(cfg2.search, bounds={f"cluster:{top}": [0.0, round(read[top] - 0.1, 3)]}))
    WORLD.update(centre=None, version="v2", calls=0)
    stats2 = _stages(cfg2, v2)
    calls2 = WORLD["calls"]

    # v3: the space shard back, 4 clusters fitted again: its documents are new to v2.
    shutil.copytree(v2.root, root / "v3", ignore=_set_aside)
    v3 = RunPaths(root / "v3")
    cfg3 = _with(cfg, [*shards[:2], space], 4, reuse=str(v2.root))
    _stages(cfg3, v3, search=False)
    return {"root": root, "shards": (*shards, space), "v1": (cfg1, v1), "v2": (cfg2, v2), "v3": (cfg3, v3),
            "v2_stats": stats2, "v2_calls": calls2, "top": top}


def _labels(paths) -> dict[int, str]:
    """Each cluster's vocabulary (its documents' ids begin with it), asserting the clusters are pure."""
    from climb.stages.search.virtual import _documents
    got: dict[int, dict[str, int]] = {}
    for shard in paths.shards():
        ids, clusters, _ = _documents(paths, shard)
        for i, c in zip(ids, clusters):
            row = got.setdefault(int(c), {})
            row[i.split("-")[0]] = row.get(i.split("-")[0], 0) + 1
    out = {}
    for c, row in got.items():
        name = max(row, key=row.get)
        assert row[name] >= 0.95 * sum(row.values()), (c, row)  # the toy corpus clusters by vocabulary
        out[c] = name
    return out


def _set_aside(folder, names) -> list[str]:
    """An earlier search a copied run had set aside (search.prev-<time>) is left out of the copy: a
    search set aside in the same second would take its name."""
    return [n for n in names if n.startswith("search.prev-")]


def _copy(runs, name: str, dest, **search):
    """(config, RunPaths) of a copy of run `name`, its search settings changed by `search`."""
    from climb.runtime.layout import RunPaths
    cfg, paths = runs[name]
    shutil.copytree(paths.root, dest, ignore=_set_aside)
    return replace(cfg, search=replace(cfg.search, **search)), RunPaths(dest)


def _records(paths) -> list[dict]:
    from climb.stages.search import read_results
    return read_results(paths)


# ----------------------------------------------------------------- the component and its basis
def test_the_component_expands_into_cluster_weights_summing_to_its_share():
    from climb.stages.search.virtual import expand
    v = np.array([0.5, 0.25, 0.15, 0.1, 0.0])  # weight on a new cluster too: documents the earlier run held
    new = [3, 4]
    A = np.random.default_rng(0).dirichlet(np.ones(3), 50)
    W = expand(A, v, new, 5)
    np.testing.assert_allclose(W.sum(1), 1.0)
    part = expand(A * [1.0, 0.0, 0.0], v, new, 5)  # the component's part alone
    np.testing.assert_allclose(part.sum(1), A[:, 0])
    np.testing.assert_allclose(part, A[:, :1] * v)
    np.testing.assert_allclose((W - part)[:, new], A[:, 1:])  # the rest lies on the new clusters alone
    np.testing.assert_allclose(expand([1.0, 0.0, 0.0], v, new, 5), v)
    np.testing.assert_allclose(expand([0.0, 0.0, 1.0], v, new, 5), np.eye(5)[4])


def test_the_pool_starts_with_the_component_and_holds_every_bound():
    from types import SimpleNamespace

    from climb.config import SearchConfig
    from climb.optimize.bounds import from_config, satisfied
    from climb.stages.search.virtual import component_pool
    natural = np.array([0.4, 0.3, 0.2, 0.1])
    space = {"natural": natural, "usable": np.ones(4, bool), "max_weight": np.array([1.0, 1.0, 1.0, 0.3])}
    space["bounds"] = from_config({"cluster:0": [0.1, 0.6]}, space, 0.02)
    cfg = SimpleNamespace(search=SearchConfig(min_weight=0.02, reuse_sharpen=0.0))  # the component as found
    v = np.array([0.5, 0.3, 0.2, 0.0])
    W = component_pool(cfg, space, v, [3], 500, seed=0)
    np.testing.assert_allclose(W[0], v)
    assert len(W) > 100 and satisfied(W, space["bounds"]).all()
    assert W[:, 3].max() == pytest.approx(0.3)  # the new cluster's corner, at its cap
    assert len(np.unique(np.round(W, 6), axis=0)) == len(W)
    # Brought inside along the segment to v, each row is still a_0 v + a_3 e_3: clusters 0..2 in v's proportions.
    share = W[:, :3] / W[:, :3].sum(1, keepdims=True)
    np.testing.assert_allclose(share, np.broadcast_to(v[:3] / v[:3].sum(), share.shape), atol=1e-6)
    assert len(component_pool(cfg, space, v, [], 500, seed=0)) == 1  # nothing new: the component alone
    # A new cluster whose cap is below min_weight can take no weight: the component alone again.
    tight = {**space, "max_weight": np.array([1.0, 1.0, 1.0, 0.01])}
    tight["bounds"] = from_config({}, tight, 0.02)
    assert len(component_pool(cfg, tight, v, [3], 500, seed=0)) == 1


# ----------------------------------------------------------------- a shard removed: no cluster new
def test_a_sharpened_component_moves_weight_onto_its_heaviest_cluster_and_holds_every_bound():
    """search.reuse_sharpen: half the draws take the component raised to a power in [1, G]; those rows
    lean on v's heaviest cluster more than v does, every row holds the bounds, and with the setting
    off the pool is what it was."""
    from types import SimpleNamespace

    from climb.config import SearchConfig
    from climb.optimize.bounds import from_config, satisfied
    from climb.stages.search.virtual import component_pool, sharpened
    natural = np.array([0.4, 0.3, 0.2, 0.1])
    space = {"natural": natural, "usable": np.ones(4, bool), "max_weight": np.array([1.0, 1.0, 1.0, 0.3])}
    space["bounds"] = from_config({}, space, 0.02)
    v = np.array([0.6, 0.3, 0.1, 0.0])
    S = sharpened(v, [1.0, 2.0, 8.0], 0.02)
    np.testing.assert_allclose(S[0], v)
    assert S[1, 0] > v[0] and S[2, 0] > S[1, 0] and np.allclose(S.sum(1), 1.0)
    assert ((S == 0) | (S >= 0.02)).all()  # a cluster below the minimum weight leaves
    plain = component_pool(SimpleNamespace(search=SearchConfig(min_weight=0.02, reuse_sharpen=0.0)), space, v, [3], 500, seed=0)
    sharp = component_pool(SimpleNamespace(search=SearchConfig(min_weight=0.02, reuse_sharpen=4.0)), space, v, [3],
                           500, seed=0)
    np.testing.assert_allclose(sharp[0], v)
    np.testing.assert_allclose(sharp[1:4], sharpened(v, np.geomspace(1, 4, 4)[1:], 0.02))  # alone, after v
    assert satisfied(sharp, space["bounds"]).all()
    share = sharp[:, :3] / sharp[:, :3].sum(1, keepdims=True)
    assert share[:, 0].max() > v[0] / v[:3].sum() + 0.1  # some rows lean on cluster 0 more than v does
    assert share[:, 0].min() >= v[0] / v[:3].sum() - 1e-6  # none less: sharpening only
    plain_share = plain[:, :3] / plain[:, :3].sum(1, keepdims=True)
    np.testing.assert_allclose(plain_share[:, 0], v[0] / v[:3].sum(), atol=1e-6)
    with pytest.raises(Exception, match="reuse_sharpen"):
        from climb.config import load_config
        load_config(None, ["search.reuse_sharpen=0.5"])


def test_a_removed_shard_renormalises_the_component_and_trains_no_search_proxy(runs):
    from climb.optimize.bounds import satisfied
    from climb.stages.search.common import run_space
    from climb.stages.search.reuse import sentence
    (_, v1), (cfg2, v2) = runs["v1"], runs["v2"]
    stats = runs["v2_stats"]
    assert stats["reuse"] == {"mode": "virtual", "new_clusters": [], "proxies": 0}
    assert _records(v2) == [] and not list(v2.search.dir.glob("plan_*.json"))
    assert stats["proxies"] == 0 and stats["replicate_proxies"] == 0
    assert runs["v2_calls"] == stats["comparison_proxies"] == 3 * cfg2.search.eval_seeds  # the comparison alone
    rep = json.loads(v2.search.reuse.read_text())
    plan = json.loads(v2.search.reuse_plan.read_text())
    # v1's pick over its clusters, the space cluster gone with its shard and the rest renormalised.
    old = np.array(json.loads(v1.search.mixture.read_text())["weights"])
    was, now = _labels(v1), _labels(v2)
    gone = next(c for c, name in was.items() if name == "space")
    want = np.array([old[next(c for c, n in was.items() if n == now[j])] for j in range(3)]) / (1 - old[gone])
    read = np.array(plan["from_documents"])
    assert read.sum() == pytest.approx(1.0)
    np.testing.assert_allclose(read, want, atol=1e-9)
    assert rep["removed_share"] == pytest.approx(old[gone]) and rep["lost_clusters"] == [gone]
    assert rep["matched_docs"] == 90 and rep["mode"] == "virtual" and rep["earlier_clusters"] == 4
    # The pick is the component inside this run's bounds: the bound moved it, and it holds every one.
    mix = json.loads(v2.search.mixture.read_text())
    w = np.array(mix["weights"])
    np.testing.assert_allclose(w, rep["component"], atol=1e-12)
    top, bound = runs["top"], cfg2.search.bounds[f"cluster:{runs['top']}"][1]
    assert w[top] == pytest.approx(bound) and read[top] > bound + 0.05
    assert satisfied(w[None], run_space(cfg2, v2)["bounds"])[0] and w.sum() == pytest.approx(1.0)
    assert mix["predicted"] is None and mix["best_seen"] is None
    q = json.loads(v2.search.quality.read_text())
    assert q["reuse"]["mode"] == "virtual" and q["reuse"]["proxies"] == 0
    assert "no cluster is new" in sentence(q["reuse"]) and q["paired_sd"] is not None
    assert {k.split("/")[0] for k in json.loads(v2.search.comparison.read_text())} == {"climb", "uniform", "natural"}


# ----------------------------------------------------------------- a source added: a new cluster
@pytest.mark.parametrize("sharpen", [0.0, 4.0], ids=["as found", "sharpened (default)"])
@pytest.mark.parametrize("landscape", ["good", "useless"])
def test_an_added_source_searches_the_component_and_its_new_cluster_alone(runs, tmp_path, landscape, sharpen):
    from climb.optimize.bounds import satisfied
    from climb.stages import search
    from climb.stages.search.common import run_space
    from climb.stages.search.virtual import earlier_component, sharpened
    cfg, paths = _copy(runs, "v3", tmp_path / "v3", reuse_sharpen=sharpen)
    comp = earlier_component(cfg, paths, runs["v2"][1])
    v, new = np.array(comp["weights"]), comp["new_clusters"]
    assert [_labels(paths)[j] for j in new] == ["space"] and v.sum() == pytest.approx(1.0)
    assert comp["removed_share"] == 0 and comp["lost_clusters"] == [] and comp["matched_docs"] == 90
    j = new[0]
    # Planted: the best mixture is half the component, half the new cluster; or the component itself.
    WORLD.update(scale=2.0, centre=0.5 * v + 0.5 * np.eye(len(v))[j] if landscape == "good" else v)
    stats = search.run(cfg, paths)
    recs = _records(paths)
    # Only the component pool's proxies: the last two iterations (6 then 4), the first starting with v.
    assert len(recs) == sum(ITERATIONS[-2:]) == stats["reuse"]["proxies"]
    assert sorted({r["iteration"] for r in recs}) == [1, 2]
    assert WORLD["calls"] == len(recs) + stats["replicate_proxies"] + stats["comparison_proxies"]
    first = {r["mixture_id"]: r for r in recs}["it1-000"]
    np.testing.assert_allclose(first["weights"], v, atol=1e-12)
    rest = [i for i in range(len(v)) if i != j]
    top, gammas = np.argsort(-v)[:2], []  # v's two heaviest clusters, both old
    for r in recs:  # a_0 v + a_j e_j: the old clusters in v's proportions, or in those of v^gamma (sharpened)
        w = np.array(r["weights"])
        p = w[rest] / w[rest].sum()
        gamma = 1.0 if not sharpen else np.log(w[top[0]] / w[top[1]]) / np.log(v[top[0]] / v[top[1]])
        assert 1.0 - 1e-9 <= gamma <= max(sharpen, 1.0) + 1e-9
        gammas.append(gamma)
        want = sharpened(v, [gamma], cfg.search.min_weight)[0]
        np.testing.assert_allclose(p, want[rest] / want[rest].sum(), atol=1e-9)
    assert (max(gammas) > 1.5) == bool(sharpen)  # the sharpened component alone is measured in the first round
    w = np.array(json.loads(paths.search.mixture.read_text())["weights"])
    assert satisfied(w[None], run_space(cfg, paths)["bounds"] or _caps(cfg, paths))[0]
    if landscape == "good":
        assert w[j] > 0.3, w
    else:
        assert w[j] - v[j] < 0.15 and np.abs(w - v).sum() < 0.3, (w, v)
    rep = json.loads(paths.search.reuse.read_text())
    assert rep["mode"] == "virtual" and rep["new_clusters"] == new and rep["iterations_run"] == [2, 3]
    q = json.loads(paths.search.quality.read_text())
    assert q["reuse"]["proxies"] == len(recs) and q["swarm_sd"] is not None  # v3's first round is a drawn swarm
    assert f"new cluster {j}: the search ran iterations 2, 3" in _sentence(q)


def _caps(cfg, paths):
    from climb.optimize.bounds import from_config
    from climb.stages.search.common import run_space
    return from_config({}, run_space(cfg, paths), cfg.search.min_weight)


def _sentence(q) -> str:
    from climb.stages.search.reuse import sentence
    return sentence(q["reuse"])


# ----------------------------------------------------------------- refusals, before any proxy
@pytest.mark.parametrize("change,said", [
    (["--set", "proxy.n_layer=3"], r"its proxies were \d+ layers x \d+, this run's are 3 x \d+; reuse needs the same"),
    ("tokenizer", r"tokenizer \(tokenize/tokenizer.json\) holds other tokens.*name its .*tokenizer.json in "
                  r"proxy.tokenizer"),
    ("target", r"its target files hold other content than this run's; reuse needs the same target"),
], ids=["proxy size", "tokenizer", "target files"])
def test_a_refit_across_another_proxy_tokenizer_or_target_is_refused_in_one_line(runs, tmp_path, capsys, change,
                                                                                 said):
    from climb.cli import main
    from climb.config import to_toml
    cfg, paths = _copy(runs, "v3", tmp_path / "v3")
    if change == "tokenizer":  # trained again on other documents
        cfg, change = replace(cfg, proxy=replace(cfg.proxy, tokenizer="", tokenizer_docs=30)), []
    elif change == "target":
        other = tmp_path / "target.jsonl"
        other.write_text(json.dumps({"text": "other held-out words"}) + "\n")
        cfg, change = replace(cfg, target=replace(cfg.target, texts=(str(other),))), []
    config = tmp_path / "v3.toml"
    config.write_text(to_toml(cfg))
    before = {f.name: f.read_bytes() for f in paths.search.dir.iterdir()}  # v2's search, copied with the folder
    rc = main(["search", "--config", str(config), "--run", str(paths.root), *change])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2
    assert re.search(said, err[-1]) and err[-1].count("search.reuse") == 1, err
    assert WORLD["calls"] == 0 and {f.name: f.read_bytes() for f in paths.search.dir.iterdir()} == before


# ----------------------------------------------------------------- keys, resume
def test_the_key_holds_the_earlier_search_the_component_is_read_from(runs, tmp_path):
    from climb.stages.search import key
    cfg, paths = runs["v3"]
    here = key(cfg, paths)
    moved = tmp_path / "v2-moved"
    shutil.copytree(runs["v2"][1].root, moved)
    assert key(replace(cfg, search=replace(cfg.search, reuse=str(moved))), paths) == here  # where it lies: no matter
    manifest = moved / "search" / "manifest.json"
    m = json.loads(manifest.read_text())
    manifest.write_text(json.dumps({**m, "key": "other inputs"}))  # its clusters or token store were others
    assert key(replace(cfg, search=replace(cfg.search, reuse=str(moved))), paths) != here


def test_a_killed_search_over_the_component_resumes_to_the_same_answer(runs, tmp_path):
    from climb.stages import search
    cfg, ref = _copy(runs, "v3", tmp_path / "ref")
    search.run(cfg, ref)
    want = _outputs(ref)
    cfg, paths = _copy(runs, "v3", tmp_path / "killed")
    shutil.copytree(ref.search.dir, paths.search.dir, dirs_exist_ok=True)
    lines = paths.search.results.read_text().splitlines()
    for f in paths.search.dir.iterdir():  # what a kill in the first round leaves: the log so far, the plans made
        if f.name not in ("results.jsonl", "stage_state.json", "reuse_plan.json", "plan_1.json"):
            shutil.rmtree(f) if f.is_dir() else f.unlink()
    paths.search.results.write_text("".join(x + "\n" for x in lines[:3]))
    WORLD["calls"] = 0
    search.run(cfg, paths)
    assert WORLD["calls"] > 0
    got = _outputs(paths)
    assert sorted(got) == sorted(want)
    for f in want:
        assert got[f] == want[f], f"{f} differs after a kill"


def test_the_report_says_the_component_was_taken(runs, tmp_path):
    from climb.stages import report
    cfg, paths = _copy(runs, "v2", tmp_path / "v2")
    report.run(cfg, paths)
    page = paths.report.page.read_text()
    assert "no cluster is new, so no search proxy trained" in page
