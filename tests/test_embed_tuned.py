"""The students of embed_tuned: a sample drawn by ids alone, a linear map that is the
least-squares one, and a trained static model that is the same on every fit."""
from __future__ import annotations

import numpy as np
import pytest

from climb.stages.embed.tuned import (
    TunedEncoder,
    draw_sample,
    fit_linear,
    sample_rank,
)


def test_the_sample_depends_on_the_ids_only_not_their_order_or_files():
    ids = [f"doc-{i}" for i in range(5000)]
    a = draw_sample(ids, 100)
    assert len(a) == len(set(a)) == 100
    shuffled = list(ids)
    np.random.default_rng(0).shuffle(shuffled)
    assert draw_sample(iter(shuffled), 100) == a
    # A document added to the corpus enters the sample only in its own place in the order.
    grown = draw_sample(ids + ["doc-new"], 100)
    assert set(grown) - set(a) <= {"doc-new"} and len(set(a) - set(grown)) <= 1
    assert draw_sample(ids, 100, seed=1) != a
    assert [sample_rank(i) for i in a] == sorted(sample_rank(i) for i in a)
    assert draw_sample(ids[:50], 100) == sorted(ids[:50], key=sample_rank)


def test_the_linear_student_recovers_a_linear_teacher():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(600, 16)).astype(np.float32)
    w, b = rng.normal(size=(16, 24)), rng.normal(size=24)
    m = fit_linear(x, x @ w + b)
    assert m["W"].shape == (16, 24) and m["b"].shape == (24,)
    assert np.allclose(m["W"], w, atol=1e-2) and np.allclose(m["b"], b, atol=1e-2)
    assert m["alpha"] == pytest.approx(1e-3)


class _Static:
    """A stand-in for model2vec's StaticModel: encode -> a fixed vector per text."""
    dim = 3

    def encode(self, texts, **_):
        return np.array([[len(t), 1.0, 0.0] for t in texts], np.float32)


def test_the_tuned_encoder_maps_then_normalises():
    enc = TunedEncoder(_Static(), {"W": np.eye(3, 2, dtype=np.float32), "b": np.zeros(2, np.float32)}, window=8)
    assert enc.get_embedding_dimension() == 2 and enc.climb_backend == "tuned-2"
    e = enc.encode(["abcd", "ab"])
    assert np.allclose(np.linalg.norm(e, axis=1), 1)
    assert np.allclose(e[0], np.array([4, 1]) / np.sqrt(17))
    raw = TunedEncoder(_Static(), None, window=8).encode(["abcd"], normalize_embeddings=False)
    assert np.array_equal(raw, [[4, 1, 0]])
