"""One process per run folder (finding 1 of the robustness issue).

Two `climb` processes on one folder used to double the token store or write
every result twice. Here a real second process is refused with one line naming
the first; the first is then SIGKILLed mid-proxy, and the next run takes its
lock over and finishes with every result once.
"""
from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from climb import pipeline

from climb.stages import search
from climb.runtime.runlock import INFO_NAME, RunLocked, hold
from scripted_run import alive, cli, env, notes, prepare, script


def _wait(cond, what: str, timeout: float = 90.0) -> None:
    end = time.time() + timeout
    while not cond():
        assert time.time() < end, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_second_process_refused_and_dead_holder_taken_over(tmp_path, monkeypatch, caplog):
    cfg, paths, config_file, control = prepare(tmp_path, monkeypatch)
    script(control, "gate", ids=["it0-002"])  # the first process stops inside its third proxy
    first = cli(config_file, paths.root)
    try:
        _wait(lambda: any(n.get("mode") == "gate" for n in notes(control)) or first.poll() is not None,
              "the first process to reach the gate")
        assert first.poll() is None, first.communicate()
        results_before = (paths.root / "search" / "results.jsonl").read_bytes()
        second = cli(config_file, paths.root)
        out, err = second.communicate(timeout=120)
        assert second.returncode == 2
        lines = [x for x in err.splitlines() if x.strip()]
        assert len(lines) == 1, err
        assert f"PID {first.pid} on host {socket.gethostname()}" in lines[0] and "in use" in lines[0]
        assert (paths.root / "search" / "results.jsonl").read_bytes() == results_before
    finally:
        os.killpg(first.pid, signal.SIGKILL)  # a crash: no cleanup runs
        first.wait(timeout=30)
        for n in notes(control):  # the trainer the first process left behind
            for pid in (n["pid"], n.get("child")):
                if pid and alive(pid):
                    os.kill(pid, signal.SIGKILL)
    assert json.loads((paths.root / INFO_NAME).read_text())["pid"] == first.pid  # left behind by the kill
    script(control, "ok")
    with caplog.at_level(logging.WARNING, logger="climb.runtime.runlock"):
        pipeline.run_stage("search", cfg, paths.root)
    assert f"left by PID {first.pid}" in caplog.text
    results = search.read_results(paths)
    ids = [r["mixture_id"] for r in results]
    assert len(ids) == 6 and len(set(ids)) == 6 and all(r["status"] == "ok" for r in results)
    lines = (paths.root / "search" / "results.jsonl").read_text().splitlines()
    assert len(lines) == 6  # nothing written twice
    manifest = json.loads(paths.manifest("search").read_text())
    assert manifest["stats"]["proxies"] == 6
    index = json.loads((paths.tokenize.store / "index.json").read_text())
    for c, n in enumerate(index["tokens"]):  # the token store was not doubled
        f = paths.tokenize.store / f"cluster_{c:05d}.bin"
        assert f.stat().st_size == n * 2
    assert not (paths.root / INFO_NAME).exists()  # released


def test_lock_is_reentrant_here_and_refused_elsewhere(tmp_path):
    probe = ("import sys; from climb.runtime.runlock import hold, RunLocked\n"
             "try:\n    with hold(sys.argv[1]): print('held')\n"
             "except RunLocked as e: print(e)")
    with hold(tmp_path):
        with hold(tmp_path):  # nested holds in one process share the lock
            info = json.loads((tmp_path / INFO_NAME).read_text())
            assert info["pid"] == os.getpid() and info["host"] == socket.gethostname()
        out = subprocess.run([sys.executable, "-c", probe, str(tmp_path)], env=env(), capture_output=True,
                             text=True, timeout=60).stdout
        assert f"in use by PID {os.getpid()}" in out
    assert not (tmp_path / INFO_NAME).exists()
    out = subprocess.run([sys.executable, "-c", probe, str(tmp_path)], env=env(), capture_output=True,
                         text=True, timeout=60).stdout
    assert out.strip() == "held"


def test_refusal_names_holder_even_without_info(tmp_path):
    from filelock import FileLock
    lock = FileLock(str(tmp_path / ".climb.lock"))
    lock.acquire()
    try:
        with pytest.raises(RunLocked, match="in use by another process"):
            with hold(tmp_path / "."):
                pass
    finally:
        lock.release()
