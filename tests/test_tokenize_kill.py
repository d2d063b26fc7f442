"""A tokenize stage killed inside a shard's task resumes to what an undisturbed run writes.

A token-store part is complete when its done.json is there; the part's writer
(proxies.tokens.write_shard_tokens) writes it, then the stage's task adds what it
records of the part (the assignments it came from, the duplicates' tokens). A kill
between the two writes left a done.json without them, which the rerun took for a
finished part: its record, the merged index and the stage's duplicate counts then
differed from an undisturbed run's, and a later change of that shard's assignments
went unseen. Found by benchmarks/scale_kill.py (a kill in that window).

    pytest tests/test_tokenize_kill.py
"""
from __future__ import annotations

import shutil

import pytest

import proxies.tokens
from climb.io.files import read_json
from climb.runtime.layout import RunPaths
from climb.stages import tokenize


class Killed(BaseException):
    """Stands for kill -9: nothing after it runs (BaseException: no `except Exception` catches it)."""


from test_damaged_outputs import clustered  # noqa: F401  (the same clustered two-shard run)


def _records(paths: RunPaths) -> dict:
    store = paths.tokenize.store
    return {rel: read_json(store / rel) for rel in ("index.json", "parts/part-00000/done.json",
                                                    "parts/part-00001/done.json")}


def test_a_kill_between_the_parts_writer_and_its_task_redoes_that_part_only(clustered, monkeypatch):
    cfg, paths = clustered
    undisturbed = tokenize.run(cfg, paths)
    want = _records(paths)
    assert "source" in want["parts/part-00001/done.json"]
    shutil.rmtree(paths.tokenize.dir)

    inner = proxies.tokens.write_shard_tokens

    def write_then_die(texts, clusters, tok, out_dir, shard_name, cap=0):
        stats = inner(texts, clusters, tok, out_dir, shard_name, cap=cap)
        if shard_name == "part-00001":
            raise Killed  # after the part's done.json, before the task's own record
        return stats
    monkeypatch.setattr(proxies.tokens, "write_shard_tokens", write_then_die)
    with pytest.raises(Killed):
        tokenize.run(cfg, paths)
    assert "source" not in read_json(paths.tokenize.store / "parts" / "part-00001" / "done.json")
    monkeypatch.setattr(proxies.tokens, "write_shard_tokens", inner)

    resumed = tokenize.run(cfg, paths)
    assert resumed["tokenized_now"] == ["part-00001"]  # the part in flight, not the finished one
    assert _records(paths) == want
    assert resumed["duplicate_tokens"] == undisturbed["duplicate_tokens"]
