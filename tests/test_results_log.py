"""search/results.jsonl cannot lose a record (finding 2 of the robustness issue).

A search process is SIGKILLed in the middle of appending a record (its write is
held half-done); the resumed run sets the half line aside instead of appending
onto it, trains that proxy again, and the manifest, the swarm CSV and the
report agree on six proxies. A write cut short by a full disk (a file size
limit in a real process) leaves the file as it was.
"""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from climb import pipeline

from climb.runtime import results

from climb.stages import search
from scripted_run import env, prepare

HALF_WRITE = """
import os, sys, time
real = os.write
def write(fd, data):
    if b'"mixture_id": "it0-003"' in bytes(data[:40]):
        n = real(fd, data[: len(data) // 2])
        print("half written", flush=True)
        time.sleep(600)
        return n
    return real(fd, data)
os.write = write
from climb.cli import main
sys.exit(main(sys.argv[1:]))
"""


def _strict(text: str) -> list[dict]:
    def refuse(name):
        raise ValueError(f"non-strict JSON constant {name}")
    return [json.loads(line, parse_constant=refuse) for line in text.splitlines()]


def test_sigkill_mid_append_loses_nothing(tmp_path, monkeypatch):
    cfg, paths, config_file, control = prepare(tmp_path, monkeypatch)
    proc = subprocess.Popen([sys.executable, "-c", HALF_WRITE, "search", "--config", str(config_file),
                             "--run", str(paths.root)], env=env(), stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
    try:
        assert proc.stdout.readline().strip() == "half written"
    finally:
        proc.kill()
        proc.wait(timeout=30)
    data = (paths.root / "search" / "results.jsonl").read_bytes()
    assert data.count(b"\n") == 3 and not data.endswith(b"\n")  # three records and half of the fourth
    pipeline.run_stage("report", cfg, paths.root)
    recs = _strict((paths.root / "search" / "results.jsonl").read_text())
    assert sorted(r["mixture_id"] for r in recs) == ["it0-000", "it0-001", "it0-002", "it0-003", "it1-000",
                                                     "it1-001"]
    assert (paths.root / "search" / "results.rejected.jsonl").read_bytes().startswith(b'{"mixture_id": "it0-003"')
    manifest = json.loads(paths.manifest("search").read_text())["stats"]
    csv_rows = (paths.root / "search" / "swarm_metrics.csv").read_text().splitlines()[1:]
    summary = json.loads((paths.root / "report" / "summary.json").read_text())
    assert manifest["proxies"] == len(csv_rows) == len(search.read_results(paths)) == 6
    assert summary["proxies_trained"] == 6 + 3 * cfg.search.eval_seeds


LIMITED = """
import resource, sys
from climb.runtime import results
path, limit = sys.argv[1], int(sys.argv[2])
resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))  # the disk is full past `limit` bytes
try:
    results.append(path, {"mixture_id": "it0-001", "seed": 0, "status": "ok", "pad": "x" * 1000})
except OSError as e:
    print("failed", e.errno)
"""


def test_write_cut_short_by_a_full_disk_leaves_the_file_whole(tmp_path):
    path = tmp_path / "results.jsonl"
    results.append(path, {"mixture_id": "it0-000", "seed": 0, "status": "ok"})
    before = path.read_bytes()
    out = subprocess.run([sys.executable, "-c", LIMITED, str(path), str(len(before) + 300)], env=env(),
                         capture_output=True, text=True, timeout=60)
    assert out.stdout.split()[0] == "failed", out.stderr  # the write began, then the disk was full
    assert path.read_bytes() == before
    results.append(path, {"mixture_id": "it0-002", "seed": 0, "status": "ok"})
    assert [r["mixture_id"] for r in results.load(path)] == ["it0-000", "it0-002"]


def test_repair_keeps_whole_records_and_the_last_of_each(tmp_path):
    path = tmp_path / "results.jsonl"
    a = json.dumps({"mixture_id": "a", "seed": 0, "status": "failed"})
    a2 = json.dumps({"mixture_id": "a", "seed": 0, "status": "ok", "objective": 1.0})
    b = json.dumps({"mixture_id": "b", "seed": 0, "status": "ok", "objective": 2.0})
    c = json.dumps({"mixture_id": "c", "seed": 0, "status": "ok", "objective": float("nan")})
    # A cut record with the next one appended onto it (what older versions wrote), a
    # duplicate from a retry, a bare NaN, and a cut tail.
    path.write_text(f"{a}\n{b[:25]}{c}\n{a2}\n{b[:30]}")
    assert [r["mixture_id"] for r in results.load(path)] == ["c", "a"]
    assert results.repair(path) == 2
    text = path.read_text()
    assert text.endswith("\n") and "NaN" not in text
    assert [r["mixture_id"] for r in _strict(text)] == ["a", "c", "a"]
    rejected = (tmp_path / "results.rejected.jsonl").read_text().splitlines()
    assert rejected == [b[:25], b[:30]]
    assert results.repair(path) == 0
    # Reading never writes: a report on a folder being searched does not race the writer.
    path.write_text(text + '{"mixture_id": "d"')
    before = path.read_bytes()
    assert [r["mixture_id"] for r in results.load(path)] == ["c", "a"]
    assert path.read_bytes() == before


def test_append_completes_a_cut_file_first_and_writes_strict_json(tmp_path):
    path = tmp_path / "results.jsonl"
    path.write_text(json.dumps({"mixture_id": "a", "seed": 0}) + "\n" + '{"mixture_id": "b", "se')
    results.append(path, {"mixture_id": "c", "seed": 0, "objective": float("nan"), "metrics": {"x": float("inf")}})
    recs = _strict(path.read_text())
    assert [r["mixture_id"] for r in recs] == ["a", "c"]
    assert recs[1]["objective"] is None and recs[1]["metrics"] == {"x": None}


def test_too_few_successes_is_one_line_with_the_first_failure():
    recs = [{"mixture_id": "it0-000", "status": "failed", "error": "RuntimeError: proxy.command exited 1:\nboom\n"},
            {"mixture_id": "it0-001", "status": "ok"}]
    with pytest.raises(results.ProxyFailures) as ei:
        results.require_successes(recs, 2)
    msg = str(ei.value)
    assert "\n" not in msg and "only 1 of 2 proxies succeeded" in msg and "it0-000" in msg and "boom" in msg
    results.require_successes(recs, 1)
