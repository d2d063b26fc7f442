"""A killed embed resumes at shard granularity; files are written whole or not at all."""
from __future__ import annotations

import json

import numpy as np
import pytest

from climb.stages import embed
from climb.config import load_config
from climb.runtime.layout import RunPaths


def _cfg(tmp_path):
    return load_config(None, [f'corpus.paths=["{tmp_path}/corpus/*.parquet"]'])


def test_killed_embed_resumes_at_the_missing_shard(tmp_path, fake_model, make_docs, write_shards):
    write_shards(tmp_path / "corpus", make_docs(30), 3)
    cfg, paths = _cfg(tmp_path), RunPaths(tmp_path / "run")
    embed.run(cfg, paths)
    full = [np.load(tmp_path / "run" / "embed" / f"part-0000{i}.npy") for i in range(3)]
    # A kill after shard 0 and during shard 1: no manifest, shard 1 and 2 absent,
    # a temporary file left behind by the interrupted write.
    (paths.manifest("embed")).unlink()
    for i in (1, 2):
        paths.embed.vectors(f"part-0000{i}").unlink()
        paths.embed.ids(f"part-0000{i}").unlink()
    (tmp_path / "run" / "embed" / ".part-00001.npy.abc.tmp").write_bytes(b"partial")
    seen_before = fake_model.texts_seen
    stats = embed.run(cfg, paths)
    assert fake_model.texts_seen - seen_before == 60  # only shards 1 and 2 (30 docs each) re-embedded
    assert stats["docs"] == 90 and stats["resumed_shards"] == 1 and stats["docs_per_s"] > 0
    # Its speed is that of the shards embedded now: with every shard done before, it has none
    # (it used to count their documents as embedded in no time).
    paths.manifest("embed").unlink()
    again_stats = embed.run(cfg, paths)
    assert again_stats["resumed_shards"] == 3 and again_stats["docs_per_s"] is None
    again = [np.load(tmp_path / "run" / "embed" / f"part-0000{i}.npy") for i in range(3)]
    for a, b in zip(full, again):
        np.testing.assert_array_equal(a, b)
    # Unchanged config and inputs: the whole stage is skipped.
    assert embed.run(cfg, paths).get("skipped_stage") is True


def test_killed_tokenize_resumes_at_the_shard_in_flight(tmp_path, fake_model, make_docs, write_shards,
                                                        monkeypatch):
    """A kill during shard 1 of 3: shard 0 is kept as it is, shard 1 (cut short) and 2 are
    tokenized, and the merged store is the undisturbed one byte for byte. Once merged, the
    parts' token files are gone and their document counts stay."""
    from climb.stages import cluster, tokenize
    write_shards(tmp_path / "corpus", make_docs(30), 3)
    cfg = load_config(None, [f'corpus.paths=["{tmp_path}/corpus/*.parquet"]', "cluster.k=4", "cluster.niter=10",
                             "proxy.vocab_size=320", "proxy.tokenizer_docs=100"])
    paths = RunPaths(tmp_path / "run")
    embed.run(cfg, paths)
    cluster.run(cfg, paths)
    tokenize.run(cfg, paths)
    store = paths.tokenize.store
    merged = {f.name: f.read_bytes() for f in store.iterdir() if f.is_file()}
    parts = store / "parts"
    assert not list(parts.glob("*/cluster_*.bin"))
    assert all((parts / p / "doc_tokens.npy").exists() for p in ("part-00000", "part-00001", "part-00002"))

    # The state a kill leaves after every shard's part and before the merge.
    paths.manifest("tokenize").unlink()
    for f in list(store.iterdir()):
        if f.is_file():
            f.unlink()

    def killed(*a, **k):
        raise KeyboardInterrupt
    with monkeypatch.context() as m:
        m.setattr("proxies.tokens.merge_token_stores", killed)
        with pytest.raises(KeyboardInterrupt):
            tokenize.run(cfg, paths)
    assert len(list(parts.glob("*/cluster_*.bin"))) > 3  # dropped parts were tokenized again
    kept = {f.name: f.stat().st_mtime_ns for f in (parts / "part-00000").iterdir()}
    (parts / "part-00001" / "done.json").unlink()
    for f in (parts / "part-00001").glob("cluster_*.bin"):
        f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])  # a write cut short
    for f in (parts / "part-00002").iterdir():
        f.unlink()
    (parts / "part-00002").rmdir()

    tokenize.run(cfg, paths)
    after = {f.name: f.stat().st_mtime_ns for f in (parts / "part-00000").iterdir()}
    assert after == {n: t for n, t in kept.items() if not n.startswith("cluster_")}  # not tokenized again
    assert (parts / "part-00001" / "done.json").exists() and (parts / "part-00002" / "done.json").exists()
    assert {f.name: f.read_bytes() for f in store.iterdir() if f.is_file()} == merged
    assert not list(parts.glob("*/cluster_*.bin"))


def test_a_stage_folder_from_before_the_state_file_was_renamed_resumes(tmp_path):
    """Run folders written when the state file was `state.json` keep their partial outputs."""
    from climb.runtime.stage import begin
    from climb.runtime.layout import RunPaths
    paths = RunPaths(tmp_path / "run")
    d = paths.stage("tokenize")
    d.mkdir(parents=True, exist_ok=True)
    (d / "state.json").write_text(json.dumps({"hash": "k1"}))
    (d / "part.bin").write_bytes(b"done before the kill")
    begin(paths, "tokenize", "k1")
    assert (d / "part.bin").read_bytes() == b"done before the kill"
    assert not (d / "state.json").exists() and json.loads((d / "stage_state.json").read_text())["hash"] == "k1"
