"""Tokenising many shards in child processes replaced every few shards.

The BPE encoder keeps native memory for each shard it encodes, for the life of its
process, so a local run past tokenization.FRESH_EVERY shards tokenises them in a
child replaced every FRESH_EVERY shards (climb.runtime.workers.fresh_map). The parts
and the merged store must be what tokenising in the stage's own process writes.

    pytest tests/test_tokenize_fresh.py
"""
from __future__ import annotations

import os
import shutil

from climb.runtime.executor import LocalExecutor
from climb.runtime.workers import fresh_map
from climb.stages import tokenization

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
    in_process = tokenization.run(cfg, paths)
    want = _store_files(paths)
    assert any(k.startswith("cluster_") for k in want) and "parts/part-00001/done.json" in want
    shutil.rmtree(paths.tokenize.dir)

    monkeypatch.setattr(tokenization, "FRESH_EVERY", 1)  # two shards: two children, one shard each
    in_children = tokenization.run(cfg, paths)
    assert {k: v for k, v in in_children.items() if k != "seconds"} == {
        k: v for k, v in in_process.items() if k != "seconds"}
    assert _store_files(paths) == want
