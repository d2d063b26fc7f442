"""The long-measurement queue: plans parse strictly, items run once, a restart goes on where it stopped."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import plan_queue as queue

REPO = Path(__file__).resolve().parents[1]


def _plan(tmp_path, text):
    p = tmp_path / "t.plan"
    p.write_text(text)
    return p


def test_a_plan_with_a_bad_line_or_a_repeated_name_is_refused_with_its_line(tmp_path):
    with pytest.raises(SystemExit, match=r"t.plan:2: expected `name: command`"):
        queue.parse(_plan(tmp_path, "a: true\nno colon here\n"))
    with pytest.raises(SystemExit, match=r"t.plan:3: item 'a' is named twice"):
        queue.parse(_plan(tmp_path, "a: true\n# a comment\na: false\n"))
    assert queue.parse(_plan(tmp_path, "# c\n\nx-1: echo '# kept'\n")) == [("x-1", "echo '# kept'")]


def test_items_run_once_failures_wait_for_the_next_start_and_done_items_are_skipped(tmp_path):
    count = tmp_path / "count"
    plan = _plan(tmp_path, f"a: echo a >> {count}\nb: test -e {tmp_path}/ok\nc: echo c >> {count}\n")
    q = queue.Queue(plan, tmp_path / "state")
    assert q.run(lanes=2, poll=0.05) == 1  # b failed
    assert sorted(count.read_text().split()) == ["a", "c"]
    assert [r["state"] for r in q.status()] == ["done", "failed", "done"]
    (tmp_path / "ok").touch()
    q2 = queue.Queue(plan, tmp_path / "state")  # a new start: only b runs again
    assert q2.run(lanes=2, poll=0.05) == 0
    assert sorted(count.read_text().split()) == ["a", "c"]
    assert all(r["state"] == "done" for r in q2.status())


def test_a_claim_left_by_a_dead_process_is_taken_over_and_a_live_one_holds_its_lane(tmp_path):
    out = tmp_path / "out"
    plan = _plan(tmp_path, f"a: echo a >> {out}\nb: echo b >> {out}\n")
    state = tmp_path / "state"
    q = queue.Queue(plan, state)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    q.path("a", "claim").write_text(json.dumps({"pid": dead.pid, "boot_id": queue._boot_id()}))
    assert q.state("a") == "stale"
    q.path("b", "claim").write_text(json.dumps({"pid": os.getpid(), "boot_id": queue._boot_id()}))
    assert q.state("b") == "running"
    # one lane, held by the live claim on b: nothing may start until it ends
    q.lanes, q.poll, q.tried = 1, 0.05, set()
    import threading
    t = threading.Thread(target=q.lane, args=(1, []))
    t.start()
    t.join(0.5)
    assert t.is_alive() and not out.exists()
    q.path("b", "claim").unlink()  # b's holder ends without finishing it
    t.join(10)
    assert not t.is_alive()
    assert out.read_text().split() == ["a", "b"]  # the stale claim's item first, then b


def test_the_bench_plan_names_commands_that_exist():
    items = queue.parse(REPO / "benchmarks" / "plans" / "bench_long.plan")
    assert len(items) >= 16
    for _, cmd in items:
        script = cmd.split()[1]
        assert (REPO / script).exists(), script


def test_each_lane_gets_its_share_of_the_cores_for_torch_threads_unless_set(tmp_path, monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    assert queue.item_env(2)["OMP_NUM_THREADS"] == "4" and queue.item_env(16)["OMP_NUM_THREADS"] == "1"
    assert queue.item_env(2)["HF_HUB_OFFLINE"] == "1"
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert queue.item_env(2)["OMP_NUM_THREADS"] == "3"
    out = tmp_path / "env"
    monkeypatch.delenv("OMP_NUM_THREADS")
    q = queue.Queue(_plan(tmp_path, f"a: echo $OMP_NUM_THREADS > {out}\n"), tmp_path / "state")
    assert q.run(lanes=2, poll=0.05) == 0 and out.read_text().strip() == "4"  # what the item sees
