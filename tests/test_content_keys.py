"""Inputs and outputs known by what they hold: a run folder copied without its times or moved,
and a corpus copied or downloaded again with the same bytes, redo nothing; a changed byte
redoes what depends on it; an older run folder's manifests upgrade once, with one log line."""
from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil

import pytest

from climb import pipeline
from climb.io.digests import DigestCache, content_fingerprint, file_digest
from climb.stages import embed
from scripted_run import prepare

STAGES = ("embed", "cluster", "tokenize", "search", "export")


def _run(cfg, root) -> dict:
    return {s: pipeline.run_stage(s, cfg, root, with_deps=False) for s in STAGES}


def _redone(stats: dict) -> list[str]:
    return [s for s, st in stats.items() if not st.get("skipped_stage")]


@pytest.fixture()
def finished(tmp_path, monkeypatch):
    cfg, paths, _, _ = prepare(tmp_path, monkeypatch)
    _run(cfg, paths.root)
    return cfg, paths, tmp_path


def test_content_fingerprints_know_files_by_their_bytes(tmp_path):
    a, b = tmp_path / "a" / "part-0.parquet", tmp_path / "b" / "part-0.parquet"
    a.parent.mkdir()
    b.parent.mkdir()
    a.write_bytes(b"x" * 1000)
    shutil.copyfile(a, b)
    os.utime(b, ns=(1, 1))
    cache = DigestCache(tmp_path / "digests.json")
    assert content_fingerprint([a], cache) == content_fingerprint([b], cache)  # another folder and time
    assert content_fingerprint([a], cache)[0] == ["part-0.parquet", 1000, file_digest(a)]
    b.write_bytes(b"x" * 999 + b"y")
    assert content_fingerprint([a], cache) != content_fingerprint([b], cache)  # one byte
    # The cache reads an unchanged file once, and a touched one again.
    before = cache.read
    content_fingerprint([a], cache)
    assert cache.read == before
    os.utime(a, ns=(5, 5))
    content_fingerprint([a], cache)
    assert cache.read == before + 1000
    assert json.loads((tmp_path / "digests.json").read_text())[str(a.resolve())][3] == file_digest(a)


def test_embed_keys_are_equal_for_equal_inputs_and_differ_for_changed_ones(finished, tmp_path):
    cfg, paths, root = finished
    k = embed.key(cfg, paths)
    moved = tmp_path / "moved-corpus"
    shutil.copytree(root / "corpus", moved)  # another folder, new times, the same bytes
    other = dataclasses.replace(cfg, corpus=dataclasses.replace(cfg.corpus, paths=(f"{moved}/*.parquet",)))
    assert embed.key(other, paths) == k
    assert embed.key(cfg, paths, legacy=True) != embed.key(other, paths, legacy=True)  # paths and times did
    f = sorted(moved.glob("*.parquet"))[0]
    data = bytearray(f.read_bytes())
    data[-100] ^= 1
    f.write_bytes(bytes(data))
    assert embed.key(other, paths) != k
    assert embed.key(dataclasses.replace(cfg, embed=dataclasses.replace(cfg.embed, batch_size=7)), paths) != k


def test_a_run_folder_copied_without_times_or_moved_redoes_nothing(finished, tmp_path):
    cfg, paths, _ = finished
    copied = tmp_path / "copied"
    shutil.copytree(paths.root, copied, copy_function=shutil.copyfile)  # `cp -r`: new files, new times
    assert _redone(_run(cfg, copied)) == []
    moved = tmp_path / "elsewhere" / "run"
    moved.parent.mkdir()
    shutil.move(str(copied), moved)
    assert _redone(_run(cfg, moved)) == []
    # ... and a real change there is still found: a byte of an output changed is repaired
    emb = sorted((moved / "embed").glob("*.npy"))[0]
    data = bytearray(emb.read_bytes())
    data[-1] ^= 1
    emb.write_bytes(bytes(data))
    assert "embed" in _redone(_run(cfg, moved))


def test_a_corpus_downloaded_again_with_the_same_bytes_redoes_nothing(finished):
    cfg, paths, root = finished
    for f in sorted((root / "corpus").glob("*.parquet")):
        data = f.read_bytes()
        f.unlink()
        f.write_bytes(data)  # a new file: new inode, new times
    assert _redone(_run(cfg, paths.root)) == []


