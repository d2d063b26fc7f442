"""climb/stages/embed/student.py: the TF-IDF student that places documents in the teacher's clusters."""
from __future__ import annotations

import numpy as np
import pytest

from climb.stages.embed.student import fit_student, predict

TOPICS = {0: "goal match league striker keeper penalty season coach",
          1: "chip phone software network broadband laptop screen battery",
          2: "election minister vote party parliament policy campaign tax"}


def _docs(n: int, seed: int) -> tuple[list[str], np.ndarray]:
    rng = np.random.default_rng(seed)
    filler = "the a of and to in it was said on for with".split()
    y = rng.integers(0, 3, size=n)
    texts = [" ".join(rng.choice(TOPICS[int(c)].split() * 2 + filler, size=30)) for c in y]
    return texts, y


def test_the_student_learns_the_teachers_clusters_and_places_unseen_documents():
    texts, y = _docs(300, 0)
    student = fit_student(texts, y)
    assert set(student["cv_agreement"]) == {3.0, 10.0, 30.0} and student["C"] in student["cv_agreement"]
    other, y_other = _docs(200, 1)
    placed = predict(student, other, batch=64)  # several batches
    assert placed.dtype == np.int64 and np.mean(placed == y_other) > 0.95
    # Labels the teacher shuffled (no relation to the texts) cannot be learnt: the same code falls to chance.
    shuffled = fit_student(texts, np.random.default_rng(2).permutation(y))
    assert np.mean(predict(shuffled, other) == y_other) < 0.6


def test_the_student_is_deterministic_and_refuses_what_it_cannot_learn():
    texts, y = _docs(120, 3)
    a, b = fit_student(texts, y), fit_student(texts, y)
    other, _ = _docs(50, 4)
    assert np.array_equal(predict(a, other), predict(b, other)) and a["cv_agreement"] == b["cv_agreement"]
    with pytest.raises(ValueError, match="one teacher cluster per sample document"):
        fit_student(texts, y[:-1])
    with pytest.raises(ValueError, match="all in one cluster"):
        fit_student(texts, np.zeros(len(texts), dtype=int))
