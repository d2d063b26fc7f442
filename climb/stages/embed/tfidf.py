"""A TF-IDF student in the teacher's space: the transformer's vectors predicted from words.

The transformer (the teacher) embeds a sample of the run's corpus. A TF-IDF vectorizer
(scikit-learn's, sublinear term frequencies, terms in at least two documents, at most
`MAX_FEATURES`, fit on the sample's texts) and a ridge map from TF-IDF vectors to the
teacher's vectors then embed every document: one sparse product a document, no
transformer. The vectors are L2-normalised and clustered like the teacher's, k-means on
all of them. Alpha is chosen by 3-fold cross-validation on the sample among `ALPHAS`,
scored by the mean cosine between the student's and the teacher's held-out vectors.
Everything is deterministic given the texts, the teacher's vectors and the seed.

    from climb.stages.embed.tfidf import fit_tfidf, TfidfEncoder
    student = fit_tfidf(sample_texts, teacher_vectors, window=256)
    vectors = TfidfEncoder(student, window=256).encode(texts)
    student_folder = save(student, folder); TfidfEncoder(load(folder), 256)

In the embed stage it is `embed.backend = "tuned"` with `embed.student = "tfidf"`
(climb/stages/embed/tuned.py makes it once a run; BENCHMARKS.md, "A TF-IDF student in
the teacher's space").
"""
from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path

import numpy as np

log = logging.getLogger(__name__)

ALPHAS = (0.3, 1.0, 3.0)  # the ridge strengths cross-validation chooses among
MAX_FEATURES = 200_000  # the vocabulary's size cap (the sample's most frequent terms)
FOLDS = 3


def _clip(texts: Sequence[str], window: int) -> list[str]:
    # As embed.encode clips: the window's tokens come from the first ~12 characters a token.
    return [t[:window * 12] for t in texts]


def _vectorizer(vocabulary=None):
    from sklearn.feature_extraction.text import TfidfVectorizer
    return TfidfVectorizer(sublinear_tf=True, min_df=1 if vocabulary is not None else 2,
                           max_features=None if vocabulary is not None else MAX_FEATURES,
                           vocabulary=vocabulary, dtype=np.float32)


def _ridge(x, y, alpha: float):
    from sklearn.linear_model import Ridge
    return Ridge(alpha=alpha, solver="sparse_cg", tol=1e-4).fit(x, y)


def _cosine(pred: np.ndarray, target: np.ndarray) -> float:
    p = pred / np.maximum(np.linalg.norm(pred, axis=1, keepdims=True), 1e-12)
    t = target / np.maximum(np.linalg.norm(target, axis=1, keepdims=True), 1e-12)
    return float(np.mean(np.sum(p * t, axis=1)))


def fit_tfidf(texts: Sequence[str], targets: np.ndarray, window: int, seed: int = 0,
              alphas: Sequence[float] = ALPHAS) -> dict:
    """The student of (sample `texts`, the teacher's vectors `targets`, one row each):
    {"terms" (the vocabulary in column order), "idf", "W" (terms x dims), "b", "alpha",
    "cv_cosine" (per alpha, the held-out mean cosine with the teacher)}."""
    from sklearn.model_selection import KFold
    y = np.asarray(targets, dtype=np.float32)
    if y.ndim != 2 or len(texts) != len(y):
        raise ValueError(f"{len(texts)} texts but teacher vectors of shape {y.shape}: one vector per text")
    vec = _vectorizer()
    try:
        x = vec.fit_transform(_clip(texts, window))
    except ValueError as e:  # no term in two documents
        raise ValueError(f"the TF-IDF student found no vocabulary in {len(texts)} sample documents ({e}); "
                         "use a larger embed.tune_sample or another embed.backend") from None
    scores: dict[float, float] = {}
    if len(alphas) > 1 and len(texts) >= 10 * FOLDS:
        # The vocabulary is fit on the whole sample once: held-out texts share it, a small
        # optimism that is the same for every alpha and so does not bias the choice.
        split = list(KFold(n_splits=FOLDS, shuffle=True, random_state=seed).split(np.arange(len(y))))
        for a in alphas:
            scores[float(a)] = round(float(np.mean([_cosine(_ridge(x[tr], y[tr], a).predict(x[te]), y[te])
                                                    for tr, te in split])), 4)
            log.info("tfidf student: alpha %g, held-out cosine with the teacher %.3f", a, scores[float(a)])
        best = max(scores, key=lambda a: (scores[a], a))  # ties: the stronger regularisation
    else:
        best = float(alphas[len(alphas) // 2])
    r = _ridge(x, y, best)
    terms = [None] * len(vec.vocabulary_)
    for t, j in vec.vocabulary_.items():
        terms[j] = t
    return {"terms": terms, "idf": vec.idf_.astype(np.float32), "W": np.ascontiguousarray(r.coef_.T, np.float32),
            "b": np.asarray(r.intercept_, np.float32), "alpha": best, "cv_cosine": scores}


def save(student: dict, folder: str | Path) -> Path:
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "terms.json").write_text(json.dumps(student["terms"]))
    np.savez(folder / "tfidf.npz", idf=student["idf"], W=student["W"], b=student["b"])
    (folder / "tfidf.json").write_text(json.dumps({"alpha": student["alpha"], "cv_cosine": student["cv_cosine"],
                                                   "terms": len(student["terms"]),
                                                   "dims": int(student["W"].shape[1])}) + "\n")
    return folder


def load(folder: str | Path) -> dict:
    folder = Path(folder)
    meta = json.loads((folder / "tfidf.json").read_text())
    with np.load(folder / "tfidf.npz") as z:
        return {"terms": json.loads((folder / "terms.json").read_text()), "idf": z["idf"], "W": z["W"],
                "b": z["b"], "alpha": meta["alpha"], "cv_cosine": meta["cv_cosine"]}


class TfidfEncoder:
    """Embeds texts as the student does: TF-IDF on the sample's vocabulary, then the ridge map.
    The interface the embed stage uses (`encode`, `get_embedding_dimension`, `climb_backend`)."""

    def __init__(self, student: dict, window: int, backend: str = "tuned"):
        self.W, self.b, self.max_seq_length = student["W"], student["b"], window
        self.vectorizer = _vectorizer({t: j for j, t in enumerate(student["terms"])})
        self.vectorizer.idf_ = np.asarray(student["idf"], dtype=np.float64)
        self.climb_backend = f"{backend}-tfidf-{self.get_embedding_dimension()}"

    def get_embedding_dimension(self) -> int:
        return int(self.W.shape[1])

    def encode(self, texts, batch_size: int = 4096, normalize_embeddings: bool = True, **_) -> np.ndarray:
        out = np.empty((len(texts), self.get_embedding_dimension()), dtype=np.float32)
        step = max(batch_size, 4096)  # the stage's batch is the transformer's; sparse products like more
        for i in range(0, len(texts), step):
            x = self.vectorizer.transform(_clip(texts[i:i + step], self.max_seq_length))
            emb = np.asarray(x @ self.W, dtype=np.float32) + self.b
            if normalize_embeddings:
                emb /= np.maximum(np.linalg.norm(emb, axis=1, keepdims=True), 1e-12)
            out[i:i + len(emb)] = emb
        return out
