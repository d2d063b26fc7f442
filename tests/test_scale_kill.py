"""benchmarks/scale_kill.py's pure parts on tiny synthetic stage folders: the listing taken at
the kill, which files a rerun redid and of what kind, the records of the proxies' files, and
the comparison with the reference that leaves timings out. No pipeline runs here.

    pytest tests/test_scale_kill.py
"""
from __future__ import annotations

import json
import os
import time

from benchmarks import scale_kill as sk


def _write(path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def _replace(path, text: str) -> None:
    """A new file under the old name (a new inode), as atomic_path writes one; its mtime moved on."""
    tmp = path.with_name(f".{path.name}.x.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
    later = time.time_ns() + 10**9
    os.utime(path, ns=(later, later))


def _rec(mid: str, seed: int, objective: float, seconds: float) -> str:
    return json.dumps({"mixture_id": mid, "seed": seed, "objective": objective, "seconds": seconds})


def test_snapshot_lists_finished_files_not_temporary_ones(tmp_path):
    _write(tmp_path / "part-0.npy", "a")
    _write(tmp_path / ".part-1.npy.abc.tmp", "half")
    _write(tmp_path / "fine" / "part-0.parquet", "b")
    _write(tmp_path / ".student.tmp-12" / "x", "c")
    _write(tmp_path / "results.jsonl", _rec("it0-000", 0, 1.0, 3.0) + "\n")
    snap = sk.snapshot(tmp_path)
    assert sorted(snap) == ["fine/part-0.parquet", "part-0.npy", "results.jsonl"]
    assert snap["part-0.npy"]["size"] == 1 and "text" not in snap["part-0.npy"]
    assert "it0-000" in snap["results.jsonl"]["text"]  # record files keep their contents


def test_kind_tells_bookkeeping_logs_records_whole_steps_and_data():
    assert sk.kind("embed", "manifest.json") == "bookkeeping"
    assert sk.kind("embed", "stage_state.json") == "bookkeeping"
    assert sk.kind("search", "results.jsonl") == "log"
    assert sk.kind("search", "comparison.json") == "records"
    assert sk.kind("search", "rungs_0.json") == "records"
    assert sk.kind("search", "plan_0.json") == "data"  # a plan rewritten would train other mixtures
    assert sk.kind("cluster", "clusters.json") == "whole"
    assert sk.kind("cluster", "fine/part-0.parquet") == "data"
    assert sk.kind("cluster", "assign/part-0.parquet") == "whole"  # the dedup step marks it
    assert sk.kind("tokenize", "tokens/cluster_00001.bin") == "whole"
    assert sk.kind("tokenize", "tokens/parts/part-0/done.json") == "data"  # a part's marker
    assert sk.kind("report", "index.html") == "whole"


def test_redone_finds_a_finished_data_file_written_again(tmp_path):
    _write(tmp_path / "part-0.npy", "a")
    _write(tmp_path / "part-0.ids.parquet", "a")
    _write(tmp_path / "stage_state.json", "{}")
    before = sk.snapshot(tmp_path)
    _replace(tmp_path / "part-0.npy", "a")  # the same bytes, written again: still a redo
    _replace(tmp_path / "stage_state.json", "{}")
    _write(tmp_path / "part-1.npy", "b")  # the shard in flight, new
    _write(tmp_path / "manifest.json", "{}")
    got = sk.redone("embed", before, sk.snapshot(tmp_path))
    assert got["data_files_redone"] == ["part-0.npy"]
    assert got["bookkeeping_redone"] == ["stage_state.json"]
    assert got["files_kept"] == 1 and got["removed"] == []


def test_files_of_a_task_without_its_last_file_are_in_flight(tmp_path):
    done, flying = tmp_path / "tokens" / "parts" / "part-0", tmp_path / "tokens" / "parts" / "part-1"
    _write(done / "cluster_00000.bin", "t")
    _write(done / "done.json", "{}")
    _write(flying / "cluster_00000.bin", "half")  # appended in place, no done.json yet
    _write(tmp_path / "tokenizer.json", "{}")
    before = sk.snapshot(tmp_path)
    _replace(flying / "cluster_00000.bin", "whole")
    (done / "cluster_00000.bin").unlink()  # dropped once merged
    _write(flying / "done.json", "{}")
    got = sk.redone("tokenize", before, sk.snapshot(tmp_path))
    assert got["in_flight"] == ["tokens/parts/part-1/cluster_00000.bin"]
    assert got["data_files_redone"] == [] and got["removed"] == ["tokens/parts/part-0/cluster_00000.bin"]
    assert got["files_kept"] == 2
    assert sk.in_flight("embed", "part-0.npy", {"part-0.npy"})
    assert not sk.in_flight("embed", "part-0.npy", {"part-0.npy", "part-0.ids.parquet"})
    assert not sk.in_flight("cluster", "centroids.npy", set())  # a fit redone is to be found
    assert sk.in_flight("export", "data/cluster_00003/part-0-001.parquet", {"plan/part-1.done.json"})


def test_redone_keeps_whole_steps_and_logs_apart_and_counts_proxies(tmp_path):
    log = tmp_path / "results.jsonl"
    _write(log, _rec("it0-000", 0, 1.0, 3.0) + "\n" + _rec("it0-001", 0, 2.0, 3.0)[:20])  # cut by the kill
    _write(tmp_path / "swarm_weights.csv", "x")
    _write(tmp_path / "replicates.json", json.dumps({"it0-000/1": {"mixture_id": "it0-000", "seconds": 1}}))
    before = sk.snapshot(tmp_path)
    with open(log, "a") as f:  # appended in place: the same inode
        f.write("\n" + _rec("it0-001", 0, 2.0, 4.0) + "\n")
    later = time.time_ns() + 10**9
    os.utime(log, ns=(later, later))
    _replace(tmp_path / "swarm_weights.csv", "y")
    _replace(tmp_path / "replicates.json", json.dumps({"it0-000/1": {"mixture_id": "it0-000", "seconds": 1},
                                                       "it0-000/2": {"mixture_id": "it0-000", "seconds": 2}}))
    got = sk.redone("search", before, sk.snapshot(tmp_path))
    assert got["data_files_redone"] == [] and got["proxies_redone"] == []
    assert got["logs_appended"] == ["results.jsonl"]
    assert got["whole_step_redone"] == ["swarm_weights.csv"]
    assert got["records_rewritten"] == ["replicates.json"]
    assert got["proxies_rerun"] == 2  # it0-001 (its cut line was no record) and it0-000/2


def test_redone_names_a_proxy_trained_twice(tmp_path):
    log = tmp_path / "results.jsonl"
    _write(log, _rec("it0-000", 0, 1.0, 3.0) + "\n")
    before = sk.snapshot(tmp_path)
    with open(log, "a") as f:
        f.write(_rec("it0-000", 0, 1.0, 5.0) + "\n")  # the same proxy again: the last record counts
    got = sk.redone("search", before, sk.snapshot(tmp_path))
    assert got["proxies_redone"] == ["results.jsonl:it0-000/0"]
    _write(log, json.dumps({"mixture_id": "it0-001", "seed": 0, "status": "failed"}) + "\n")
    before = sk.snapshot(tmp_path)
    with open(log, "a") as f:
        f.write(_rec("it0-001", 0, 1.0, 5.0) + "\n")  # a failed proxy trained again: search.retry_failed
    assert sk.redone("search", before, sk.snapshot(tmp_path))["proxies_redone"] == []


def test_records_read_a_log_as_the_search_does():
    text = _rec("a", 0, 1.0, 1.0) + "\n" + _rec("a", 0, 2.0, 1.0) + "\n{\"mixture_id\": \"b\""
    got = sk.records("results.jsonl", text)
    assert list(got) == ["a/0"] and json.loads(got["a/0"])["objective"] == 2.0
    assert list(sk.records("comparison.json", json.dumps({"climb/10007": {"objective": 1}}))) == ["climb/10007"]
    assert sk.records("comparison.json", "{not json") == {}


def _manifest(seconds: float, mtime: int, finished: str, **stats) -> str:
    # quality.json holds timings: its size and digest follow them
    return json.dumps({"stage": "embed", "hash": "h", "key": "h", "stats": {"docs": 10, "seconds": seconds, **stats},
                       "finished": finished, "outputs": {"part-0.npy": [5, mtime, "sha"],
                                                         "quality.json": [30 + mtime % 2, mtime, f"sha{mtime}"]}})


def test_compare_folders_ignores_timings_and_line_order_only(tmp_path):
    ref, run = tmp_path / "ref", tmp_path / "run"
    for d, secs, mtime, t in ((ref, 1.5, 111, "12:00"), (run, 9.0, 222, "13:00")):
        _write(d / "part-0.npy", "bytes")
        _write(d / "manifest.json", _manifest(secs, mtime, t, kmeans={"backend": "faiss" if d is ref else "kept"}))
        _write(d / "stage_state.json", json.dumps({"hash": "h", "t": secs}))
        _write(d / ".tmp.x.tmp", "junk" if d is run else "")
    _write(ref / "results.jsonl", _rec("a", 0, 1.0, 1.0) + "\n" + _rec("b", 0, 2.0, 1.0) + "\n")
    _write(run / "results.jsonl", _rec("b", 0, 2.0, 7.0) + "\n" + _rec("a", 0, 1.0, 8.0) + "\n")
    _write(ref / "quality.json", json.dumps({"snr": 3.0, "finished": "x"}))
    _write(run / "quality.json", json.dumps({"snr": 3.0, "finished": "y"}))
    _write(run / "results.rejected.jsonl", "{\"mixture")
    got = sk.compare_folders(ref, run)
    assert got["identical"], got["differing"]
    assert got["timing_only"] == ["quality.json (timings)", "results.jsonl (timings, line order)"]
    assert got["stats_differ"] == ["kmeans.backend"]  # told, not a failure
    assert got["set_aside"] == ["results.rejected.jsonl"]


def test_compare_folders_finds_other_bytes_and_missing_files(tmp_path):
    ref, run = tmp_path / "ref", tmp_path / "run"
    _write(ref / "part-0.npy", "bytes")
    _write(run / "part-0.npy", "other")
    _write(ref / "part-1.npy", "x")
    _write(run / "extra.json", "{}")
    _write(ref / "quality.json", json.dumps({"snr": 3.0, "seconds": 1}))
    _write(run / "quality.json", json.dumps({"snr": 4.0, "seconds": 2}))
    _write(ref / "manifest.json", _manifest(1.0, 1, "a"))
    _write(run / "manifest.json", _manifest(1.0, 2, "a").replace('"sha"', '"other"'))
    got = sk.compare_folders(ref, run)
    assert not got["identical"]
    assert got["differing"] == ["part-1.npy (only in the reference)", "extra.json (only in the killed run)",
                                "part-0.npy", "quality.json", "manifest.json: outputs.part-0.npy[1]",
                                "manifest.json: outputs.quality.json[0]", "manifest.json: outputs.quality.json[1]"]


def test_strip_and_differences():
    obj = {"a": 1, "seconds": 2, "b": [{"seconds": 3, "c": 4}]}
    assert sk.strip(obj) == {"a": 1, "b": [{"c": 4}]}
    assert sk.differences({"a": 1, "b": [1, 2]}, {"a": 1, "b": [1, 3], "c": 0}) == ["b[1]", "c"]
    assert sk.differences([1], [1, 2]) == ["(value)"]


def test_a_seconds_column_is_left_out_of_markdown_and_html_tables():
    md = "## Proxy compute\n\n| purpose | proxies | proxy seconds |\n| --- | --- | --- |\n| search | 6 | {} |\n\nend {}"
    assert sk.same_without_timings("report.md", md.format(343, 1).encode(), md.format(403, 1).encode())
    assert not sk.same_without_timings("report.md", md.format(343, 1).encode(), md.format(343, 2).encode())
    html = ("<table><thead><tr><th>purpose</th><th>proxy seconds</th></tr></thead><tbody>"
            "<tr><td>search</td><td>{}</td></tr></tbody></table><table><tr><th>docs</th></tr><tr><td>{}</td></tr>"
            "</table>")
    assert sk.same_without_timings("index.html", html.format(343, 5).encode(), html.format(1068, 5).encode())
    assert not sk.same_without_timings("index.html", html.format(343, 5).encode(), html.format(343, 6).encode())
    assert sk.same_without_timings("cluster_map.png", b"a", b"b") is None


def test_an_export_shards_other_files_wait_for_its_done_file_too():
    assert sk.in_flight("export", "megatron-parts/cluster_00002/part-0.idx", set())
    assert not sk.in_flight("export", "megatron-parts/cluster_00002/part-0.idx", {"plan/part-0.done.json"})
    assert sk.in_flight("export", "counts/ab12/part-0.ids.npy", {"counts/ab12/part-1.npy"})
    assert not sk.in_flight("export", "counts/ab12/part-0.ids.npy", {"counts/ab12/part-0.npy"})
