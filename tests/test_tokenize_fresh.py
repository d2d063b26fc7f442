"""Tokenising many shards in child processes replaced every few shards.

The BPE encoder keeps native memory for each shard it encodes, for the life of its
process, so a local run past tokenize.FRESH_EVERY shards tokenises them in a
child replaced every FRESH_EVERY shards (climb.runtime.workers.fresh_map). The parts
and the merged store must be what tokenising in the stage's own process writes.

    pytest tests/test_tokenize_fresh.py
"""
from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

from climb.runtime.executor import LocalExecutor
from climb.runtime.workers import fresh_map
from climb.stages import tokenize

from test_damaged_outputs import clustered  # noqa: F401  (the same clustered two-shard run)


def _double_with_pid(x: int) -> tuple[int, int]:
    return 2 * x, os.getpid()


def test_fresh_map_gives_results_in_order_from_a_child_replaced_every_n_tasks():
    got = fresh_map(_double_with_pid, range(5), every=2)
    assert [r for r, _ in got] == [0, 2, 4, 6, 8]
    pids = [p for _, p in got]
    assert os.getpid() not in pids
    assert pids[0] == pids[1] and pids[2] == pids[3] and len({pids[0], pids[2], pids[4]}) == 3


def test_the_local_executor_keeps_a_few_tasks_in_its_own_process():
    got = LocalExecutor().map(_double_with_pid, [1, 2], fresh_every=2)
    assert got == [(2, os.getpid()), (4, os.getpid())]
    assert os.getpid() not in {p for _, p in LocalExecutor().map(_double_with_pid, [1, 2, 3], fresh_every=2)}


def _store_files(paths) -> dict:
    store = paths.tokenize.store
    return {str(f.relative_to(store)): f.read_bytes() for f in sorted(store.rglob("*")) if f.is_file()}


def test_tokenizing_in_replaced_children_writes_the_store_the_stage_writes_in_process(clustered, monkeypatch):
    cfg, paths = clustered
    in_process = tokenize.run(cfg, paths)
    want = _store_files(paths)
    assert any(k.startswith("cluster_") for k in want) and "parts/part-00001/done.json" in want
    shutil.rmtree(paths.tokenize.dir)

    monkeypatch.setattr(tokenize, "FRESH_EVERY", 1)  # two shards: two children, one shard each
    in_children = tokenize.run(cfg, paths)
    assert {k: v for k, v in in_children.items() if k != "seconds"} == {
        k: v for k, v in in_process.items() if k != "seconds"}
    assert _store_files(paths) == want


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a parent's death signal is Linux's")
def test_a_child_dies_with_its_killed_parent(tmp_path):
    """kill -9 of the stage's process takes the child tokenising a shard with it, so a rerun
    never writes a part beside a leftover child still writing the same part."""
    import signal
    import subprocess
    import time
    pidfile = tmp_path / "child.pid"
    script = (
        "import os, sys, time\n"
        "sys.path[:0] = [{root!r}, {tests!r}]\n"
        "from climb.runtime.workers import fresh_map\n"
        "from test_tokenize_fresh import _write_pid_then_sleep\n"
        "fresh_map(_write_pid_then_sleep, [{pidfile!r}], every=1)\n"
    ).format(root=str(Path(__file__).resolve().parents[1]), tests=str(Path(__file__).resolve().parent),
             pidfile=str(pidfile))
    parent = subprocess.Popen([sys.executable, "-c", script])
    deadline = time.time() + 60
    # The file exists from its open on, before the pid is written into it: wait for the pid.
    while not (pidfile.exists() and pidfile.read_text().strip()) and time.time() < deadline:
        time.sleep(0.1)
    assert pidfile.exists() and pidfile.read_text().strip(), "the child never started"
    child = int(pidfile.read_text())
    os.kill(parent.pid, signal.SIGKILL)
    parent.wait()
    deadline = time.time() + 10
    while _alive(child) and time.time() < deadline:
        time.sleep(0.1)
    assert not _alive(child)


def _write_pid_then_sleep(path: str) -> None:
    import time
    Path(path).write_text(str(os.getpid()))
    time.sleep(120)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"  # a zombie has died
    except FileNotFoundError:
        return False
