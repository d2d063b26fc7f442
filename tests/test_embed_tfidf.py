"""climb.stages.embed.tfidf: the TF-IDF student learns the teacher's vectors from words,
deterministically, and embeds the same after a save and a load."""
from __future__ import annotations

import numpy as np
import pytest

from climb.stages.embed import tfidf as embed_tfidf


def _corpus(n=300, seed=0):
    """Texts over four topics of 30 words each; the teacher's vector is its topic's direction plus
    a little noise, so words predict it."""
    rng = np.random.default_rng(seed)
    topics = [[f"t{k}w{i}" for i in range(30)] for k in range(4)]
    dirs = rng.normal(size=(4, 16)).astype(np.float32)
    texts, vecs, topic = [], [], []
    for i in range(n):
        k = i % 4
        texts.append(" ".join(rng.choice(topics[k], 25)) + " " + " ".join(rng.choice(topics[(k + 1) % 4], 3)))
        v = dirs[k] + 0.1 * rng.normal(size=16)
        vecs.append(v / np.linalg.norm(v))
        topic.append(k)
    return texts, np.asarray(vecs, np.float32), np.asarray(topic)


def test_the_student_places_held_out_texts_near_the_teachers_vectors():
    texts, vecs, topic = _corpus()
    student = embed_tfidf.fit_tfidf(texts[:200], vecs[:200], window=64)
    assert set(student["cv_cosine"]) == set(embed_tfidf.ALPHAS) and student["alpha"] in embed_tfidf.ALPHAS
    emb = embed_tfidf.TfidfEncoder(student, 64).encode(texts[200:])
    assert emb.dtype == np.float32 and emb.shape == (100, 16)
    assert np.allclose(np.linalg.norm(emb, axis=1), 1, atol=1e-5)
    cos = np.sum(emb * vecs[200:], axis=1)
    assert cos.mean() > 0.9  # a student that ignored the words would sit near 0
    # Nearest teacher direction = the text's topic, for (nearly) every held-out text.
    centres = np.stack([vecs[:200][topic[:200] == k].mean(0) for k in range(4)])
    assert np.mean(np.argmax(emb @ centres.T, axis=1) == topic[200:]) > 0.95


def test_deterministic_and_the_same_after_save_and_load(tmp_path):
    texts, vecs, _ = _corpus(120, seed=1)
    a = embed_tfidf.fit_tfidf(texts, vecs, window=64)
    b = embed_tfidf.fit_tfidf(texts, vecs, window=64)
    assert np.array_equal(a["W"], b["W"]) and a["terms"] == b["terms"]
    embed_tfidf.save(a, tmp_path / "s")
    one = embed_tfidf.TfidfEncoder(a, 64).encode(texts, batch_size=7)
    two = embed_tfidf.TfidfEncoder(embed_tfidf.load(tmp_path / "s"), 64).encode(texts)
    assert np.array_equal(one, two)


def test_clear_errors_on_a_mismatch_and_on_a_sample_without_vocabulary():
    texts, vecs, _ = _corpus(40)
    with pytest.raises(ValueError, match="one vector per text"):
        embed_tfidf.fit_tfidf(texts, vecs[:-1], window=64)
    with pytest.raises(ValueError, match="no vocabulary"):
        embed_tfidf.fit_tfidf([f"w{i}" for i in range(40)], vecs, window=64)  # no word in two texts
