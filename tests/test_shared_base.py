"""A search whose proxies continue a shared base (search.base): the base is trained once and
reused by every search proxy and replicate, survives a kill, is retrained when its settings
change, and the compute account adds up with it."""
from __future__ import annotations

import dataclasses
import json

import pytest

from climb.config import ConfigError, load_config
from climb.runtime import proxy_runs
from climb.stages import search, tokenize
from climb.stages.search import cheap as search_cheap
from climb.stages.search import common as search_common
from climb.stages.search.common import mixture_space
from climb.stages.search.summary import compute_account
from climb.stages.tokenize import cluster_tokens
from scripted_run import prepare
from test_cheaper_search import _builtin_cfg

STEPS, BASE = 24, 0.5


def _cfg(tmp_path, monkeypatch, **search_settings):
    cfg, paths, _, _ = prepare(tmp_path, monkeypatch, "search.iterations=[4, 2]", "search.replicates=1",
                               "search.replicate_seeds=1", "executor.processes=1")
    cfg = _builtin_cfg(cfg, tmp_path)
    cfg = dataclasses.replace(cfg, search=dataclasses.replace(cfg.search, base=BASE, **search_settings))
    tokenize.run(cfg, paths)
    return cfg, paths


def _counting(monkeypatch):
    """Record the mixture id of every proxy trained (in this process: executor.processes=1)."""
    calls = []
    real = proxy_runs.train_and_score

    def counted(task):
        calls.append(task.mixture_id)
        return real(task)
    for mod in (search_common, search_cheap):
        monkeypatch.setattr(mod, "train_and_score", counted)
    return calls


def test_search_proxies_continue_one_base_and_the_account_adds_up(tmp_path, monkeypatch):
    cfg, paths = _cfg(tmp_path, monkeypatch)
    calls = _counting(monkeypatch)
    search.run(cfg, paths)
    assert calls.count("base") == 1
    full = STEPS * 4 * cfg.proxy.seq_len
    base = json.loads(paths.search.base.read_text())["base"]
    assert base["status"] == "ok" and base["tokens"] == full // 2 and base["weights"] == pytest.approx(
        mixture_space(cfg, cluster_tokens(paths))["natural"].tolist())
    recs = search.read_results(paths)
    reps = list(json.loads(paths.search.replicates.read_text()).values())
    assert len(recs) == 6 and len(reps) == 1
    for r in recs + reps:  # every search proxy and replicate continued the base: half a proxy each
        assert r["status"] == "ok" and r["base_steps"] == STEPS // 2 and r["tokens"] == full // 2
        assert r["curve"]["step"][-1] == STEPS  # the whole run's curve, the base's part included
    comp = json.loads(paths.search.comparison.read_text()).values()
    assert all("base_steps" not in r and r["tokens"] == full for r in comp)  # the comparison trains from scratch
    by = compute_account(paths)["by_purpose"]
    assert by["base"]["proxies"] == 1 and by["base"]["tokens"] == full // 2
    assert by["search"]["tokens"] == 6 * full // 2 and by["replicates"]["tokens"] == full // 2
    total = compute_account(paths)["total"]
    assert total["tokens"] == sum(v["tokens"] for v in by.values())
    assert total["token_params"] == sum(v["token_params"] for v in by.values())


def test_the_base_survives_a_kill_and_is_retrained_when_its_settings_change(tmp_path, monkeypatch):
    cfg, paths = _cfg(tmp_path, monkeypatch)
    calls = _counting(monkeypatch)
    real = search_common.train_and_score

    class Killed(BaseException):
        pass

    def dies_after_the_base(task):
        if task.mixture_id != "base" and len(calls) >= 3:
            raise Killed()
        return real(task)
    monkeypatch.setattr(search_common, "train_and_score", dies_after_the_base)
    with pytest.raises(Killed):
        search.run(cfg, paths)
    assert calls.count("base") == 1 and paths.search.base_checkpoint.exists()
    stamp = paths.search.base_checkpoint.stat().st_mtime_ns
    calls.clear()
    monkeypatch.setattr(search_common, "train_and_score", real)
    search.run(cfg, paths)
    assert "base" not in calls and paths.search.base_checkpoint.stat().st_mtime_ns == stamp
    assert len(search.read_results(paths)) == 6
    # Another learning rate is another base: trained again, and keyed anew.
    key = json.loads(paths.search.base.read_text())["key"]
    other = dataclasses.replace(cfg, proxy=dataclasses.replace(cfg.proxy, lr=cfg.proxy.lr / 2))
    space = mixture_space(other, cluster_tokens(paths))
    calls.clear()
    from climb.runtime.executor import make_executor
    with make_executor(other.executor, processes=1) as ex:
        search_cheap.shared_base(other, paths, ex, space)
        assert calls == ["base"] and json.loads(paths.search.base.read_text())["key"] != key
        calls.clear()
        search_cheap.shared_base(other, paths, ex, space)  # and kept, once it is there
        assert calls == []