def test_an_older_run_folder_upgrades_once_with_one_line(finished, caplog):
    from climb.stages import cluster, export, search, tokenize
    cfg, paths, _ = finished
    legacy = {"embed": lambda: embed.key(cfg, paths, legacy=True), "cluster": lambda: cluster.key(cfg, paths),
              "tokenize": lambda: tokenize.key(cfg, paths, legacy=True),
              "search": lambda: search.key(cfg, paths, legacy=True), "export": lambda: export.key(cfg, paths)}
    for s in STAGES:  # the manifests as an older climb wrote them: keys by path and time, outputs by time
        m = json.loads(paths.manifest(s).read_text())
        m.pop("key")
        m["outputs"] = {rel: v[:2] for rel, v in m["outputs"].items()}
        m["hash"] = legacy[s]()  # each stage keyed on its upstream's old hash, as it was then
        paths.manifest(s).write_text(json.dumps(m))
    caplog.set_level(logging.INFO)
    redone = _redone(_run(cfg, paths.root))
    assert redone == [], redone
    lines = [r for r in caplog.records if "upgraded this run folder's manifests" in r.getMessage()]
    assert len(lines) == 1
    for s in STAGES:
        m = json.loads(paths.manifest(s).read_text())
        assert m["key"] and all(len(v) == 3 for v in m["outputs"].values())
    caplog.clear()
    assert _redone(_run(cfg, paths.root)) == [] and not [r for r in caplog.records if "upgraded" in r.getMessage()]


def test_a_shard_added_to_a_finished_run_costs_only_that_shard(finished, caplog):
    """A new corpus file: only it is embedded, assigned (to the kept centroids) and tokenised;
    the old documents' assignments stay byte for byte, and the stats say how far the new ones
    lie from the centroids."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from conftest import vocab_docs
    from proxies.tokens import TokenStore
    cfg, paths, root = finished
    old_assign = {s: paths.cluster.assignments(s).read_bytes() for s in paths.shards()}
    old_store = TokenStore(paths.tokenize.store)
    old_tokens = {c: np.array(old_store.array(c)) for c in range(old_store.n_clusters)}
    docs = [dict(d, id=f"new-{d['id']}") for d in vocab_docs(10, seed=7)]
    pq.write_table(pa.table({"id": [d["id"] for d in docs], "text": [d["text"] for d in docs]}),
                   root / "corpus" / "part-00002.parquet")
    caplog.set_level(logging.INFO)
    stats = {s: pipeline.run_stage(s, cfg, paths.root, with_deps=False) for s in ("embed", "cluster", "tokenize")}
    assert stats["embed"]["resumed_shards"] == 2 and len(stats["embed"]["shards"]) == 3
    assert stats["cluster"]["assigned_now"] == ["part-00002"] and stats["cluster"]["kmeans"]["backend"] == "kept"
    assert stats["cluster"]["drift"]["new_shards"] == ["part-00002"]
    assert stats["tokenize"]["tokenized_now"] == ["part-00002"]
    for s, data in old_assign.items():
        assert paths.cluster.assignments(s).read_bytes() == data  # the old documents keep their clusters
    store = TokenStore(paths.tokenize.store)
    new_docs = int(pq.read_table(paths.cluster.assignments("part-00002"), columns=["cluster"])["cluster"]
                   .to_numpy().__ge__(0).sum())
    assert sum(store.index["docs"]) == sum(old_store.index["docs"]) + new_docs
    for c, arr in old_tokens.items():  # every old token is where it was, the new shard's after them
        assert (np.array(store.array(c))[: len(arr)] == arr).all()
    assert "outputs of unchanged inputs are kept" in caplog.text
    # and with the corpus as it was again, the run is as it was
    (root / "corpus" / "part-00002.parquet").unlink()
    again = {s: pipeline.run_stage(s, cfg, paths.root, with_deps=False) for s in ("embed", "cluster", "tokenize")}
    assert again["tokenize"]["tokenized_now"] == [] and len(again["embed"]["shards"]) == 2
    store = TokenStore(paths.tokenize.store)
    assert all((np.array(store.array(c)) == arr).all() for c, arr in old_tokens.items())
