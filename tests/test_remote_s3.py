"""A run whose corpus and target live in S3 and whose dataset goes back to S3.

Against a real S3 API server started by the tests (moto's, on 127.0.0.1; see
tests/stores.py), with credentials and endpoint in the environment as a user
sets them:

- `test_s3_run_reads_resumes_and_exports`: embed -> cluster -> search -> export
  from a bucket, the dataset exported to the bucket; the same files as the run on
  a local copy of the corpus, blend files naming the s3:// shards, nothing left
  under the staging prefix; a second run skips every stage; a changed remote
  shard (same size, new ETag) is embedded again; an exported object deleted
  from the bucket is written again.
- `test_dask_workers_read_and_write_s3`: cluster, search and export on two Dask
  worker processes, which read the shards and write the dataset themselves.
- errors: a missing bucket (corpus or destination) and missing credentials are
  one line naming the URL, exit code 2; a destination that cannot work stops the
  run before its first stage.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

import climb.stages.embed
from climb.runtime import executor
from climb import pipeline
from climb.cli import main
from climb.config import load_config, to_toml
from climb.io.files import InputError
from climb.runtime.layout import RunPaths
from conftest import FakeModel, vocab_docs, write_parquet_shards
from stores import s3, s3_server, upload, use_s3  # noqa: F401 - fixtures

HELPER = Path(__file__).parent / "helpers" / "quadratic_proxy.py"


def _config(corpus: str, target: str, *extra: str):
    return load_config(None, [
        f'corpus.paths=["{corpus}"]', "cluster.k=4", "cluster.niter=10",
        "proxy.vocab_size=300", "proxy.seq_len=16", "proxy.tokenizer_docs=100",
        f'proxy.command="{sys.executable} {HELPER} {{weights}} {{out}}"',
        'target.objective=["loss"]', 'target.goal="minimize"', f'target.texts=["{target}"]',
        "search.iterations=[4, 2]", "search.pool_size=2000", "search.min_weight=0.0", "search.eval_seeds=2",
        "search.replicates=0", "search.epoch_cap=100.0", "export.token_budget=3000", "export.rows_per_shard=9",
        *extra])


@pytest.fixture
def corpus(tmp_path, s3):
    """Two Parquet shards and a held-out JSON Lines file, locally and in the bucket."""
    local = tmp_path / "corpus"
    write_parquet_shards(local, vocab_docs(40, seed=5), 2)
    (tmp_path / "target").mkdir()
    held = vocab_docs(5, seed=9)
    (tmp_path / "target" / "held.jsonl").write_text("".join(json.dumps(d) + "\n" for d in held))
    upload(s3.fs, local, f"{s3.url}/corpus")
    upload(s3.fs, tmp_path / "target", f"{s3.url}/target")
    return local


def _objects(s3, prefix: str) -> list[str]:
    root = f"{s3.bucket}/{prefix}"
    return sorted(p[len(root) + 1:] for p in s3.fs.find(root))


def _stats_skipped(stats: dict) -> bool:
    return bool(stats.get("skipped_stage"))


def test_s3_run_reads_resumes_and_exports(tmp_path, s3, corpus, monkeypatch, caplog):
    monkeypatch.setattr(climb.stages.embed, "load_model", lambda cfg: FakeModel())
    dest = f"{s3.url}/mixtures/run-1"
    cfg = _config(f"{s3.url}/corpus/*.parquet", f"{s3.url}/target/*.jsonl", f'export.destination="{dest}"')
    local_cfg = _config(f"{corpus}/*.parquet", f"{tmp_path}/target/*.jsonl")
    run, local_run = tmp_path / "run", tmp_path / "local-run"
    pipeline.run_stage("export", cfg, run)
    pipeline.run_stage("export", local_cfg, local_run)

    # The inputs were fingerprinted by URL, size and ETag.
    manifest = json.loads((run / "embed" / "manifest.json").read_text())
    assert manifest["stats"]["shards"] == ["part-00000", "part-00001"]
    # The same clusters, proxies' mixtures and selection as the run on local files.
    for shard in ("part-00000", "part-00001"):
        assert pq.read_table(run / "cluster" / "assign" / f"{shard}.parquet").equals(
            pq.read_table(local_run / "cluster" / "assign" / f"{shard}.parquet"))
    assert (json.loads((run / "search" / "mixture.json").read_text())["weights"]
            == json.loads((local_run / "search" / "mixture.json").read_text())["weights"])

    # The dataset is in the bucket, each shard equal to the local run's; nothing staged is left.
    local_data = sorted(p.relative_to(local_run / "export").as_posix()
                        for p in (local_run / "export" / "data").rglob("*.parquet"))
    assert len(local_data) > 4
    objects = _objects(s3, "mixtures/run-1")
    assert objects == sorted(local_data + ["README.md", "interleave.json", "mixture.json"])
    assert not any(".climb-tmp" in p for p in s3.fs.find(s3.bucket))
    for rel in local_data:
        with s3.fs.open(f"{s3.bucket}/mixtures/run-1/{rel}") as fh:
            assert pq.read_table(fh).equals(pq.read_table(local_run / "export" / rel))
    assert not (run / "export" / "data").exists()

    # The blend files name the shards in the bucket, and are the same in the run folder.
    inter = json.loads(s3.fs.cat(f"{s3.bucket}/mixtures/run-1/interleave.json"))
    assert inter == json.loads((run / "export" / "interleave.json").read_text())
    local_inter = json.loads((local_run / "export" / "interleave.json").read_text())
    assert inter["probabilities"] == local_inter["probabilities"]
    files = [f for fs in inter["data_files"] for f in fs]
    assert sorted(files) == [f"{dest}/{p}" for p in local_data] and all(s3.fs.exists(f) for f in files)
    mix = json.loads(s3.fs.cat(f"{s3.bucket}/mixtures/run-1/mixture.json"))
    assert mix["tokens"] == json.loads((local_run / "export" / "mixture.json").read_text())["tokens"]

    # Resume: nothing changed, every stage is skipped.
    again = {s: pipeline.run_stage(s, cfg, run, with_deps=False) for s in ("embed", "cluster", "search", "export")}
    assert all(_stats_skipped(v) for v in again.values()), again

    # A changed remote shard (same size, other content: a new ETag) is embedded again.
    key = f"{s3.bucket}/corpus/part-00001.parquet"
    table = pq.read_table(corpus / "part-00001.parquet")
    texts = table["text"].to_pylist()
    texts[0] = texts[0][::-1]
    changed = table.set_column(1, "text", [texts])
    pq.write_table(changed, corpus / "part-00001.parquet")
    upload(s3.fs, corpus / "part-00001.parquet", f"s3://{key}")
    assert not _stats_skipped(pipeline.run_stage("embed", cfg, run, with_deps=False))

    # An exported object deleted from the bucket is noticed, and the export writes it again.
    pipeline.run_stage("export", cfg, run)
    victim = f"{s3.bucket}/mixtures/run-1/{local_data[0]}"
    s3.fs.rm(victim)
    caplog.clear()
    stats = pipeline.run_stage("export", cfg, run, with_deps=False)
    assert not _stats_skipped(stats) and "missing or changed since it was written" in caplog.text
    assert s3.fs.exists(victim)


def test_export_removes_only_its_own_stale_objects(tmp_path, s3, corpus, monkeypatch):
    monkeypatch.setattr(climb.stages.embed, "load_model", lambda cfg: FakeModel())
    dest = f"{s3.url}/out"
    s3.fs.pipe(f"{s3.bucket}/out/README.txt", b"not ours")
    cfg = _config(f"{s3.url}/corpus/*.parquet", f"{s3.url}/target/*.jsonl", f'export.destination="{dest}"',
                  "export.rows_per_shard=5")
    pipeline.run_stage("export", cfg, tmp_path / "run")
    first = set(_objects(s3, "out"))
    # Fewer, larger shards: the small shards of the first export go, the user's file stays.
    cfg2 = _config(f"{s3.url}/corpus/*.parquet", f"{s3.url}/target/*.jsonl", f'export.destination="{dest}"',
                   "export.rows_per_shard=1000")
    pipeline.run_stage("export", cfg2, tmp_path / "run")
    second = set(_objects(s3, "out"))
    assert "README.txt" in second and len(second) < len(first)
    recorded = json.loads((tmp_path / "run" / "export" / "destination.json").read_text())
    assert set(recorded["files"]) | {"README.txt"} == second
    assert recorded["destination"] == dest


def test_dask_workers_read_and_write_s3(tmp_path, s3, corpus, monkeypatch):
    pytest.importorskip("distributed")
    monkeypatch.setattr(climb.stages.embed, "load_model", lambda cfg: FakeModel())
    dest = f"{s3.url}/dask-out"
    base = (f"{s3.url}/corpus/*.parquet", f"{s3.url}/target/*.jsonl", f'export.destination="{dest}"')
    local_run = tmp_path / "local"
    pipeline.run_stage("export", _config(*base), local_run)
    # The embeddings come from this process's fake model; every later task reads the
    # shards from S3 in a worker process (which has its credentials from the environment).
    dask_run = tmp_path / "dask"
    pipeline.run_stage("embed", _config(*base), dask_run)
    cfg = _config(*base[:2], f'export.destination="{dest}-2"', 'executor.kind="dask"', "executor.dask_workers=2")
    try:
        pipeline.run_stage("export", cfg, dask_run)
    finally:
        executor.shutdown()
    for shard in ("part-00000", "part-00001"):
        assert pq.read_table(dask_run / "cluster" / "assign" / f"{shard}.parquet").equals(
            pq.read_table(local_run / "cluster" / "assign" / f"{shard}.parquet"))
    a, b = _objects(s3, "dask-out"), _objects(s3, "dask-out-2")
    assert a == b and len(a) > 4
    for rel in a:
        if rel.endswith(".parquet"):
            assert s3.fs.cat(f"{s3.bucket}/dask-out/{rel}") == s3.fs.cat(f"{s3.bucket}/dask-out-2/{rel}")


# ------------------------------------------------------------------ errors a user can cause
def _cli(tmp_path, *sets: str) -> list[str]:
    config = tmp_path / "run.toml"
    config.write_text(to_toml(load_config(None)))
    args = ["embed", "--config", str(config), "--run", str(tmp_path / "run")]
    for s in sets:
        args += ["--set", s]
    return args


def test_missing_bucket_is_one_line(tmp_path, s3, capsys):
    assert main(_cli(tmp_path, 'corpus.paths=["s3://no-such-bucket-x/corpus/*.parquet"]')) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "s3://no-such-bucket-x/corpus/*.parquet" in err and "does not exist" in err


def test_missing_credentials_are_one_line(tmp_path, s3, corpus, monkeypatch, capsys):
    use_s3(monkeypatch, s3.endpoint, AWS_ACCESS_KEY_ID=None, AWS_SECRET_ACCESS_KEY=None,
           AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "none"), AWS_CONFIG_FILE=str(tmp_path / "none"))
    url = f"{s3.url}/corpus/*.parquet"
    assert main(_cli(tmp_path, f'corpus.paths=["{url}"]')) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and url in err and "no credentials found" in err and "AWS_ACCESS_KEY_ID" in err


def test_bad_destination_stops_before_the_first_stage(tmp_path, s3, corpus, monkeypatch):
    monkeypatch.setattr(climb.stages.embed, "load_model", lambda cfg: FakeModel())
    cfg = _config(f"{s3.url}/corpus/*.parquet", f"{s3.url}/target/*.jsonl",
                  'export.destination="s3://no-such-bucket-y/out"')
    with pytest.raises(InputError, match=r"s3://no-such-bucket-y/out: the bucket 'no-such-bucket-y' does not exist"):
        pipeline.run_all(cfg, tmp_path / "run")
    assert not (tmp_path / "run" / "embed").exists()
    # `climb embed` alone does not export, so it does not check the destination.
    stats = pipeline.run_stage("embed", cfg, tmp_path / "run")
    assert stats["docs"] == 120 and RunPaths(tmp_path / "run").manifest("embed").exists()
    assert np.load(tmp_path / "run" / "embed" / "part-00000.npy").shape[0] == 60
