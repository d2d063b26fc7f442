"""Outputs damaged between runs are found and re-made (finding 5 of the robustness issue).

Each manifest records the size and mtime_ns of every file its stage wrote. An
embedding shard cut in half is embedded again (before, the rerun said "up to
date" and a later cluster change failed on it after wiping cluster/); a deleted
assignment file makes the cluster stage run again; a stage reading a damaged
output of an earlier one stops with one line naming the file and the command.
"""
from __future__ import annotations

import dataclasses
import json
import os

import numpy as np
import pytest

from climb.stages import cluster, tokenize

from climb import pipeline
from climb.config import load_config
from climb.io.files import InputError
from climb.runtime.layout import RunPaths


@pytest.fixture
def clustered(tmp_path, fake_model, make_docs, write_shards):
    write_shards(tmp_path / "corpus", make_docs(30), 2)
    cfg = load_config(None, [f'corpus.paths=["{tmp_path}/corpus/*.parquet"]', "cluster.k=4", "cluster.niter=10"])
    paths = RunPaths(tmp_path / "run")
    pipeline.run_stage("cluster", cfg, paths.root)
    return cfg, paths


def _cut_in_half(path):
    os.truncate(path, path.stat().st_size // 2)


def test_embedding_shard_cut_in_half_is_embedded_again(clustered, fake_model, caplog):
    cfg, paths = clustered
    shard = paths.root / "embed" / "part-00000.npy"
    good = np.load(shard)
    cluster_manifest = paths.manifest("cluster").read_text()
    _cut_in_half(shard)
    seen = fake_model.texts_seen
    pipeline.run_stage("cluster", cfg, paths.root)
    assert f"{shard} is changed" in caplog.text
    assert fake_model.texts_seen - seen == 45  # that shard only (90 docs in two shards)
    np.testing.assert_array_equal(np.load(shard), good)
    assert paths.manifest("cluster").read_text() == cluster_manifest  # same embeddings: cluster is kept


def test_damaged_upstream_is_one_line_before_anything_is_removed(clustered):
    cfg, paths = clustered
    shard = paths.root / "embed" / "part-00001.npy"
    _cut_in_half(shard)
    before = sorted(p.name for p in (paths.root / "cluster").iterdir())
    changed = dataclasses.replace(cfg, cluster=dataclasses.replace(cfg.cluster, k=3))
    with pytest.raises(InputError) as ei:
        cluster.run(changed, paths)  # the stage alone, as the Python API allows
    msg = str(ei.value)
    assert str(shard) in msg and "climb embed" in msg and "\n" not in msg
    assert sorted(p.name for p in (paths.root / "cluster").iterdir()) == before


def test_deleted_assignment_file_runs_cluster_again(clustered):
    cfg, paths = clustered
    assign = paths.root / "cluster" / "assign" / "part-00000.parquet"
    good = assign.read_bytes()
    assign.unlink()
    with pytest.raises(InputError, match=rf"{assign} is missing since `climb cluster` wrote it.*run `climb cluster`"):
        tokenize.run(cfg, paths)
    pipeline.run_stage("cluster", cfg, paths.root)
    assert assign.read_bytes() == good
    manifest = json.loads(paths.manifest("cluster").read_text())
    assert "content" not in manifest  # the same clusters again: later stages keep their results


def test_repair_that_changes_clusters_changes_what_later_stages_key_on(clustered):
    from climb.runtime.stage import upstream_key
    cfg, paths = clustered
    key = upstream_key(paths, "cluster")
    summary = paths.root / "cluster" / "clusters.json"
    data = json.loads(summary.read_text())
    data["clusters"][0]["docs"] += 1  # as if k-means had come out differently
    summary.write_text(json.dumps(data))
    pipeline.run_stage("cluster", cfg, paths.root)  # summary changed: cluster runs again ...
    assert upstream_key(paths, "cluster") == key  # ... and reproduces it
    manifest = json.loads(paths.manifest("cluster").read_text())
    manifest["digest"] = "0" * 16  # a repair that did not reproduce the previous digest
    paths.manifest("cluster").write_text(json.dumps(manifest))
    os.utime(summary, ns=(0, 0))  # its time alone changed: the same bytes, nothing to repair
    pipeline.run_stage("cluster", cfg, paths.root)
    assert upstream_key(paths, "cluster") == key
    summary.write_text(json.dumps(data))  # its bytes changed: repaired, and the digest differs
    pipeline.run_stage("cluster", cfg, paths.root)
    assert upstream_key(paths, "cluster") != key


def test_doubled_token_part_is_tokenized_again(tmp_path):
    from proxies.tokenizer import train_bpe
    from proxies.tokens import TokenStore, merge_token_stores, store_is_complete, write_shard_tokens
    texts = [f"ocean whale coral {i} tide reef" for i in range(40)]
    tok = train_bpe(texts, 320, tmp_path / "tok.json")
    out = tmp_path / "tokens"
    write_shard_tokens(texts, np.arange(40) % 2, tok, out, "s0")
    merge_token_stores(out, ["s0"], 2)
    part = out / "parts" / "s0" / "cluster_00000.bin"
    good = part.read_bytes()
    part.write_bytes(good + good)  # two writers appended the same tokens
    write_shard_tokens(texts, np.arange(40) % 2, tok, out, "s0")
    assert part.read_bytes() == good
    merged = out / "cluster_00000.bin"
    merged.write_bytes(merged.read_bytes()[:10])
    assert not store_is_complete(out)
    merge_token_stores(out, ["s0"], 2)
    assert store_is_complete(out) and TokenStore(out).array(0).size == len(good) // 2


def test_damaged_merged_store_after_its_parts_were_dropped_is_tokenized_again(clustered):
    """The parts' token files go once merged; a merged cluster file cut short later makes the
    stage tokenize the shards again and merge the same bytes."""
    from proxies.tokens import drop_merged_parts
    cfg, paths = clustered
    tokenize.run(cfg, paths)
    store = paths.tokenize.store
    assert not list((store / "parts").glob("*/cluster_*.bin"))
    merged = {f.name: f.read_bytes() for f in store.glob("cluster_*.bin")}
    victim = max(store.glob("cluster_*.bin"), key=lambda f: f.stat().st_size)
    _cut_in_half(victim)
    with pytest.raises(RuntimeError, match="not complete"):
        drop_merged_parts(store, ["part-00000"])  # nothing is dropped while the store is damaged
    tokenize.run(cfg, paths)
    assert {f.name: f.read_bytes() for f in store.glob("cluster_*.bin")} == merged
    assert not list((store / "parts").glob("*/cluster_*.bin"))
    assert all((store / "parts" / s / "doc_tokens.npy").exists() for s in ("part-00000", "part-00001"))
