"""Each proxy's learning curve in its record (proxy.curve_points, proxy.curve_evals), its parameter
count, and the run's proxy-compute account (summary.json "compute")."""
from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from climb import pipeline
from climb.runtime import proxy_runs
from climb.stages import search, tokenize
from climb.stages.search.summary import compute_account
from proxies.train import curve_steps, loss_curve
from scripted_run import prepare


def test_curve_steps_and_interval_means():
    assert curve_steps(300, 8) == [38, 75, 112, 150, 188, 225, 262, 300]
    assert curve_steps(5, 8) == [1, 2, 3, 4, 5] and curve_steps(10, 0) == []
    c = loss_curve([4.0, 3.0, 2.0, 1.0, 1.0, 0.0], tokens_per_step=10, points=3)
    assert c == {"step": [2, 4, 6], "tokens": [20, 40, 60], "train_loss": [3.5, 1.5, 0.5]}
    assert proxy_runs.eval_steps(300, 8, 3) == [75, 150, 225]  # the points nearest 1/4, 1/2, 3/4
    assert proxy_runs.eval_steps(300, 8, 0) == [] and proxy_runs.eval_steps(300, 1, 3) == []


def _builtin(cfg, paths, **proxy):
    tokenize.run(cfg, paths)
    pc = dataclasses.replace(cfg.proxy, command="", n_layer=1, n_embd=32, steps=24, batch_size=4,
                             warmup_steps=2, device="cpu", **proxy)
    shard = sorted(cfg.corpus.paths)[0].replace("*.parquet", "part-00000.parquet")
    tc = dataclasses.replace(cfg.target, texts=(shard,), objective=("bpb",))
    k = json.loads((paths.tokenize.store / "index.json").read_text())["n_clusters"]
    run = dataclasses.replace(cfg, proxy=pc, target=tc)
    return search.proxy_task(run, paths, "c0", 0, np.arange(1, k + 1) / (k * (k + 1) / 2), seed=3)


def test_a_builtin_proxy_records_its_curve_and_scoring_during_training_changes_nothing(tmp_path, monkeypatch):
    cfg, paths, _, _ = prepare(tmp_path, monkeypatch)
    plain = proxy_runs.train_and_score(_builtin(cfg, paths, curve_points=6))
    scored = proxy_runs.train_and_score(_builtin(cfg, paths, curve_points=6, curve_evals=2))
    assert plain["status"] == scored["status"] == "ok"
    # Scoring the target during training leaves the training, and so the final metrics, as they were.
    assert plain["metrics"] == scored["metrics"] and plain["params"] == scored["params"] > 1000
    c, s = plain["curve"], scored["curve"]
    assert c["step"] == s["step"] == [4, 8, 12, 16, 20, 24] and c["train_loss"] == s["train_loss"]
    assert c["tokens"] == [st * 4 * cfg.proxy.seq_len for st in c["step"]] and c["tokens"][-1] == plain["tokens"]
    assert "bpb" not in c  # curve_evals = 0: the training loss only
    assert s["bpb"][-1] == scored["metrics"]["bpb"]
    mid = [v for v, st in zip(s["bpb"], s["step"]) if st in (8, 12, 16)]
    assert [st for st, v in zip(s["step"][:-1], s["bpb"][:-1]) if v is not None] == [8, 16]
    assert all(v is None or v > scored["metrics"]["bpb"] for v in mid)  # the target improves with training
    assert c["train_loss"][0] > c["train_loss"][-1]


def test_an_external_trainers_curve_and_params_are_kept_when_well_formed(caplog):
    good = {"metrics": {"loss": 1.0}, "params": 1234, "curve": {"step": [1, 2], "loss": [2.0, 1.0]}}
    assert proxy_runs.external_extra(good) == {"params": 1234, "curve": {"step": [1, 2], "loss": [2.0, 1.0]}}
    bad = {"params": True, "curve": {"step": [1, 2], "loss": [2.0]}}
    assert proxy_runs.external_extra(bad) == {} and "left out of the record" in caplog.text


def test_the_compute_account_adds_up(tmp_path, monkeypatch):
    cfg, paths, _, control = prepare(tmp_path, monkeypatch, "search.replicates=2", "search.replicate_seeds=1")
    pipeline.run_stage("report", cfg, paths.root)
    acct = compute_account(paths)
    by = acct["by_purpose"]
    recs = {"search": search.read_results(paths),
            "replicates": list(json.loads(paths.search.replicates.read_text()).values()),
            "comparison": list(json.loads(paths.search.comparison.read_text()).values())}
    assert sorted(by) == sorted(recs)
    for purpose, rs in recs.items():
        assert by[purpose]["proxies"] == len(rs) > 0
        assert by[purpose]["tokens"] == sum(r["tokens"] for r in rs)
        assert by[purpose]["seconds"] == pytest.approx(sum(r["seconds"] for r in rs), abs=0.1)
    for k in ("proxies", "tokens"):
        assert acct["total"][k] == sum(v[k] for v in by.values())
    # The scripted trainer reports no parameter count: tokens x parameters is unknown, not 0.
    assert acct["total"]["token_params"] is None
    summary = json.loads(paths.report.summary.read_text())
    assert summary["compute"] == acct
    page = paths.report.page.read_text()
    assert "## Proxy compute" in page and f"| **total** | {acct['total']['proxies']} |" in page
    assert summary["proxies_trained"] == acct["total"]["proxies"]
