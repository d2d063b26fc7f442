"""embed.backend = "auto" on a CPU: a corpus of AUTO_TUNED_DOCS documents or more is embedded by
the TF-IDF student, a smaller one (or any corpus on a GPU) as before; the size is read from
Parquet footers, or counted in a pass that stops at the size."""
from __future__ import annotations

import json

import pytest

from climb import pipeline
from climb.config import load_config
from climb.runtime.layout import RunPaths
from climb.stages import embed
from conftest import vocab_docs, write_parquet_shards


def _cfg(paths_glob: str, *extra: str):
    return load_config(None, [f'corpus.paths=["{paths_glob}"]', 'embed.backend="auto"',
                              "embed.tune_sample=100", "embed.max_seq_length=64", *extra])


def _jsonl(path, docs):
    path.write_text("".join(json.dumps({"id": d["id"], "text": d["text"]}) + "\n" for d in docs))
    return path


def test_the_corpus_size_from_footers_or_a_pass_that_stops(tmp_path, monkeypatch):
    docs = vocab_docs(10)  # 30 documents
    files = write_parquet_shards(tmp_path / "pq", docs, 2)
    cfg = _cfg(f"{tmp_path}/pq/*.parquet")
    assert embed.corpus_reaches(files, cfg.corpus, 30) and not embed.corpus_reaches(files, cfg.corpus, 31)

    a, b = _jsonl(tmp_path / "a.jsonl", docs[:20]), _jsonl(tmp_path / "b.jsonl", docs[20:])
    assert embed.corpus_reaches([a, b], cfg.corpus, 30) and not embed.corpus_reaches([a, b], cfg.corpus, 31)
    # The pass stops at the size: the second file is never read when the first has enough.
    read = []
    real = embed.read_documents
    monkeypatch.setattr(embed, "read_documents", lambda f, *a, **k: (read.append(f), real(f, *a, **k))[1])
    assert embed.corpus_reaches([a, b], cfg.corpus, 15) and read == [a]


def test_auto_resolves_on_the_corpus_size_and_the_device(tmp_path, monkeypatch):
    files = write_parquet_shards(tmp_path / "pq", vocab_docs(40), 2)  # 120 documents
    cfg = _cfg(f"{tmp_path}/pq/*.parquet")
    monkeypatch.setattr(embed, "AUTO_TUNED_DOCS", 121)
    assert embed.resolved(cfg, files) is cfg  # below the size: "auto" as before (OpenVINO or torch)
    monkeypatch.setattr(embed, "AUTO_TUNED_DOCS", 120)
    big = embed.resolved(cfg, files)
    assert (big.embed.backend, big.embed.student) == ("tuned", "tfidf") and big.embed.tune_sample == 100
    # Crossing the size changes the settings part of the stage's key: the stage starts over
    # rather than keeping shards embedded by the other backend.
    assert embed.resume_key(big) != embed.resume_key(cfg)
    monkeypatch.setattr(embed, "resolve_device", lambda d: "cuda")
    assert embed.resolved(cfg, files) is cfg  # a GPU runs the transformer at any size
    # A backend set by hand is never changed.
    torch_cfg = _cfg(f"{tmp_path}/pq/*.parquet", 'embed.backend="torch"')
    monkeypatch.setattr(embed, "resolve_device", lambda d: "cpu")
    assert embed.resolved(torch_cfg, files) is torch_cfg


def test_auto_on_a_large_corpus_runs_the_tfidf_student(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(embed, "_MODELS", {})
    monkeypatch.setattr(embed, "AUTO_TUNED_DOCS", 110)
    write_parquet_shards(tmp_path / "pq", vocab_docs(40), 2)
    cfg = _cfg(f"{tmp_path}/pq/*.parquet")
    stats = pipeline.run_stage("embed", cfg, RunPaths(tmp_path / "run").root, with_deps=False)
    assert stats["backend"] == ["tuned-tfidf-384"] and stats["student"]["kind"] == "tfidf"
    assert stats["student"]["sample"] == 100 and stats["docs"] == 120
    # Run again with the same settings: done, not embedded again.
    again = pipeline.run_stage("embed", cfg, RunPaths(tmp_path / "run").root, with_deps=False)
    assert again.get("skipped_stage") and {k: again[k] for k in stats} == stats


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q"]))
