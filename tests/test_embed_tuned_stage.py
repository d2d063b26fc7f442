"""embed.backend = "tuned" in the embed stage: built offline from the shipped model, the same
vectors from a fresh cache, another run on the same corpus copies the student, and a shard
added later is embedded with the run's own student (the old vectors unchanged)."""
from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from climb import pipeline
from climb.config import load_config
from climb.runtime.layout import RunPaths
from climb.stages import embed
from climb.stages.embed import tuned as embed_tuned
from conftest import vocab_docs, write_parquet_shards


@pytest.fixture(scope="module")
def hf_home(tmp_path_factory):
    return tmp_path_factory.mktemp("hf")  # the static model is distilled once for the module


@pytest.fixture
def offline(monkeypatch, hf_home):
    monkeypatch.setenv("HF_HOME", str(hf_home))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(embed, "_MODELS", {})
    return hf_home


def _cfg(corpus, student="tokens"):
    return load_config(None, [f'corpus.paths=["{corpus}/*.parquet"]', 'embed.backend="tuned"',
                              "embed.tune_sample=100", "embed.max_seq_length=64", f'embed.student="{student}"'])


def _vectors(paths: RunPaths) -> dict:
    return {f.name: f.read_bytes() for f in sorted(paths.embed.dir.glob("*.npy"))}


@pytest.mark.parametrize("student", ["tokens", "tfidf"])
def test_the_tuned_backend_in_the_embed_stage(offline, tmp_path, monkeypatch, student):
    corpus = tmp_path / "corpus"
    write_parquet_shards(corpus, vocab_docs(40), 2)  # 160 documents, 100 of them in the sample
    cfg = _cfg(corpus, student)
    a = RunPaths(tmp_path / "a")
    stats = pipeline.run_stage("embed", cfg, a.root, with_deps=False)
    info = stats["student"]
    assert info["kind"] == student and info["sample"] == 100 and info["teacher_seconds"] > 0
    assert stats["backend"] and stats["backend"][0].startswith("tuned-")
    if student == "tfidf":  # the teacher's dimensions, not the static model's
        assert stats["backend"][0] == "tuned-tfidf-384" and str(info["ridge_alpha"]) in info["cv_cosine"]
    assert (a.embed.dir / "student" / "student.json").exists()
    cached = [json.loads(f.read_text()) for f in (offline / "climb" / "tuned").glob("*/student.json")]
    assert [c["kind"] for c in cached].count(student) == 1  # one per kind: the module shares HF_HOME
    vec = np.load(a.embed.dir / "part-00000.npy")
    assert vec.dtype == np.float32 and np.allclose(np.linalg.norm(vec, axis=1), 1, atol=1e-5)

    # Another run on the same corpus copies the cached student: no teacher, the same vectors.
    monkeypatch.setattr(embed, "_MODELS", {})
    monkeypatch.setattr(embed_tuned, "write_student", lambda *a, **k: pytest.fail("taught again"))
    b = RunPaths(tmp_path / "b")
    pipeline.run_stage("embed", cfg, b.root, with_deps=False)
    assert _vectors(b) == _vectors(a)

    # A shard added: the run's student stays (nothing taught) and the old vectors are unchanged.
    old = _vectors(a)
    docs = [dict(d, id=f"new-{d['id']}") for d in vocab_docs(5, seed=3)]
    pq.write_table(pa.table({"id": [d["id"] for d in docs], "text": [d["text"] for d in docs]}),
                   corpus / "part-00002.parquet")
    again = pipeline.run_stage("embed", cfg, a.root, with_deps=False)
    assert again["resumed_shards"] == 2 and len(again["shards"]) == 3
    new = _vectors(a)
    assert {k: new[k] for k in old} == old and "part-00002.npy" in new


@pytest.mark.parametrize("student", ["tokens", "tfidf"])
def test_the_student_is_the_same_from_a_fresh_cache(offline, tmp_path, monkeypatch, student):
    """Deterministic: taught again from nothing (another HF_HOME, the static model distilled
    again), the student gives the same vectors bit for bit."""
    corpus = tmp_path / "corpus"
    write_parquet_shards(corpus, vocab_docs(40), 2)
    cfg = _cfg(corpus, student)
    a = RunPaths(tmp_path / "a")
    pipeline.run_stage("embed", cfg, a.root, with_deps=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "fresh-hf"))
    monkeypatch.setattr(embed, "_MODELS", {})
    b = RunPaths(tmp_path / "b")
    pipeline.run_stage("embed", cfg, b.root, with_deps=False)
    assert list((tmp_path / "fresh-hf" / "climb" / "tuned").glob("*/student.json"))
    assert _vectors(b) == _vectors(a)
    sa = json.loads((a.embed.dir / "student" / "student.json").read_text())
    sb = json.loads((b.embed.dir / "student" / "student.json").read_text())
    assert sa["key"] == sb["key"]


def test_a_tuned_sample_below_a_hundred_is_refused():
    from climb.config import ConfigError
    with pytest.raises(ConfigError, match="tune_sample"):
        load_config(None, ['embed.backend="tuned"', "embed.tune_sample=10"])
    with pytest.raises(ConfigError, match="embed.student"):
        load_config(None, ['embed.backend="tuned"', 'embed.student="bigrams"'])


def test_a_teacher_pass_killed_resumes_at_the_chunk_in_flight(offline, tmp_path, monkeypatch):
    """Killed in the teacher's pass over the sample: the rerun computes only the chunks not kept,
    the student and its vectors are those of an undisturbed run, and the chunks go once it is made."""
    corpus = tmp_path / "corpus"
    write_parquet_shards(corpus, vocab_docs(40), 2)
    cfg = _cfg(corpus, "tfidf")
    monkeypatch.setattr(embed_tuned, "TEACHER_CHUNK", 30)  # the 100 sample documents in 4 chunks
    # Its own cache: how the teacher's pass is cut into calls moves its vectors by rounding.
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-undisturbed"))
    pipeline.run_stage("embed", cfg, tmp_path / "a", with_deps=False)
    undisturbed = _vectors(RunPaths(tmp_path / "a"))

    fresh = tmp_path / "hf-fresh"  # no cached student: the teacher runs again
    monkeypatch.setenv("HF_HOME", str(fresh))
    monkeypatch.setattr(embed, "_MODELS", {})
    real, taught = embed.encode, []

    def teacher_killed_at(n):
        def encode(model, texts, ecfg):
            if type(model).__name__ == "SentenceTransformer":  # the teacher, not the student
                taught.append(len(texts))
                if len(taught) == n:
                    raise RuntimeError("killed")
            return real(model, texts, ecfg)
        return encode
    monkeypatch.setattr(embed, "encode", teacher_killed_at(3))
    with pytest.raises(RuntimeError, match="killed"):
        pipeline.run_stage("embed", cfg, tmp_path / "b", with_deps=False)
    assert taught == [30, 30, 30]
    chunks = list((fresh / "climb" / "tuned").glob(".*.teacher"))
    assert len(chunks) == 1 and len(list(chunks[0].glob("*.npy"))) == 2

    taught.clear()
    monkeypatch.setattr(embed, "encode", teacher_killed_at(0))
    pipeline.run_stage("embed", cfg, tmp_path / "b", with_deps=False)
    assert taught == [30, 10]  # the chunk in flight and the last one
    assert _vectors(RunPaths(tmp_path / "b")) == undisturbed
    assert not list((fresh / "climb" / "tuned").glob(".*.teacher"))
