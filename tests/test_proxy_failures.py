"""Proxies that hang, fail or report garbage (findings 3 and 4 of the robustness issue).

- A real `climb search` process whose trainer hangs: `proxy.timeout_s` kills the
  trainer with its process group and records a failure; SIGTERM to climb while
  another trainer is running stops it too, removes its temporary folder, leaves
  a resumable folder and says so in one line. The resumed run trains the failed
  proxy again and nothing that succeeded.
- The built-in trainer stops at its deadline, alone or stacked.
- Every proxy failing stops the search with one line quoting the first failure;
  after the trainer is fixed the rerun trains them again.
- A null or NaN metric is a failure record in strict JSON, not an aborted run.
"""
from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from climb import pipeline

from climb.runtime import proxy_runs

from climb.stages import search, tokenize
from climb.cli import main
from climb.runtime.runlock import INFO_NAME
from scripted_run import alive, cli, notes, prepare, script


def _wait(cond, what: str, timeout: float = 90.0) -> None:
    end = time.time() + timeout
    while not cond():
        assert time.time() < end, f"timed out waiting for {what}"
        time.sleep(0.05)


def _calls(control) -> Counter:
    return Counter(n["mixture_id"] for n in notes(control))


def test_timeout_and_sigterm_kill_trainers_and_leave_a_resumable_run(tmp_path, monkeypatch):
    cfg, paths, config_file, control = prepare(tmp_path, monkeypatch, "proxy.timeout_s=4")
    script(control, "ok", modes={"it0-001": "hang", "it0-003": "gate"})
    proc = cli(config_file, paths.root)
    try:
        _wait(lambda: any(n.get("mode") == "gate" for n in notes(control)) or proc.poll() is not None,
              "the fourth proxy to start")
        proc.send_signal(signal.SIGTERM)  # while the fourth trainer runs (well inside its 4 s)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 128 + signal.SIGTERM, err
    lines = [x for x in err.splitlines() if x.strip()]
    assert "Traceback" not in err
    assert lines[-1].startswith("climb: stopped by SIGTERM") and "again to resume" in lines[-1]
    for n in notes(control):
        if n["mode"] in ("hang", "gate"):  # the trainer, its child and its temporary folder are gone
            assert not alive(n["pid"]) and not alive(n["child"])
            assert not Path(n["weights"]).parent.exists()
    recs = {r["mixture_id"]: r for r in search.read_results(paths)}
    assert sorted(recs) == ["it0-000", "it0-001", "it0-002"]
    assert recs["it0-001"]["status"] == "failed" and "timed out after 4s" in recs["it0-001"]["error"]
    assert not (paths.root / INFO_NAME).exists()  # the lock was released
    # Resume (with the trainer fixed): the timed-out and the interrupted proxies are trained, nothing else.
    script(control, "ok")
    pipeline.run_stage("search", cfg, paths.root)
    recs = search.read_results(paths)
    assert len(recs) == 6 and all(r["status"] == "ok" for r in recs)
    calls = _calls(control)
    assert calls["it0-000"] == calls["it0-002"] == 1 and calls["it0-001"] == 2 and calls["it0-003"] == 2


def test_interrupt_kills_the_trainer_group(tmp_path, monkeypatch):
    marker = tmp_path / "child.pid"
    real = subprocess.Popen.communicate

    def interrupted(self, *a, **kw):  # Ctrl-C arrives while the trainer runs
        # The shell creates the file before `echo` writes the pid into it: wait for the pid itself.
        _wait(lambda: marker.exists() and marker.read_text().strip(), "the trainer's child")
        raise KeyboardInterrupt
    monkeypatch.setattr(subprocess.Popen, "communicate", interrupted)
    with pytest.raises(KeyboardInterrupt):
        proxy_runs.run_command(f"sleep 600 & echo $! > {marker}; wait", timeout_s=0)
    monkeypatch.setattr(subprocess.Popen, "communicate", real)
    child = int(marker.read_text())
    _wait(lambda: not alive(child), "the trainer's child to die", timeout=10)