def test_base_settings_are_checked():
    with pytest.raises(ConfigError, match="search.base"):
        load_config(None, ["search.base=1.0"])
    with pytest.raises(ConfigError, match="search.merge"):
        load_config(None, ["search.merge=true"])
    with pytest.raises(ConfigError, match="does not combine"):
        load_config(None, ["search.base=0.5", "search.experts=0.25"])
    with pytest.raises(ConfigError, match="proxy.lookup"):
        load_config(None, ["search.base=0.5", 'proxy.lookup="m.csv"', 'proxy.lookup_weights="w.csv"'])


def test_a_search_on_merged_models_of_the_base(tmp_path, monkeypatch):
    """search.merge: the base continued on each cluster alone; a mixture's feature is the merged
    model's objective, equal to a direct computation; the scoring is charged to the account."""
    import numpy as np
    import torch

    from climb.runtime.merged import MergedFeature
    from climb.runtime.proxy_runs import tokenizer_of
    from climb.runtime.targets import load_target, objective_logprobs
    from proxies.merge import merge_weights
    from proxies.model import GPT
    cfg, paths = _cfg(tmp_path, monkeypatch, merge=True, merge_pool=64, merge_tokens=10**6)
    stats = search.run(cfg, paths)
    merge = json.loads(paths.search.merge.read_text())
    k = stats["clusters"]
    full = STEPS * 4 * cfg.proxy.seq_len
    conts = {m: r for m, r in merge.items() if m != "merge-scoring"}
    assert len(conts) == k == stats["merge_proxies"]
    assert all(r["base_steps"] == STEPS // 2 and r["tokens"] == full // 2 and max(r["weights"]) == 1.0
               for r in conts.values())
    scoring = merge["merge-scoring"]
    assert scoring["mixtures_scored"] > 0 and scoring["tokens"] == scoring["forward_tokens"] // 3
    by = compute_account(paths)["by_purpose"]
    assert by["merge"]["proxies"] == k and by["merge"]["tokens"] == k * full // 2 + scoring["tokens"]
    q = json.loads(paths.search.quality.read_text())
    assert len(q["merge_spearman"]) == 2
    # With the whole target as the sample, a one-hot mixture's feature is that continuation's own
    # objective, and any mixture's is the objective of the averaged weights.
    tok = tokenizer_of(paths.tokenize.dir)
    files = [str(paths.search.merge_model(c)) for c in range(k)]
    feature = MergedFeature(files, cfg.proxy, cfg.target, tok, paths.root, max_tokens=10**6)
    assert feature.sample_tokens > 0
    for c in range(k):
        assert feature(np.eye(k)[c][None])[0] == pytest.approx(conts[f"merge-{c:03d}"]["objective"], rel=1e-5)
    w = np.full(k, 1 / k)
    model = GPT(cfg.proxy.model_config(tok.vocab_size))
    model.load_state_dict(merge_weights([torch.load(f, weights_only=True) for f in files], w))
    logp, coef = objective_logprobs(model, tok, cfg.target, load_target(cfg.target, paths.root), "cpu")
    assert feature(w[None])[0] == pytest.approx(-(coef * logp).sum(), rel=1e-5)


def test_the_target_sample_is_fixed_and_sized():
    from climb.runtime.merged import target_sample

    class Tok:
        def encode_batch(self, texts):
            return [t.split() for t in texts]
    target = {"texts": [f"w{i} " * 10 for i in range(50)],
              "tasks": {"t": [{"context": "a b c", "continuation": " d e"} for _ in range(40)]}}
    s1, n1 = target_sample(target, Tok(), 100, seed=3)
    s2, n2 = target_sample(target, Tok(), 100, seed=3)
    assert s1 == s2 and n1 == n2
    assert 5 <= len(s1["texts"]) <= 6 and 10 <= len(s1["tasks"]["t"]) <= 11  # 50 tokens each part
    assert target_sample(target, Tok(), 1, seed=3)[0]["texts"]  # at least one of each


def test_stacked_proxies_continue_the_base_as_one_by_one_do(tmp_path, monkeypatch):
    """The GPU's path: search proxies stacked into one model continue the base as the
    one-by-one path does (the same records, to float tolerance)."""
    cfg, paths = _cfg(tmp_path, monkeypatch)
    search.run(cfg, paths)
    single = {r["mixture_id"]: r for r in search.read_results(paths)}
    stacked_cfg = dataclasses.replace(cfg, proxy=dataclasses.replace(cfg.proxy, swarm="stacked", swarm_size=4))
    other = tmp_path / "stacked"
    import shutil
    shutil.copytree(paths.root, other, copy_function=shutil.copy2, ignore=shutil.ignore_patterns("search"))
    from climb.runtime.layout import RunPaths
    opaths = RunPaths(other)
    search.run(stacked_cfg, opaths)
    stacked = {r["mixture_id"]: r for r in search.read_results(opaths)}
    assert stacked.keys() == single.keys()
    assert any(r.get("stacked") for r in stacked.values())
    for m, r in stacked.items():
        assert r["base_steps"] == single[m]["base_steps"] and r["tokens"] == single[m]["tokens"]
        assert r["objective"] == pytest.approx(single[m]["objective"], rel=1e-3)
