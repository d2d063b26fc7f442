"""How the search groups proxies into stacked models, and the fallback when stacking fails."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from climb.runtime import proxy_runs

from climb.stages.search import common as search_common
from climb.config import ProxyConfig, load_config


def test_swarm_size_policy(monkeypatch):
    monkeypatch.setattr(proxy_runs, "resolve_device", lambda pref: "cpu")
    assert proxy_runs.stack_size(ProxyConfig(n_embd=64)) == 1           # one by one on a CPU by default
    assert proxy_runs.stack_size(ProxyConfig(n_embd=64, swarm="stacked")) == 8
    assert proxy_runs.stack_size(ProxyConfig(n_embd=256, swarm="stacked", swarm_size=3)) == 3
    assert proxy_runs.stack_size(ProxyConfig(n_embd=64, swarm="single")) == 1
    assert proxy_runs.stack_size(ProxyConfig(n_embd=64, command="train {weights} {out}")) == 1
    monkeypatch.setattr(proxy_runs, "resolve_device", lambda pref: "cuda")
    assert proxy_runs.stack_size(ProxyConfig(n_embd=768)) == 64


class _Ex:
    def __init__(self, slots):
        self.n, self.groups = slots, []

    def slots(self, resources=None):
        return self.n

    def map(self, fn, tasks, desc="", resources=None, on_result=None, parallel=False):
        out = []
        for i, t in enumerate(tasks):
            self.groups.append(len(t) if isinstance(t, list) else 1)
            r = fn(t)
            on_result(i, r)
            out.append(r)
        return out


@pytest.mark.parametrize("slots,groups", [(1, [8, 8, 4]), (2, [8, 8, 4]), (4, [5, 5, 5, 5]), (40, [1] * 20)])
def test_run_proxies_groups_and_keeps_order(monkeypatch, slots, groups):
    monkeypatch.setattr(search_common, "stack_size", lambda pc: 8)
    monkeypatch.setattr(search_common, "train_and_score_group", lambda ts: [{"mixture_id": t["mixture_id"]} for t in ts])
    cfg = load_config(None, [])
    tasks = [{"mixture_id": f"m{i}"} for i in range(20)]
    seen = {}
    ex = _Ex(slots)
    out = search_common.run_proxies(cfg, ex, tasks, "t", lambda i, rec: seen.__setitem__(i, rec["mixture_id"]))
    assert ex.groups == groups
    assert [r["mixture_id"] for r in out] == [t["mixture_id"] for t in tasks]
    assert seen == {i: f"m{i}" for i in range(20)}


def test_group_falls_back_to_one_by_one(monkeypatch):
    calls = []

    def boom(tasks):
        raise RuntimeError("CUDA out of memory")
    monkeypatch.setattr(proxy_runs, "_builtin_stacked", boom)
    monkeypatch.setattr(proxy_runs, "train_and_score", lambda t: calls.append(t["mixture_id"]) or {"ok": t["mixture_id"]})
    recs = proxy_runs.train_and_score_group([{"mixture_id": "a"}, {"mixture_id": "b"}])
    assert calls == ["a", "b"] and recs == [{"ok": "a"}, {"ok": "b"}]


def test_builtin_trainer_takes_the_proxy_configs_builders():
    pc = ProxyConfig(n_layer=3, n_head=4, n_embd=96, seq_len=64, tie_embeddings=False, steps=50, batch_size=8,
                     lr=1e-3, warmup_steps=5, schedule="wsd", min_lr_ratio=0.2, average_last=0.25, precision="fp32")
    mcfg, tcfg = proxy_runs.proxy_configs(pc, SimpleNamespace(vocab_size=320))
    assert mcfg == pc.model_config(320)
    assert tcfg == pc.train_config(log_every=10**9)  # per-step logging off: a proxy logs one line when done