def _builtin_tasks(cfg, paths, n: int, timeout_s: float):
    tokenize.run(cfg, paths)
    pc = dataclasses.replace(cfg.proxy, command="", n_layer=1, n_embd=32, steps=50_000, batch_size=4,
                             warmup_steps=2, device="cpu", timeout_s=timeout_s, swarm="stacked")
    k = len(json.loads((paths.tokenize.store / "index.json").read_text())["tokens"])
    run = dataclasses.replace(cfg, proxy=pc)
    return [search.proxy_task(run, paths, f"b{j}", 0, np.full(k, 1 / k), seed=j) for j in range(n)]


def test_builtin_trainer_stops_at_its_deadline(tmp_path, monkeypatch):
    cfg, paths, _, _ = prepare(tmp_path, monkeypatch)
    t0 = time.time()
    rec = proxy_runs.train_and_score(_builtin_tasks(cfg, paths, 1, 0.5)[0])
    assert rec["status"] == "failed" and "TrainingTimeout" in rec["error"]
    recs = proxy_runs.train_and_score_group(_builtin_tasks(cfg, paths, 2, 0.5))  # 2 x 0.5 s for the stacked pair
    assert [r["status"] for r in recs] == ["failed", "failed"] and all("TrainingTimeout" in r["error"] for r in recs)
    assert time.time() - t0 < 30  # 50,000 steps would take minutes


def _search_args(config_file, paths):
    return ["search", "--config", str(config_file), "--run", str(paths.root)]


def test_all_failing_stops_with_one_line_and_a_fixed_trainer_is_retried(tmp_path, monkeypatch, capsys):
    cfg, paths, config_file, control = prepare(tmp_path, monkeypatch)
    script(control, "fail")
    capsys.readouterr()
    assert main(_search_args(config_file, paths)) == 2
    full = capsys.readouterr().err
    err = full.strip().splitlines()[-1]  # above it: progress bars and log lines, no traceback
    assert "Traceback" not in full and full.count("climb: error") == 1
    assert err.startswith("climb: error: only 0 of 4 proxies succeeded")
    assert "it0-000" in err and "CUDA error: out of memory" in err and "run the same command again" in err
    assert sum(_calls(control).values()) == 4  # stopped after the first iteration
    script(control, "ok")
    assert main(_search_args(config_file, paths)) == 0
    recs = search.read_results(paths)
    assert len(recs) == 6 and all(r["status"] == "ok" for r in recs)
    stats = json.loads(paths.manifest("search").read_text())["stats"]
    assert stats["proxies"] == 6 and stats["failed"] == 0
    assert all(_calls(control)[f"it0-00{j}"] == 2 for j in range(4))  # each failed proxy trained again


def test_null_and_nan_metrics_are_failure_records(tmp_path, monkeypatch):
    cfg, paths, _, control = prepare(tmp_path, monkeypatch, "search.retry_failed=false")
    script(control, "ok", modes={"it0-001": "null", "it0-002": "nan"})
    pipeline.run_stage("search", cfg, paths.root)  # no abort

    def refuse(name):
        raise ValueError(name)
    lines = (paths.root / "search" / "results.jsonl").read_text().splitlines()
    recs = {r["mixture_id"]: r for r in (json.loads(x, parse_constant=refuse) for x in lines)}
    for mid in ("it0-001", "it0-002"):
        assert recs[mid]["status"] == "failed" and recs[mid]["objective"] is None
        assert recs[mid]["metrics"] == {"loss": None} and "NaN, infinite or null" in recs[mid]["error"]
    assert sum(r["status"] == "ok" for r in recs.values()) == 4
    # retry_failed=false: a resumed search keeps the failure records (and the key is the same).
    paths.manifest("search").unlink()
    before = sum(_calls(control).values())
    pipeline.run_stage("search", dataclasses.replace(cfg, search=dataclasses.replace(cfg.search, retry_failed=False)),
                       paths.root)
    assert sum(_calls(control).values()) == before
