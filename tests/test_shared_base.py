"""A search whose proxies continue a shared base (search.base): the base is trained once and
reused by every search proxy and replicate, survives a kill, is retrained when its settings
change, and the compute account adds up with it."""
from __future__ import annotations

import dataclasses
import json

import pytest

from climb.config import ConfigError, load_config
from climb.runtime import proxy_runs
from climb.stages import search, search_cheap, search_common, tokenization
from climb.stages.search_common import mixture_space
from climb.stages.summary import compute_account
from climb.stages.tokenization import cluster_tokens
from scripted_run import prepare
from test_cheaper_search import _builtin_cfg

STEPS, BASE = 24, 0.5


def _cfg(tmp_path, monkeypatch, **search_settings):
    cfg, paths, _, _ = prepare(tmp_path, monkeypatch, "search.iterations=[4, 2]", "search.replicates=1",
                               "search.replicate_seeds=1", "executor.processes=1")
    cfg = _builtin_cfg(cfg, tmp_path)
    cfg = dataclasses.replace(cfg, search=dataclasses.replace(cfg.search, base=BASE, **search_settings))
    tokenization.run(cfg, paths)
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
